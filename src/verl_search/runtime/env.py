"""The `VERL_SEARCH_*` environment variables, read in one place.

| variable | field | default | read by |
| --- | --- | --- | --- |
| `VERL_SEARCH_URL` | `url` | `http://127.0.0.1:8000/retrieve` | the shipped tool and agent-loop YAMLs (`${oc.env:...}`, resolved by verl in each worker); `DEFAULT_URL` is also `SearchClientConfig`'s default |
| `VERL_SEARCH_CACHE` | `cache_dir` | `~/.cache/verl_search` | the corpus offset-table cache (Search-R1 layout) |
| `VERL_SEARCH_SKIP_VERL_VERSION_CHECK` | `skip_verl_version_check` | off (`1` = on) | `verl_config.version.check_verl_version` |
| `VERL_SEARCH_TOOL_CONFIG` | `tool_config` | the shipped tool YAML | the GRPO recipe's `tool_config_path`; check-config |
| `VERL_SEARCH_AGENT_LOOPS` | `agent_loops` | the shipped agent-loop YAML | the PPO recipe's `agent_loop_config_path`; check-config |
| `VERL_SEARCH_CPU_THREADS` | `cpu_threads` | every core | torch threads of each process of a `verl-search train --cpu` run (`cpu/plugin.py`) |

`read_env()` takes one snapshot when called (never at import, so a test's `monkeypatch.setenv`
is seen); callers read it once per operation. `verl-search train` sets `TOOL_CONFIG`,
`AGENT_LOOPS` and `URL` for the trainer it starts (`training/launch.py`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

URL = "VERL_SEARCH_URL"
CACHE = "VERL_SEARCH_CACHE"
SKIP_VERL_VERSION_CHECK = "VERL_SEARCH_SKIP_VERL_VERSION_CHECK"
TOOL_CONFIG = "VERL_SEARCH_TOOL_CONFIG"
AGENT_LOOPS = "VERL_SEARCH_AGENT_LOOPS"
CPU_THREADS = "VERL_SEARCH_CPU_THREADS"
DEFAULT_URL = "http://127.0.0.1:8000/retrieve"


@dataclass(frozen=True)
class Env:
    """A snapshot of the `VERL_SEARCH_*` variables (see the module table).

    Attributes:
        url: the `/retrieve` endpoint.
        cache_dir: where computed files are cached.
        skip_verl_version_check: run on another verl anyway.
        tool_config, agent_loops: paths the recipes read, or `None` when unset (callers fall back
            to the shipped YAMLs).
        cpu_threads: torch threads per process on a CPU training run, `None` = every core.
    """

    url: str
    cache_dir: Path
    skip_verl_version_check: bool
    tool_config: str | None
    agent_loops: str | None
    cpu_threads: int | None = None


def read_env(environ: Mapping[str, str] | None = None) -> Env:
    """Read the variables from `environ` (default `os.environ`); unset or empty means the default."""
    environ = os.environ if environ is None else environ
    return Env(
        url=environ.get(URL) or DEFAULT_URL,
        cache_dir=Path(environ.get(CACHE) or Path.home() / ".cache" / "verl_search"),
        skip_verl_version_check=environ.get(SKIP_VERL_VERSION_CHECK) == "1",
        tool_config=environ.get(TOOL_CONFIG) or None,
        agent_loops=environ.get(AGENT_LOOPS) or None,
        cpu_threads=int(environ[CPU_THREADS]) if environ.get(CPU_THREADS) else None,
    )
