"""`cpu.precision`: the compute dtype of the quickstart's trainers and vLLM rollouts on the CPU."""

from __future__ import annotations

import pytest
import torch

from verl_search.cpu import precision


@pytest.mark.parametrize("avx512_bf16, amx, native", [(False, False, False), (True, False, True), (False, True, True)])
def test_native_bf16_is_torch_s_avx512_bf16_or_amx_check(monkeypatch, avx512_bf16, amx, native):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert precision.native_bf16() is native
    assert precision.resolve_dtype("auto") == ("bfloat16" if native else "float32")
    assert precision.resolve_dtype("float32") == "float32"  # an explicit dtype is kept either way
    assert precision.resolve_dtype("bfloat16") == "bfloat16"


def test_a_torch_without_the_checks_means_float32(monkeypatch):
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert precision.resolve_dtype("auto") == "float32"


def test_an_unknown_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match="'float16'.*auto, float32 or bfloat16"):
        precision.resolve_dtype("float16")
    with pytest.raises(ValueError, match="'auto'.*resolve_dtype"):
        precision.mixed_precision("auto")
    from verl_search.cpu.vllm_cpu import cpu_rollout_overrides

    with pytest.raises(ValueError, match="'fp16'"):
        cpu_rollout_overrides("fp16")


def test_bfloat16_is_refused_for_the_transformers_engine():
    from verl_search.eval.options import EvalOptions

    with pytest.raises(ValueError, match="--dtype bfloat16 applies to --engine vllm"):
        EvalOptions(data=[], engine="transformers", dtype="bfloat16")
    assert EvalOptions(data=[]).dtype == "float32"
