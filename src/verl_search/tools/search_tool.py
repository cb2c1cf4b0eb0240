"""`SearchTool`: a verl `BaseTool` that searches the retrieval service, for `ToolAgentLoop`.

Register it with a tool YAML (`tool_configs/search_tool_config.yaml`, shipped as `verl_search/configs/`)::

    tools:
      - class_name: verl_search.tools.search_tool.SearchTool
        config: {type: native, retrieval_service_url: http://127.0.0.1:8000/retrieve, topk: 3, ...}
        tool_schema: {type: function, function: {name: search, parameters: {... query_list ...}}}

Config keys (all optional but the URL; units in brackets):

| key | default | meaning |
| --- | --- | --- |
| `retrieval_service_url` | `http://127.0.0.1:8000/retrieve` | the `/retrieve` endpoint |
| `topk` | 3 | passages per query (a row's `create_kwargs.topk` overrides it) |
| `timeout` | 5 [s] | per HTTP attempt |
| `max_retries` | 3 | retries on connection errors, timeouts and 5xx (never on 4xx) |
| `deadline` | 20 [s] | for the whole call, retries and backoff included |
| `max_concurrency` | 64 | requests in flight per worker event loop |
| `max_queries` | 8 | queries accepted in one call |
| `max_chars_per_passage` | none [characters] | cut each passage's text |
| `max_observation_chars` | none [characters] | budget for the whole observation; whole passages are dropped, with a note. Keep it at or below verl's `multi_turn.max_tool_response_length`, which cuts blindly |
| `show_ids` | false | write each passage's id after its title (`Doc 1(Title: "X", id: ...)`), for the `access` tool (`tools/access_tool.py`); on the web backend the id is the URL |

Arguments the model passes: `query_list` (a list of strings), or `query` (one string). verl's
schema model drops `items` from array parameters, so the types are checked here, in `execute`.

A failure (service down, timeout, HTTP 4xx/5xx, bad arguments) never raises: the observation is
`search failed: <reason>`, the metrics dict says so, and the trajectory's `extra_fields` count it
(`num_searches`, `failed_searches`, `search_errors`), so the reward function and the trainer's
metrics see it (verl passes `extra_fields` to the reward as `extra_info`).
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from verl_search.agent_protocol.tool import parse_queries
from verl_search.agent_protocol.vocabulary import SEARCH_FAILED_PREFIX, SEARCH_TOOL
from verl_search.tools import client
from verl_search.tools.client import record_search
from verl_search.tools.formatting import format_results
from verl_search.verl_config.version import check_verl_version

logger = logging.getLogger(__name__)

TOOL_KEYS = {"type", "max_queries", "max_chars_per_passage", "max_observation_chars", "show_ids"}

DEFAULT_SCHEMA = {
    "type": "function",
    "function": {
        "name": SEARCH_TOOL,
        "description": "Searches Wikipedia for passages relevant to each query and returns the top passages.",
        "parameters": {
            "type": "object",
            "properties": {
                "query_list": {"type": "array", "description": "One or more search queries (strings)."},
            },
            "required": ["query_list"],
        },
    },
}


class SearchTool(BaseTool):
    """Search tool for verl's `ToolAgentLoop` (hermes tool-call format).

    Args:
        config: the tool YAML's `config` mapping (keys in the module docstring).
        tool_schema: the YAML's `tool_schema`; `None` uses `DEFAULT_SCHEMA`.

    `__init__` only reads the config (verl builds tools in the driver, in `RLHFDataset`, and in
    every agent-loop worker): no connection is opened until the first `execute`.

    Raises:
        ValueError: on an unknown config key or a value out of range (naming it).
    """

    #: config keys of the tool itself (the client's are `SearchClientConfig`'s fields)
    tool_keys = TOOL_KEYS
    #: the schema used when the YAML gives none
    default_schema = DEFAULT_SCHEMA

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        check_verl_version()  # BaseTool's interface is verl 0.9.1's
        # BaseTool.__init__ only sets these three attributes, and prints the schema to stdout.
        self.config = dict(config or {})
        self.tool_schema = tool_schema or OpenAIFunctionToolSchema.model_validate(self.default_schema)
        self.name = self.tool_schema.function.name
        unknown = set(self.config) - self.tool_keys - {f for f in client.SearchClientConfig.__dataclass_fields__}
        if unknown:
            raise ValueError(f"{type(self).__name__} config: unknown key(s) {sorted(unknown)}; see {type(self).__module__}")
        self.client_config = client.SearchClientConfig.from_dict(self.config)
        self.max_queries = int(self.config.get("max_queries", 8))
        self.max_chars_per_passage = self.config.get("max_chars_per_passage")
        self.max_observation_chars = self.config.get("max_observation_chars")
        self._instances: dict[str, dict] = {}

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        """Start an instance; `create_kwargs` (from the row's `tools_kwargs`) may set `topk`."""
        instance_id = instance_id or str(uuid4())
        self._instances[instance_id] = dict(kwargs.get("create_kwargs") or {})
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        """Run one search call. Never raises for a failed search.

        Returns:
            `(ToolResponse(text=observation), 0.0, metrics)`; metrics has `num_queries`,
            `search_failed` (0/1), `latency_s`, `server_latency_s` (the server's own time, from its
            `Server-Timing` header), `attempts`, `truncated` and `error` (or None).
        """
        create_kwargs = self._instances.get(instance_id, {})
        topk = int(create_kwargs.get("topk") or self.client_config.topk)
        try:
            queries = parse_queries(parameters, self.max_queries)
        except ValueError as exc:
            outcome = client.SearchOutcome(error=f"invalid arguments: {exc}")
            queries = []
        else:
            outcome = await client.search(queries, self.client_config, topk=topk)
        if outcome.ok:
            text, truncated = format_results(queries, outcome.hits, self.max_chars_per_passage, self.max_observation_chars,
                                             bool(self.config.get("show_ids", False)))
        else:
            text, truncated = SEARCH_FAILED_PREFIX + outcome.error, False
        record_search(kwargs.get("agent_data"), outcome)
        metrics = {
            "num_queries": len(queries),
            "search_failed": int(not outcome.ok),
            "latency_s": outcome.latency,
            "server_latency_s": outcome.server_time,
            "attempts": outcome.attempts,
            "truncated": truncated,
            "error": outcome.error,
        }
        return ToolResponse(text=text), 0.0, metrics

    async def release(self, instance_id: str, **kwargs) -> None:
        self._instances.pop(instance_id, None)

