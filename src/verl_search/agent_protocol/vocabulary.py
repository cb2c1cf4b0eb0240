"""The protocol vocabulary, in one leaf module (standard library only, imports nothing of ours).

What the model writes, what the environment answers, and what a trajectory records, shared by the
rewards, the agent loop, the tool, the eval harness and check-config:

* **tags** of the Search-R1 tag protocol (`<search>`, `<answer>`, `<information>`, `<think>`) and of
  the hermes tool-call protocol (`<tool_call>`, `<tool_response>`), with their regexes;
* the environment's **fixed messages**: Search-R1's correction message after an invalid action, the
  last-search notice, the observation frame;
* the **trajectory field names** the agent loop and the tool write into verl's `extra_fields`
  (verl hands them to the reward as `extra_info`);
* `DEFAULT_TOPK`, passages per search (Search-R1's 3), used by the server, the client and eval.

Rewards import this module and nothing else of the package, so they stay pure and cheap to import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# --- defaults ------------------------------------------------------------------------------------
#: passages per query when nothing else says (Search-R1's top-3)
DEFAULT_TOPK = 3

# --- tags ----------------------------------------------------------------------------------------
#: generation stops at the first of these (a turn ends with a search or an answer)
STOP_STRINGS = ["</search>", "</answer>"]
#: the first complete `<search>` / `<answer>` block of a model turn
ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
#: an `<answer>` block (the prediction is the last one the model wrote)
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
#: text the environment wrote (never scored: Search-R1, tool-call and ReSearch observations); an unclosed
#: block runs to the end
RETRIEVED_RE = re.compile(r"<(information|tool_response|result)>.*?(</\1>|$)", re.DOTALL)
#: the body of each `<information>` block
INFORMATION_RE = re.compile(r"<information>(.*?)</information>", re.DOTALL)
#: a `<tool_response>` block, an unclosed one running to the end
TOOL_RESPONSE_RE = re.compile(r"<tool_response>.*?(</tool_response>|$)", re.DOTALL)
#: the JSON body of each hermes `<tool_call>`
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
#: the tags whose order Search-R1's format check follows
FORMAT_TAG_RE = re.compile(r"(</?(?:think|search|information|answer)>)")

# --- fixed messages of the environment -----------------------------------------------------------
#: Search-R1's correction message after a turn with no `<search>`/`<answer>` block (it contains the
#: literal `<answer> and </answer>`, which the rewards strip before scoring)
INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
#: appended inside the last observation the model gets
LAST_SEARCH_NOTICE = "\nThis was the last search: no more searches are allowed. Give the final answer now."
#: the frame of an observation: `OBSERVATION_PREFIX + body + OBSERVATION_SUFFIX`
OBSERVATION_PREFIX = "\n\n<information>"
OBSERVATION_SUFFIX = "</information>\n\n"
#: marks an observation body cut to its token budget
TRUNCATION_MARK = " ...(truncated)"
#: the observation line of a query that retrieved nothing (`tools.formatting.format_results`)
NO_PASSAGES = "No passages found."
#: the observation of a search that failed: `SEARCH_FAILED_PREFIX + reason`
SEARCH_FAILED_PREFIX = "search failed: "
#: the observation of a page access that failed (the `access` tool): `ACCESS_FAILED_PREFIX + reason`
ACCESS_FAILED_PREFIX = "access failed: "
#: the search tool's function name: its tool schema (`tools.search_tool`), the key of a row's
#: `tools_kwargs` (`datasets.preprocess`, read by the tag-protocol agent loop), the hermes tool calls
#: `eval` reads the queries of (the shipped tool YAML says `name: search` too)
SEARCH_TOOL = "search"

# --- trajectory fields (verl `extra_fields`, the reward's `extra_info`) --------------------------
NUM_SEARCHES = "num_searches"  #: int, search calls made (failed ones included)
FAILED_SEARCHES = "failed_searches"  #: int, search calls that failed
SEARCH_ERRORS = "search_errors"  #: list[str], the reason of each failed call
NUM_ACCESSES = "num_accesses"  #: int, page-access calls made (the `access` tool; failed ones included)
FAILED_ACCESSES = "failed_accesses"  #: int, page-access calls that failed
ACCESS_ERRORS = "access_errors"  #: list[str], the reason of each failed page access
INVALID_ACTIONS = "invalid_actions"  #: int, tag-protocol turns with neither a search nor an answer
ANSWERED = "answered"  #: bool, the model wrote an answer
TURNS = "turns"  #: list[dict], one record per model turn (tag-protocol agent loop)
ENDED_WITH_EOS = "ended_with_eos"  #: bool, the last model turn ended with the tokenizer's EOS (ReSearch loop)
#: the integer counters among them
COUNTERS = (NUM_SEARCHES, FAILED_SEARCHES, INVALID_ACTIONS)


@dataclass
class Action:
    """What one model turn asked for: `kind` is `search`, `answer` or `invalid`."""

    kind: str
    content: str = ""


def parse_action(text: str) -> Action:
    """The first complete `<search>`/`<answer>` block of a turn (Search-R1's `postprocess_predictions`).

    >>> parse_action("<think>hm</think><search> capital of France </search>")
    Action(kind='search', content='capital of France')
    >>> parse_action("I think it is Paris.")
    Action(kind='invalid', content='')
    """
    match = ACTION_RE.search(text)
    if match is None:
        return Action("invalid")
    return Action(match.group(1), match.group(2).strip())
