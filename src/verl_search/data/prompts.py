"""Prompt templates for the two protocols.

* `SEARCH_R1_TEMPLATE`: the Search-R1 paper prompt, verbatim from
  `scripts/data_process/nq_search.py` (`make_prefix`, template "base"): the model writes
  `<search> query </search>` and reads `<information> ... </information>`. Use it with the
  Search-R1 agent loop (`agent_name: search_r1_agent`).
* `TOOL_TEMPLATE`: for verl's `ToolAgentLoop` with the `hermes` parser. It says nothing about
  how to format a tool call: the chat template's tool section (Qwen2.5: "return a json object
  ... within <tool_call></tool_call>") is the only instruction, so the two never conflict. (verl's
  old preprocessing asked for `<tool_call> query </tool_call>` as plain text, which hermes cannot
  parse.)
"""

SEARCH_R1_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search> and it will return the top searched results between <information> "
    "and </information>. You can search as many times as your want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

TOOL_TEMPLATE = (
    "Answer the given question. Think step by step. Whenever you lack some knowledge, call the search tool; "
    "its results come back to you inside <tool_response> and </tool_response>. You can search as many times "
    "as you want. When no further knowledge is needed, give the final answer inside <answer> and </answer>, "
    "without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}"
)

TEMPLATES = {"search_r1": SEARCH_R1_TEMPLATE, "tool": TOOL_TEMPLATE}
AGENT_NAMES = {"search_r1": "search_r1_agent", "tool": "tool_agent"}
