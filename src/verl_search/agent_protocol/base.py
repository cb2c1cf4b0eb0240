"""`Protocol`: what one way of talking to a search engine fixes, from the prompt to the reward.

A protocol is data plus a few pure functions (standard library only). Its users resolve it by
name through `verl_search.agent_protocol.registry.get_protocol`, in one place each:

* preprocessing writes `messages(question)` and `agent_name` into every row;
* the agent loop stops generation at `stop`, reads an action with `parse_action`, frames the
  retrieved text with `observation_prefix`/`observation_suffix` (loss mask 0);
* the reward checks `format_check` and scores the answer `extract_answer` finds;
* eval, check-config and the quickstart read `name`, `agent_name` and `default_topk`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from verl_search.agent_protocol.vocabulary import Action


@dataclass(frozen=True)
class Protocol:
    """One protocol (see the module docstring for who reads what).

    Attributes:
        name: the `--protocol` value and the rows' `extra_info.protocol`.
        agent_name: the verl agent loop its rows select (`agent_name` column).
        summary: one line for `--help` and the docs.
        messages: `question -> [{"role", "content"}, ...]`, the row's chat messages.
        format_check: `response -> (ok, reason)`: the protocol's format rules on a decoded response.
        extract_answer: `response -> answer | None`: the model's final answer (retrieved text never counts).
        parse_action: `model turn -> Action` (`search`, `answer` or `invalid`); None when verl's own
            tool parser reads the turn (tool-call protocol) or the loop reads no action (the baselines).
        stop: generation stops at the first of these (empty: the engine's EOS only).
        observation_prefix, observation_suffix: the frame the environment writes around retrieved text.
        default_topk: passages per search when nothing else says.
        uses_tools: rows carry verl `tools_kwargs` for `ToolAgentLoop` (`need_tools_kwargs`).
        source: the paper or upstream file the protocol follows.
        search_cap_key: the key of its agent loop's YAML entry that caps the searches (what eval's `--max-turns`
            sets; None: the loop has no such cap, or verl's own `tool_agent` takes it elsewhere).
        retrieves: its agent loop calls the retrieval service (False: the direct and chain-of-thought baselines).
    """

    name: str
    agent_name: str
    summary: str
    messages: Callable[[str], list[dict]]
    format_check: Callable[[str], tuple[bool, str]]
    extract_answer: Callable[[str], str | None]
    parse_action: Callable[[str], Action] | None = None
    stop: tuple[str, ...] = ()
    observation_prefix: str = ""
    observation_suffix: str = ""
    default_topk: int = 3
    uses_tools: bool = False
    source: str = ""
    search_cap_key: str | None = None
    retrieves: bool = True
