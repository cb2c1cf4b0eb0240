"""The ReSearch protocol (ReSearch, arXiv 2503.19470; `Agent-RL/ReSearch`, branch `re-search`).

The model thinks in `<think>..</think>`, searches with `<search> query </search>` and reads the
passages the environment inserts as ` <result>\\n...\\n</result>` (loss mask 0); it ends with
`<answer> ... \\boxed{final answer} ... </answer>` and EOS. Generation stops at `</search>` only;
the query is the text between the last `<search>` and the last `</search>` of the model's turn.
Every fact here is from the branch `re-search` of that repository:

* prompts: `src/verl/utils/dataset/template.py` (`re_search_template` for base models, with the
  question after `User: `; `re_search_template_sys` as the system prompt of instruct models, with
  the bare question as the user message). The released checkpoints were trained on exactly these
  characters: they are protocol constants, like a wire format;
* rollout: `src/verl/workers/rollout/vllm_rollout/vllm_rollout.py` (`vLLMRolloutWithSearch`:
  stop `</search>`, `extract_search_content`, the ` <result>\\n{passages}\\n</result>` frame, the
  passages' `contents` joined by blank lines, top 5);
* format rules and answer: `src/verl/utils/reward_score/re_search.py` (`validate_format`,
  `extract_answer`, `last_boxed_only_string`, `remove_boxed`).

The reward (F1 of the boxed answer, 0.1 when well formed with F1 0) is
`verl_search.rewards.research`.
"""

from __future__ import annotations

import re

from verl_search.agent_protocol.base import Protocol
from verl_search.agent_protocol.tokens import observation_tokens
from verl_search.agent_protocol.vocabulary import Action

#: the prompt of base models (no chat template); `{question}` is the row's question
BASE_TEMPLATE = (
    "A conversation between User and Assistant. "
    "The user asks a question, and the assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with the "
    "answer. "
    "During thinking, the assistant can invoke the wikipedia search tool to search for fact information about "
    "specific topics if needed. "
    "The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags "
    "respectively, "
    "and the search query and result are enclosed within <search> </search> and <result> </result> tags "
    "respectively. "
    "For example, <think> This is the reasoning process. </think> <search> search query here </search> "
    "<result> search result here </result> "
    "<think> This is the reasoning process. </think> <answer> The final answer is \\[ \\boxed{{answer here}} \\] "
    "</answer>. "
    "In the last part of the answer, the final exact answer is enclosed within \\boxed{{}} with latex format. "
    "User: {question}. Assistant:"
)

#: the system prompt of instruct models (the user message is the bare question)
SYSTEM_PROMPT = (
    "You are a helpful assistant that can solve the given question step by step with the help of the "
    "wikipedia search tool. "
    "Given a question, you need to first think about the reasoning process in the mind and then provide the "
    "answer. "
    "During thinking, you can invoke the wikipedia search tool to search for fact information about specific "
    "topics if needed. "
    "The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags "
    "respectively, "
    "and the search query and result are enclosed within <search> </search> and <result> </result> tags "
    "respectively. "
    "For example, <think> This is the reasoning process. </think> <search> search query here </search> "
    "<result> search result here </result> "
    "<think> This is the reasoning process. </think> <answer> The final answer is \\[ \\boxed{answer here} \\] "
    "</answer>. "
    "In the last part of the answer, the final exact answer is enclosed within \\boxed{} with latex format."
)

#: generation stops here (and at EOS)
STOP = ("</search>",)
#: the frame of the retrieved passages: `RESULT_PREFIX + passages + RESULT_SUFFIX`
RESULT_PREFIX = " <result>\n"
RESULT_SUFFIX = "\n</result>"
#: passages per search (ReSearch's `top_n`)
TOPK = 5

_FIRST_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def base_prompt(question: str) -> str:
    """The base-model prompt text for one question.

    >>> base_prompt("Who wrote Hamlet?").endswith("User: Who wrote Hamlet?. Assistant:")
    True
    """
    return BASE_TEMPLATE.format(question=question)


def base_prompt_ids(tokenizer, question: str) -> list[int]:
    """The token ids of `base_prompt(question)`, tokenised without special tokens as ReSearch does
    (branch `re-search`, `src/verl/utils/torch_functional.py` `tokenize_and_postprocess_data`:
    `tokenizer(prompt, add_special_tokens=False)`; its overlong filter, `rl_dataset.py:133`, counts the same).
    For Qwen2.5 that is what `encode` gives anyway; a Llama-style tokenizer would otherwise add a BOS.

    Args:
        tokenizer: a Hugging Face tokenizer (anything with `encode(text, add_special_tokens=...)`).
        question: the row's question.

    Returns:
        the prompt's token ids, no BOS or other special token added.
    """
    return list(tokenizer.encode(base_prompt(question), add_special_tokens=False))


