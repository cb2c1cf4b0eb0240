"""`AccessTool`: a verl `BaseTool` that reads a whole page from the retrieval service's `POST /access`.

After a `search` shows a snippet, the model reads the page it came from, as ASearcher's agent does
with its `access` tool: by `title` (the title the search result shows; on a local corpus, every
passage of that title in corpus order), by `id` (a passage id, shown by `SearchTool` with
`show_ids: true`; on the web backend the id is the page's URL) or by `url` (web backend). Register it
beside `SearchTool` (`tool_configs/access_tool_config.yaml` lists both).

Config keys: those of `SearchTool` (the same client, retries and deadline; `access_service_url`
defaults to the retrieval URL with `/retrieve` replaced by `/access`), plus:

| key | default | meaning |
| --- | --- | --- |
| `max_page_chars` | none [characters] | cut the page's text, with a note saying how much was left out. Keep it at or below verl's `multi_turn.max_tool_response_length`, which cuts blindly |

A failure (service down, timeout, an unknown title or id: HTTP 404, bad arguments) never raises: the
observation is `access failed: <reason>`, the metrics say so, and the trajectory's `extra_fields`
count it (`num_accesses`, `failed_accesses`, `access_errors`).
"""

from __future__ import annotations

from typing import Any

from verl.tools.schemas import ToolResponse

from verl_search.agent_protocol.vocabulary import ACCESS_FAILED_PREFIX
from verl_search.tools import client
from verl_search.tools.client import record_access
from verl_search.tools.search_tool import SearchTool

#: tool-call argument -> `/access` request field
ARGUMENT_FIELDS = {"title": "titles", "id": "ids", "url": "urls"}

DEFAULT_ACCESS_SCHEMA = {
    "type": "function",
    "function": {
        "name": "access",
        "description": "Reads a whole page: give the title (or id) of a search result to read the full text.",
        "parameters": {
            "type": "object",
            "properties": {
                "title": {"type": "string", "description": "The title of a search result, as shown."},
                "id": {"type": "string", "description": "The id of a search result (on the web: its URL)."},
            },
            "required": [],
        },
    },
}


def parse_target(parameters: Any) -> tuple[str, str]:
    """The `(request field, value)` of an access call's arguments: exactly one of `title`, `id`, `url`.

    Raises:
        ValueError: with a message the model can act on (it becomes the observation).
    """
    if not isinstance(parameters, dict):
        raise ValueError('arguments must be a JSON object such as {"title": "..."}')
    given = [name for name in ARGUMENT_FIELDS if name in parameters]
    if len(given) != 1:
        raise ValueError('give exactly one of "title", "id" or "url", e.g. {"title": "Paris"}')
    value = parameters[given[0]]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f'"{given[0]}" must be a non-empty string')
    return ARGUMENT_FIELDS[given[0]], value.strip()


def format_page(page: dict, max_chars: int | None = None) -> tuple[str, bool]:
    """`(Title: {title}) {text}` of a `PageDocument` dict, the text cut to `max_chars` characters with a
    closing note; returns `(text, truncated)`.

    >>> format_page({"title": "Paris", "contents": '"Paris"\\nCapital of France.'})
    ('(Title: "Paris") Capital of France.', False)
    >>> format_page({"title": "Paris", "contents": '"Paris"\\nCapital of France.'}, 7)
    ('(Title: "Paris") Capital\\n[truncated: 11 more characters not shown]', True)
    """
    title, _, text = page.get("contents", "").partition("\n")
    title = title or f'"{page.get("title", "")}"'
    if max_chars is None or len(text) <= max_chars:
        return f"(Title: {title}) {text}", False
    kept = text[:max_chars].rstrip()
    return f"(Title: {title}) {kept}\n[truncated: {len(text) - len(kept)} more characters not shown]", True


class AccessTool(SearchTool):
    """Page-access tool for verl's `ToolAgentLoop` (hermes tool-call format), beside `SearchTool`.

    Args:
        config: the tool YAML's `config` mapping (keys in the module docstring).
        tool_schema: the YAML's `tool_schema`; `None` uses `DEFAULT_ACCESS_SCHEMA`.

    Raises:
        ValueError: on an unknown config key or a value out of range (naming it).
    """

    tool_keys = {"type", "max_page_chars"}
    default_schema = DEFAULT_ACCESS_SCHEMA

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        """Read one page. Never raises for a failed access.

        Returns:
            `(ToolResponse(text=observation), 0.0, metrics)`; metrics has `access_failed` (0/1),
            `latency_s`, `server_latency_s`, `attempts`, `truncated`, `page_chars` and `error` (or None).
        """
        try:
            field, value = parse_target(parameters)
        except ValueError as exc:
            outcome = client.SearchOutcome(error=f"invalid arguments: {exc}")
        else:
            outcome = await client.access(field, [value], self.client_config)
        if outcome.ok:
            text, truncated = format_page(outcome.pages[0], self.config.get("max_page_chars"))
        else:
            text, truncated = ACCESS_FAILED_PREFIX + outcome.error, False
        record_access(kwargs.get("agent_data"), outcome)
        metrics = {
            "access_failed": int(not outcome.ok),
            "latency_s": outcome.latency,
            "server_latency_s": outcome.server_time,
            "attempts": outcome.attempts,
            "truncated": truncated,
            "page_chars": len(outcome.pages[0]["contents"]) if outcome.ok else 0,
            "error": outcome.error,
        }
        return ToolResponse(text=text), 0.0, metrics
