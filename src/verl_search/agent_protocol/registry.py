"""The protocols by name: the one place `--protocol` and a row's `extra_info.protocol` resolve.

Adding a protocol is one new module that builds a `Protocol` (see `research.py`) and one line in
`PROTOCOLS` below (and its name in `ProtocolName`); an agent loop of its own is registered in `configs/agent_loops.yaml`.
"""

from __future__ import annotations

from typing import Literal, get_args

from verl_search.agent_protocol.base import Protocol
from verl_search.agent_protocol.baselines import COT, DIRECT, RAG
from verl_search.agent_protocol.ircot import IRCOT
from verl_search.agent_protocol.research import RESEARCH
from verl_search.agent_protocol.search_r1 import SEARCH_R1
from verl_search.agent_protocol.tool import TOOL

#: every protocol, by `--protocol` name: the three search protocols, then the baselines (docs/eval.md, Baselines)
PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (SEARCH_R1, TOOL, RESEARCH, DIRECT, COT, RAG, IRCOT)}
#: the names, for argument choices
PROTOCOL_NAMES = tuple(PROTOCOLS)
#: the names as a type, for the options dataclasses (`--protocol`)
ProtocolName = Literal["search_r1", "tool", "research", "direct", "cot", "rag", "ircot"]
if get_args(ProtocolName) != PROTOCOL_NAMES:  # pragma: no cover - a registry edit missed the type
    raise ImportError(f"ProtocolName {get_args(ProtocolName)} must list PROTOCOLS {PROTOCOL_NAMES}")


def get_protocol(name: str) -> Protocol:
    """The protocol called `name`.

    >>> get_protocol("research").stop
    ('</search>',)

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}: use one of {', '.join(PROTOCOL_NAMES)}")
    return PROTOCOLS[name]


def search_cap_keys() -> dict[str, str]:
    """Agent-loop name -> the key of its YAML entry that caps the searches (`Protocol.search_cap_key`), for every
    protocol whose loop has one: what `verl-search eval --max-turns` and the quickstart's `--max-turns` set.

    >>> search_cap_keys()["search_r1_agent"], search_cap_keys()["research_agent"]
    ('max_turns', 'max_searches')
    """
    return {p.agent_name: p.search_cap_key for p in PROTOCOLS.values() if p.search_cap_key}