def messages(question: str) -> list[dict]:
    """A row's chat messages: ReSearch's system prompt and the bare question. Agent loops without a
    chat template (base models) build `base_prompt(question)` from the user message instead."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def format_passages(contents: list[str]) -> str:
    """The text inside `<result>`: each passage's `contents` (FlashRAG's `"title"\\ntext`), joined by
    blank lines, stripped (`vLLMRolloutWithSearch.batch_search`)."""
    return "".join(f"{text}\n\n" for text in contents).strip()


def result_tokens(body: str, encode, max_tokens: int) -> tuple[list[int], bool]:
    """Tokens of ` <result>\\n{body}\\n</result>`, at most `max_tokens`: tokenised as one string, as ReSearch
    encodes it, when that fits; else the body cut by tokens with the frame and `</result>` kept
    (`tokens.observation_tokens`). `encode(text) -> list[int]`.

    Returns:
        `(token_ids, truncated)`; `token_ids` is empty when even the frame does not fit.
    """
    ids = encode(RESULT_PREFIX + body + RESULT_SUFFIX)
    if len(ids) <= max_tokens:
        return ids, False
    return observation_tokens(body, encode, max_tokens, prefix=RESULT_PREFIX, suffix=RESULT_SUFFIX)[0], True


def passages_result_tokens(documents: list[dict], encode, max_tokens: int) -> tuple[list[int], bool]:
    """The ReSearch observation of one search, as token ids: `documents`' `contents` (`{"id", "contents"}`, the
    retriever's top-k) in `format_passages`' text inside `result_tokens`' block, at most `max_tokens`. What
    `ReSearchAgentLoop` appends after a search and what the cold start's ReSearch trajectories hold
    (`training.trajectories.trajectory_tokens`): one function, both callers.

    Returns:
        `(token_ids, truncated)`; `token_ids` is empty when even the frame does not fit.
    """
    return result_tokens(format_passages([str(d.get("contents", "")) for d in documents]), encode, max_tokens)


def search_query(turn: str) -> str:
    """The query of a model turn: the text between the last `<search>` before the last `</search>`
    and that `</search>`, stripped; `""` when there is none (`extract_search_content`).

    >>> search_query("<think>x</think> <search> first </search> <search> Paris mayor </search>")
    'Paris mayor'
    >>> search_query("no tags")
    ''
    """
    end = turn.rfind("</search>")
    start = turn.rfind("<search>", 0, end) if end >= 0 else -1
    return turn[start + len("<search>"):end].strip() if start >= 0 else ""


def format_check(response: str) -> tuple[bool, str]:
    """ReSearch's format rules on a response (retrieved `<result>` text included, as there); `(ok, reason)`.

    1. `<think>` and `</think>` occur equally often, at least once;
    2. exactly one `<answer>` and one `</answer>`, in that order;
    3. from each `<search>`, in order: a `</search>`, a `<result>` after the `<search>` and a
       `</result>` after that `<result>` all exist, and `<search> < </search> < <result> < </result>`;
       the next `<search>` is looked for from that `</result>`;
    4. the text from `<answer>` up to `</answer>` holds `\\boxed{` and a `}`.

    >>> format_check("<think>a</think> <answer> \\\\boxed{Paris} </answer>")
    (True, 'format is correct')
    >>> format_check("<think>a</think> <search> q </search> <answer> \\\\boxed{x} </answer>")[1]
    'search/result tags are incomplete'
    """
    if response.count("<think>") != response.count("</think>"):
        return False, "<think> </think> not paired"
    if response.count("<think>") == 0:
        return False, "<think> or </think> not found"
    if response.count("<answer>") != 1 or response.count("</answer>") != 1:
        return False, "<answer> or </answer> not found"
    position = 0
    while (search := response.find("<search>", position)) != -1:
        result = response.find("<result>", search)
        search_end = response.find("</search>", search)
        result_end = response.find("</result>", result)
        if -1 in (result, search_end, result_end):
            return False, "search/result tags are incomplete"
        if not search < search_end < result < result_end:
            return False, "search/result tags are nested in the wrong order"
        position = result_end
    answer_start, answer_end = response.find("<answer>"), response.find("</answer>")
    if answer_start > answer_end:
        return False, "<answer> must be before </answer>"
    content = response[answer_start:answer_end]
    if "\\boxed{" not in content or "}" not in content:
        return False, "answer is missing \\boxed{} format"
    return True, "format is correct"


def boxed_content(text: str) -> str | None:
    """What the last `\\boxed{...}` of `text` holds (balanced braces), or after the last `\\boxed `
    (up to a `$`) when that form occurs; None when there is none or its braces never close
    (`last_boxed_only_string` + `remove_boxed`; their failures score 0).

    >>> boxed_content("The final answer is \\\\[ \\\\boxed{New {York}} \\\\]")
    'New {York}'
    >>> boxed_content("\\\\boxed{open") is None
    True
    """
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        return None  # ReSearch falls back to `\fbox`, which `remove_boxed` then rejects
    depth = 0
    for end in range(start, len(text)):
        depth += (text[end] == "{") - (text[end] == "}")
        if text[end] == "}" and depth == 0:
            boxed = text[start:end + 1]
            return boxed[len("\\boxed{"):-1] if boxed.startswith("\\boxed{") else None
    return None


def extract_answer(response: str) -> str | None:
    """The final answer: the `\\boxed{}` content of the first `<answer>` block of the stripped response
    (`extract_answer`); None if either is missing.

    >>> extract_answer("<think>x</think> <answer> The final answer is \\\\[ \\\\boxed{Paris} \\\\] </answer>")
    'Paris'
    """
    match = _FIRST_ANSWER_RE.search(response.strip())
    return None if match is None else boxed_content(match.group(1))


def parse_action(turn: str) -> Action:
    """One model turn: `search` when it ends at `</search>` (the agent loop cut it there), `answer`
    when it holds a complete answer block, else `invalid` (the trajectory ends either way)."""
    if turn.rstrip().endswith("</search>"):
        return Action("search", search_query(turn))
    answer = extract_answer(turn)
    return Action("answer", answer) if answer is not None else Action("invalid")


RESEARCH = Protocol(
    name="research",
    agent_name="research_agent",
    summary="ReSearch tags: <search> query </search>, <result> passages, <answer> \\boxed{...} </answer>",
    messages=messages,
    format_check=format_check,
    extract_answer=extract_answer,
    parse_action=parse_action,
    stop=STOP,
    observation_prefix=RESULT_PREFIX,
    observation_suffix=RESULT_SUFFIX,
    default_topk=TOPK,
    source="Agent-RL/ReSearch branch re-search: template.py, vllm_rollout.py, re_search.py",
    search_cap_key="max_searches",
)
