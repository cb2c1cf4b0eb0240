"""The baselines without a search policy: direct answer, chain of thought, and RAG (one retrieval with the
question, its passages in the prompt). Each asks for the answer between `<answer>` and `</answer>`, so the
rewards score it as they score the agents (`agent_protocol.answers.extract_answer`, EM / F1 / cover-EM).

Prompts, with their sources (the papers' baseline tables name these methods; Search-R1 arXiv 2503.09516,
Table 2; ReSearch arXiv 2503.19470, Table 1):

* **direct** (`DIRECT_SYSTEM`, `DIRECT_USER`): FlashRAG's zero-shot generation, the "naive generation" of
  ReSearch's `scripts/evaluation/run_eval.py` (`zero_shot`: a system prompt "Answer the question based on
  your own knowledge. ..." and the user message `Question: {question}`), with one sentence added that asks
  for the answer tags;
* **cot** (`COT_TEMPLATE`): Search-R1's prompt without search, verbatim
  (`scripts/data_process/nq.py`, `make_prefix`, template "base": reason in `<think>`, answer in `<answer>`);
* **rag** (`RAG_TEMPLATE`): Search-R1's RAG prompt, verbatim (`scripts/data_process/nq_rag.py`,
  `make_prefix`), its context the top-k passages of the question as `Doc {i}(Title: {title}) {text}` lines
  (`format_reference` there; the same lines as a Search-R1 observation, `tools.formatting`). FlashRAG's
  standard RAG (`SequentialPipeline.run`, ReSearch's "naive" method) retrieves the same way with another prompt.

A RAG row stores its prompt with `PASSAGES_SLOT` where the passages go; the agent loop retrieves at rollout
and writes them there (`fill_passages`). Agent loops: `verl_search.agent_loop.baselines`.
"""

from __future__ import annotations

import re

from verl_search.agent_protocol.answers import extract_answer
from verl_search.agent_protocol.base import Protocol
from verl_search.agent_protocol.search_r1 import search_r1_format_ok
from verl_search.agent_protocol.vocabulary import DEFAULT_TOPK

#: where a prompt's retrieved passages go; the agent loop replaces it at rollout (`fill_passages`)
PASSAGES_SLOT = "{retrieved_passages}"
#: generation stops here (and at EOS): every baseline ends with its answer
STOP = ("</answer>",)

#: direct answer: FlashRAG's zero-shot system prompt, then one added sentence asking for the answer tags
DIRECT_SYSTEM = (
    "Answer the question based on your own knowledge. Only give me the answer and do not output any other words. "
    "Write the answer between <answer> and </answer>, for example <answer> Beijing </answer>."
)
#: direct answer: FlashRAG's zero-shot user message
DIRECT_USER = "Question: {question}"

#: chain of thought: Search-R1's prompt without search (`scripts/data_process/nq.py`), verbatim
COT_TEMPLATE = (
    "Answer the given question. "
    "You should first have a reasoning process in mind and then provides the answer. "
    "Show your reasoning in <think> </think> tags and return the final answer in <answer> </answer> tags, "
    "for example <answer> Beijing </answer>. "
    "Question: {question}\n"
)

#: RAG: Search-R1's RAG prompt (`scripts/data_process/nq_rag.py`), verbatim; `{context}` holds the passages
RAG_TEMPLATE = (
    "Answer the given question with some potentially useful context. "
    "You should analyze the question carefully, evaluate the given context (which may or may not be useful), "
    "and then generate an accurate and well-reasoned response. "
    "You should first have a reasoning process in mind and then provides the answer. "
    "Show your reasoning in <think> </think> tags and return the final answer in <answer> </answer> tags, "
    "for example <answer> Beijing </answer>. "
    "Question: {question} Context: {context} \n"
)

_ANSWER_ONLY_RE = re.compile(r"\s*<answer>(?:(?!<answer>).)*?</answer>\s*", re.DOTALL)


