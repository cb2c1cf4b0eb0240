"""The compute dtype of CPU runs: float32, or bfloat16 where the CPU computes it natively.

`verl-search study` takes `--dtype auto|float32|bfloat16` (`auto` by default, and always for `verl-search
quickstart`, the main job): the SFT cold start's and GRPO's FSDP trainers compute in it (FSDP mixed precision:
parameters cast to it for the forward and backward passes, gradients reduced and the optimizer's master weights
kept in fp32, as verl's GPU default does with bf16), and so do the vLLM rollouts of GRPO and of every
evaluation (vLLM's `dtype`). `auto` is bfloat16 where the CPU has native bf16 instructions (AVX512-BF16 or AMX,
the test vLLM's CPU platform makes), else float32: without them bf16 is emulated and slower than fp32.

Measured on the 2-core development machine (AMD EPYC with AVX512-BF16; `benchmarks/bench_cpu_dtype.py`,
docs/benchmarks/cpu-dtype.md): a SmolLM2-135M forward and backward pass over 4 x 385 tokens 9.85 -> 6.64 s, vLLM's
rollout of 102 prompts of 280 tokens plus 64 generated tokens 103.4 -> 58.0 s; the main job 14 min 40 s -> 11 min
43 s to 12 min 54 s. On an AVX2-only AMD EPYC, bf16 took 23x fp32's time for that pass (347.6 against 15.0 s) and
3.9x for that rollout (580.6 against 150.4 s). The price is precision: bf16 keeps about three significant
digits. `verl-search train --cpu` and `verl-search eval` keep float32 (`cpu.overrides.cpu_overrides`,
`cpu.vllm_cpu.cpu_rollout_overrides`), so their log-probabilities match to ~1e-6.
"""

from __future__ import annotations

DTYPES = ("float32", "bfloat16")
"""The dtypes a CPU run computes in (vLLM's and torch's names)."""
MIXED_PRECISION = {
    "float32": "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
    "bfloat16": "{param_dtype:bf16,reduce_dtype:fp32,buffer_dtype:fp32}",
}
"""verl's FSDP `mixed_precision` setting per compute dtype: fp32 keeps every dtype fp32; bf16 computes in bf16
and reduces gradients and keeps buffers in fp32."""


def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively: AVX512-BF16 or AMX tiles, as torch reports them
    (`torch.cpu._is_avx512_bf16_supported`, `_is_amx_tile_supported`: the checks vLLM's CPU platform makes).
    False where torch lacks the checks."""
    import torch

    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check() for check in checks if check is not None)


def resolve_dtype(dtype: str) -> str:
    """`dtype` (`auto`, `float32` or `bfloat16`) as the dtype a run computes in: `auto` is `bfloat16` where
    `native_bf16()`, else `float32`.

    Raises:
        ValueError: `dtype` is none of those.
    """
    if dtype == "auto":
        return "bfloat16" if native_bf16() else "float32"
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: use auto, float32 or bfloat16")
    return dtype


def check_resolved(dtype: str) -> str:
    """`dtype` itself when it is one of `DTYPES`.

    Raises:
        ValueError: it is not (`auto` must be resolved first: `resolve_dtype`).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: use float32 or bfloat16 (resolve auto with resolve_dtype first)")
    return dtype


def mixed_precision(dtype: str) -> str:
    """verl's FSDP `mixed_precision` value (a hydra dict) for a resolved `dtype` (`MIXED_PRECISION`).

    Raises:
        ValueError: `dtype` is not in `DTYPES` (`check_resolved`).
    """
    return MIXED_PRECISION[check_resolved(dtype)]
