"""The tool-call protocol: verl's `ToolAgentLoop` with the `hermes` parser and our `SearchTool`.

The model calls the search tool in the chat template's own format (Qwen2.5: a JSON object inside
`<tool_call></tool_call>`); results come back as a tool message (`<tool_response>`), and the
final answer is `<answer> ... </answer>`. The prompt says nothing about how to format a tool call:
the chat template's tool section is the only instruction, so the two never conflict (verl's old
preprocessing asked for `<tool_call> query </tool_call>` as plain text, which hermes cannot parse).
Format rules: every `<tool_call>` is closed and holds a JSON object with a `name`; the response
ends with one `<answer>..</answer>` after the last tool response.
"""

from __future__ import annotations

import json

from verl_search.agent_protocol.answers import extract_answer
from verl_search.agent_protocol.base import Protocol
from verl_search.agent_protocol.vocabulary import DEFAULT_TOPK, TOOL_CALL_RE, TOOL_RESPONSE_RE

TOOL_TEMPLATE = (
    "Answer the given question. Think step by step. Whenever you lack some knowledge, call the search tool; "
    "its results come back to you inside <tool_response> and </tool_response>. You can search as many times "
    "as you want. When no further knowledge is needed, give the final answer inside <answer> and </answer>, "
    "without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}"
)

def parse_queries(parameters: object, max_queries: int | None = None) -> list[str]:
    """The query strings of a search tool call's arguments, stripped (the one parser of them: the
    tool's `execute`, `tools.search_tool.SearchTool`, and `eval.records` for the queries a trajectory asked).

    Accepts `{"query_list": [str, ...]}` (or one string) or `{"query": str}`; blank queries are an
    error, as are more than `max_queries` (None: no limit).

    Raises:
        ValueError: with a message the model can act on (it becomes the observation).
    """
    if not isinstance(parameters, dict):
        raise ValueError('arguments must be a JSON object such as {"query_list": ["..."]}')
    if "query_list" in parameters:
        queries = parameters["query_list"]
        if isinstance(queries, str):
            queries = [queries]
    elif "query" in parameters:
        queries = [parameters["query"]]
    else:
        raise ValueError('missing "query_list": call search with {"query_list": ["your query"]}')
    if not isinstance(queries, list) or not queries or not all(isinstance(q, str) for q in queries):
        raise ValueError('"query_list" must be a non-empty list of strings')
    queries = [q.strip() for q in queries]
    if any(not q for q in queries):
        raise ValueError("a query is empty")
    if max_queries is not None and len(queries) > max_queries:
        raise ValueError(f"{len(queries)} queries in one call; at most {max_queries}")
    return queries


def tool_call_format_ok(response: str) -> tuple[bool, str]:
    """Whether a tool-call (hermes) response is well formed; `(ok, reason)`.

    >>> tool_call_format_ok('<tool_call>{"name": "search", "arguments": {}}</tool_call>'
    ...                     '<tool_response>..</tool_response><answer>x</answer>')
    (True, 'valid')
    """
    own = TOOL_RESPONSE_RE.sub(" ", response)
    if own.count("<tool_call>") != own.count("</tool_call>"):
        return False, "unclosed <tool_call>"
    for body in TOOL_CALL_RE.findall(own):
        try:
            call = json.loads(body)
        except json.JSONDecodeError:
            return False, "a <tool_call> is not JSON"
        if not isinstance(call, dict) or "name" not in call:
            return False, 'a <tool_call> has no "name"'
    tail = own.split("</tool_call>")[-1]
    if tail.count("<answer>") != 1 or tail.count("</answer>") != 1:
        return False, "no single <answer> after the last tool call"
    if tail.split("</answer>")[-1].strip():
        return False, "text after </answer>"
    return True, "valid"



TOOL = Protocol(
    name="tool",
    agent_name="tool_agent",
    summary="tool calls (hermes): the chat template's <tool_call> JSON, <tool_response> results, <answer>",
    messages=lambda question: [{"role": "user", "content": TOOL_TEMPLATE.format(question=question)}],
    format_check=tool_call_format_ok,
    extract_answer=extract_answer,
    default_topk=DEFAULT_TOPK,
    uses_tools=True,
    source="verl experimental/agent_loop/tool_agent_loop.py (hermes tool parser)",
)