def fill_passages(messages: list[dict], passages: str) -> list[dict]:
    """`messages` with `PASSAGES_SLOT` replaced by `passages` (in the one message holding it).

    >>> fill_passages([{"role": "user", "content": "Q? Context: {retrieved_passages} \\n"}], "Doc 1(Title: A) a")
    [{'role': 'user', 'content': 'Q? Context: Doc 1(Title: A) a \\n'}]

    Raises:
        ValueError: no message holds the slot (a row not preprocessed for this protocol).
    """
    if not any(PASSAGES_SLOT in str(m.get("content", "")) for m in messages):
        raise ValueError(f"no message of the row holds {PASSAGES_SLOT!r}: preprocess the rows with this protocol "
                         "(--protocol rag or ircot), whose prompt says where the retrieved passages go")
    return [{**m, "content": str(m["content"]).replace(PASSAGES_SLOT, passages, 1)} if PASSAGES_SLOT in
            str(m.get("content", "")) else dict(m) for m in messages]


def answer_only_format_ok(response: str) -> tuple[bool, str]:
    """The direct baseline's format: the response is one `<answer>...</answer>` block and nothing else;
    `(ok, reason)`.

    >>> answer_only_format_ok(" <answer> Paris </answer>\\n")
    (True, 'valid')
    >>> answer_only_format_ok("It is <answer> Paris </answer>")[0]
    False
    """
    if _ANSWER_ONLY_RE.fullmatch(response):
        return True, "valid"
    return False, "the response is not one <answer> block alone"


def reasoned_answer_format_ok(response: str) -> tuple[bool, str]:
    """The chain-of-thought and RAG format: `<think>...</think>` then `<answer>...</answer>`, Search-R1's
    rules (`search_r1.search_r1_format_ok`) without a search; `(ok, reason)`.

    >>> reasoned_answer_format_ok("<think> a </think> <answer> b </answer>")
    (True, 'valid')
    >>> reasoned_answer_format_ok("<think>a</think><search> q </search>")[1]
    'a search in a baseline without search'
    """
    if "<search>" in response or "<information>" in response:
        return False, "a search in a baseline without search"
    return search_r1_format_ok(response)


DIRECT = Protocol(
    name="direct",
    agent_name="direct_agent",
    summary="baseline, no retrieval: the answer alone in <answer> ... </answer> (FlashRAG's zero-shot prompt)",
    messages=lambda question: [{"role": "system", "content": DIRECT_SYSTEM},
                               {"role": "user", "content": DIRECT_USER.format(question=question)}],
    format_check=answer_only_format_ok,
    extract_answer=extract_answer,
    stop=STOP,
    default_topk=DEFAULT_TOPK,
    source="FlashRAG zero-shot (ReSearch scripts/evaluation/run_eval.py zero_shot), answer tags added",
    retrieves=False,
)

COT = Protocol(
    name="cot",
    agent_name="cot_agent",
    summary="baseline, no retrieval: reasoning in <think>, then <answer> (Search-R1's prompt without search)",
    messages=lambda question: [{"role": "user", "content": COT_TEMPLATE.format(question=question)}],
    format_check=reasoned_answer_format_ok,
    extract_answer=extract_answer,
    stop=STOP,
    default_topk=DEFAULT_TOPK,
    source="Search-R1 scripts/data_process/nq.py",
    retrieves=False,
)

RAG = Protocol(
    name="rag",
    agent_name="rag_agent",
    summary="baseline: one retrieval with the question, its top-k passages in the prompt, then <answer>",
    messages=lambda question: [{"role": "user",
                                "content": RAG_TEMPLATE.format(question=question, context=PASSAGES_SLOT)}],
    format_check=reasoned_answer_format_ok,
    extract_answer=extract_answer,
    stop=STOP,
    default_topk=DEFAULT_TOPK,
    source="Search-R1 scripts/data_process/nq_rag.py",
)
