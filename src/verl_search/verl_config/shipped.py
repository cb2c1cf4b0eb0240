"""Absolute paths of the YAML files this package ships, for verl options that take a file path.

verl resolves `tool_config_path` and `agent_loop_config_path` as plain paths (no `pkg://`), so
recipes call `verl-search config-path tool` (or this module) to get them.
"""

from __future__ import annotations

from importlib import resources

SHIPPED = {
    "tool": ("verl_search.configs", "search_tool_config.yaml"),
    "access-tool": ("verl_search.configs", "access_tool_config.yaml"),  # SearchTool + AccessTool
    "agent-loop": ("verl_search.configs", "agent_loops.yaml"),
}


def config_path(name: str) -> str:
    """Absolute path of a shipped config: `"tool"` (SearchTool YAML), `"access-tool"`
    (SearchTool and AccessTool) or `"agent-loop"`.

    Raises:
        KeyError: on an unknown name (lists the known ones).
    """
    if name not in SHIPPED:
        raise KeyError(f"unknown config {name!r}; known: {sorted(SHIPPED)}")
    package, filename = SHIPPED[name]
    return str(resources.files(package) / filename)
