"""The four places where verl 0.9.1 has no public hook for a CPU run, and the smallest patch for each.

Each patch first checks that verl's code is the code it was written against (`check()`), so a
verl release that changes it fails with a message naming the place, instead of patching the wrong
thing. They are applied only by `verl_search.cpu.plugin` (that is, only when asked), only
on `SUPPORTED_VERL_VERSION`.

* P1 `verl/utils/distributed.py` `initialize_global_process_group_ray`: builds the backend string
  `f"cpu:gloo,{device}:{backend}"`, which on the CPU is `"cpu:gloo,cpu:gloo"`: torch refuses a
  device named twice. Patch: with no backend given, use `"cpu:gloo"`.
* P2 `verl/workers/engine/fsdp/transformer_impl.py`: the FSDP2 reference model (and any offloaded
  model) is built with `CPUOffloadPolicy(pin_memory=True)`; pinning needs an accelerator. Patch:
  that module's `CPUOffloadPolicy` is a subclass that never pins.
* P3 `verl/workers/rollout/base.py`: the in-worker rollout adapter is looked up in the private
  dict `_ROLLOUT_REGISTRY` (there is a public `RolloutReplicaRegistry` for the server side only).
  Patch: one entry for our rollout name.
* P4 `verl/utils/model.py` `load_valuehead_model`: the critic (PPO) is loaded with
  `attn_implementation="flash_attention_2"` hard-coded, ignoring `critic.model.override_config`;
  flash-attention needs a GPU. Patch: the same load with `sdpa`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import sys
from dataclasses import dataclass

logger = logging.getLogger(__name__)


class VerlChangedError(RuntimeError):
    """verl's code at a patched place is not what the patch was written for."""


@dataclass(frozen=True)
class Place:
    """A place in verl's code a patch relies on: `module.attribute` must contain `needle`."""

    module: str
    attribute: str
    needle: str
    why: str

    def check(self) -> None:
        """Raise `VerlChangedError` naming the module, attribute and expected code if it differs."""
        try:
            target = getattr(importlib.import_module(self.module), self.attribute)
        except (ImportError, AttributeError) as exc:
            raise VerlChangedError(f"verl changed: {self.module}.{self.attribute} is gone ({exc}); "
                                   f"verl_search's CPU plugin needs it ({self.why})") from exc
        source = target if isinstance(target, str) else _source(target)
        if self.needle not in source:
            raise VerlChangedError(f"verl changed: {self.module}.{self.attribute} no longer contains "
                                   f"{self.needle!r}; verl_search's CPU plugin patch for it ({self.why}) "
                                   f"must be revisited for this verl version")


def _source(obj) -> str:
    if isinstance(obj, dict):
        return repr(obj)
    if inspect.ismodule(obj) or inspect.isfunction(obj) or inspect.isclass(obj):
        return inspect.getsource(obj)
    return repr(obj)


P1 = Place("verl.utils.distributed", "initialize_global_process_group_ray",
           'backend = backend or f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"',
           "P1: the process group's backend string names the cpu device twice")
P2 = Place("verl.workers.engine.fsdp.transformer_impl", "FSDPEngine",
           "offload_policy = CPUOffloadPolicy(pin_memory=True)",
           "P2: the FSDP2 reference model pins host memory, which needs an accelerator")
P3 = Place("verl.workers.rollout.base", "get_rollout_class",
           "_ROLLOUT_REGISTRY[(rollout_name, mode)]",
           "P3: the in-worker rollout adapter comes from the private _ROLLOUT_REGISTRY dict")
P4 = Place("verl.utils.model", "load_valuehead_model",
           'attn_implementation="flash_attention_2"',
           "P4: the critic's value model is loaded with flash-attention hard-coded")
PLACES = (P1, P2, P3, P4)


def check_all() -> None:
    """Check every place; raises `VerlChangedError` for the first that differs."""
    for place in PLACES:
        place.check()


def patch_process_group_backend() -> None:
    """P1: `initialize_global_process_group_ray(backend=None)` uses `"cpu:gloo"`.

    Replaced in `verl.utils.distributed` and, if already imported, in the modules that imported
    the name (`verl.workers.engine_workers`, `verl.checkpoint_engine.base`).
    """
    distributed = importlib.import_module(P1.module)
    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_verl_search_cpu", False):
        return
    P1.check()

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    initialize_global_process_group_ray._verl_search_cpu = True
    initialize_global_process_group_ray.__doc__ = original.__doc__
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray
    for name in ("verl.workers.engine_workers", "verl.checkpoint_engine.base"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "initialize_global_process_group_ray", None) is original:
            module.initialize_global_process_group_ray = initialize_global_process_group_ray


def patch_unpinned_offload() -> None:
    """P2: `transformer_impl.CPUOffloadPolicy` builds policies with `pin_memory=False`."""
    impl = importlib.import_module(P2.module)
    base = impl.CPUOffloadPolicy
    if getattr(base, "_verl_search_cpu", False):
        return
    P2.check()

    @dataclasses.dataclass
    class UnpinnedCPUOffloadPolicy(base):
        """torch's `CPUOffloadPolicy`, never pinning host memory (there is no accelerator)."""

        _verl_search_cpu = True

        def __post_init__(self):
            self.pin_memory = False

    impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def patch_value_model_attention() -> None:
    """P4: `verl.utils.model.load_valuehead_model` loads the critic with `sdpa` attention.

    verl's transformers engine imports the function at call time, so replacing the module attribute
    is enough. The replacement is verl's first branch (`AutoModelForTokenClassification`, one label)
    with `sdpa`; verl's TRL fallback is for models without a token-classification head.
    """
    model_module = importlib.import_module(P4.module)
    if getattr(model_module.load_valuehead_model, "_verl_search_cpu", False):
        return
    P4.check()

    def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
        from transformers import AutoModelForTokenClassification

        return AutoModelForTokenClassification.from_pretrained(
            pretrained_model_name_or_path=local_path, torch_dtype=torch_dtype, config=model_config,
            attn_implementation="sdpa", trust_remote_code=trust_remote_code)

    load_valuehead_model._verl_search_cpu = True
    model_module.load_valuehead_model = load_valuehead_model


def register_rollout_adapter(name: str, adapter_path: str) -> None:
    """P3: `get_rollout_class(name, "async")` returns the class at `adapter_path` (`module.Class`)."""
    P3.check()
    base = importlib.import_module(P3.module)
    registry = getattr(base, "_ROLLOUT_REGISTRY", None)
    if not isinstance(registry, dict):
        raise VerlChangedError("verl changed: verl.workers.rollout.base._ROLLOUT_REGISTRY is no longer a dict")
    registry[(name, "async")] = adapter_path
