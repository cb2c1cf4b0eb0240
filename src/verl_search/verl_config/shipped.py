"""Absolute paths of the YAML files this package ships, for verl options that take a file path.

verl resolves `tool_config_path` and `agent_loop_config_path` as plain paths (no `pkg://`), so
recipes call `verl-search config-path tool` (or this module) to get them.

The tool YAMLs live at the top of the repository, in `tool_configs/` (what users point verl's
`actor_rollout_ref.rollout.multi_turn.tool_config_path` at); `verl_search/configs/` holds links to them,
which the wheel and sdist carry as copies. In a checkout a path is resolved through the link, so
`verl-search config-path tool` prints `tool_configs/search_tool_config.yaml` itself.
"""

from __future__ import annotations

import os
from importlib import resources

SHIPPED = {
    "tool": ("verl_search.configs", "search_tool_config.yaml"),  # tool_configs/search_tool_config.yaml
    "access-tool": ("verl_search.configs", "access_tool_config.yaml"),  # SearchTool + AccessTool
    "agent-loop": ("verl_search.configs", "agent_loops.yaml"),
}


def config_path(name: str) -> str:
    """Absolute path of a shipped config: `"tool"` (SearchTool YAML), `"access-tool"`
    (SearchTool and AccessTool) or `"agent-loop"`; a link (a checkout's `tool_configs/` file) resolved.

    Raises:
        KeyError: on an unknown name (lists the known ones).
    """
    if name not in SHIPPED:
        raise KeyError(f"unknown config {name!r}; known: {sorted(SHIPPED)}")
    package, filename = SHIPPED[name]
    return os.path.realpath(str(resources.files(package) / filename))
