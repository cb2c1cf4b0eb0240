"""IRCoT, interleaved retrieval with chain of thought (Trivedi et al., ACL 2023, arXiv 2212.10509), as a
baseline: each reasoning sentence the model writes becomes the next retrieval query, and the passages
collected so far stand in the prompt before the question.

Prompt and control flow follow FlashRAG's `IRCOTPipeline` (`flashrag/pipeline/active_pipeline.py`; the
`ircot` method of ReSearch's `scripts/evaluation/run_eval.py`, `max_iter=5`, on ReSearch's vendored copy):

* the system prompt is FlashRAG's `IRCOT_INSTRUCTION` and its one demonstration `IRCOT_EXAMPLE`; the user
  message is the collected passages (`Wikipedia Title: {title}\\n{text}\\n\\n` each, FlashRAG's
  `reference_template`), then `Question: {question}\\nThought:`; the thoughts so far follow the prompt;
* the passages of the question are retrieved first; each step generates one thought, stopped at `.` or a
  newline (FlashRAG's `stop=['.', '\\n']`), and a thought that does not give the answer is the next query.

What differs, so that the rewards score IRCoT as every other protocol: the instruction and the
demonstration ask for the answer between `<answer>` and `</answer>` after FlashRAG's "So the answer is:"
(two phrases added, marked in `INSTRUCTION` and `EXAMPLE`); a turn that has begun its answer runs on to
`</answer>`; the last allowed step is an answer step (stopped at `</answer>` only). The agent loop is
`verl_search.agent_loop.ircot.IRCoTAgentLoop`, where the remaining differences are listed.
"""

from __future__ import annotations

import re

from verl_search.agent_protocol.answers import extract_answer
from verl_search.agent_protocol.base import Protocol
from verl_search.agent_protocol.baselines import PASSAGES_SLOT
from verl_search.agent_protocol.vocabulary import ANSWER_RE, DEFAULT_TOPK

#: FlashRAG's `IRCOT_INSTRUCTION`, then (added) where the answer goes
INSTRUCTION = (
    "You serve as an intelligent assistant, adept at facilitating users through complex, multi-hop reasoning "
    "across multiple documents. This task is illustrated through demonstrations, each consisting of a document "
    "set paired with a relevant question and its multi-hop reasoning thoughts. Your task is to generate one "
    "thought for current step, DON'T generate the whole thoughts at once! If you reach what you believe to be "
    'the final step, start with "So the answer is:".'
    " Then write the answer between <answer> and </answer>."  # added: the answer tags the rewards read
)

#: FlashRAG's `IRCOT_EXAMPLE`, its final answer written `<answer> no </answer>` (added tags)
EXAMPLE = (
    "Wikipedia Title: Kurram Garhi\nKurram Garhi is a small village located near the city of Bannu, which is "
    "the part of Khyber Pakhtunkhwa province of Pakistan. Its population is approximately 35000. Barren hills "
    "are near this village. This village is on the border of Kurram Agency. Other nearby villages are Peppal, "
    "Surwangi and Amandi Kala.\n\n"
    "Wikipedia Title: 2001–02 UEFA Champions League second group stage\nEight winners and eight runners- up "
    "from the first group stage were drawn into four groups of four teams, each containing two group winners "
    "and two runners- up. Teams from the same country or from the same first round group could not be drawn "
    "together. The top two teams in each group advanced to the quarter- finals.\n\n"
    "Wikipedia Title: Satellite tournament\nA satellite tournament is either a minor tournament or event on a "
    "competitive sporting tour or one of a group of such tournaments that form a series played in the same "
    "country or region.\n\n"
    "Wikipedia Title: Trojkrsti\nTrojkrsti is a village in Municipality of Prilep, Republic of Macedonia.\n\n"
    "Wikipedia Title: Telephone numbers in Ascension Island\nCountry Code:+ 247< br> International Call "
    "Prefix: 00 Ascension Island does not share the same country code( +290) with the rest of St Helena.\n\n"
    "Question: Are both Kurram Garhi and Trojkrsti located in the same country?\n"
    "Thought: Kurram Garhi is located in the country of Pakistan. Trojkrsti is located in the country of "
    "Republic of Macedonia. Thus, they are not in the same country. So the answer is: <answer> no </answer>.\n\n"
)

#: the user message after the collected passages (`PASSAGES_SLOT`, first): the question and the cue for a thought
USER_TEMPLATE = "Question: {question}\nThought:"
#: one passage in the prompt (FlashRAG's `reference_template`)
PASSAGE_TEMPLATE = "Wikipedia Title: {title}\n{text}\n\n"
#: a thought step stops at the end of its first sentence (FlashRAG's stops), or at the end of an answer
THOUGHT_STOP = (".", "\n", "</answer>")
#: a turn that has begun its answer, and the last step, stop at the end of the answer only
ANSWER_STOP = ("</answer>",)
#: FlashRAG's termination marker (`ircot_pred_parse`)
ANSWER_PREFIX = "So the answer is"
#: the IRCoT paper's limits: at most 15 paragraphs collected; FlashRAG's run_eval.py: 5 steps
MAX_PASSAGES = 15
MAX_STEPS = 5


def messages(question: str) -> list[dict]:
    """A row's chat messages: the instruction and demonstration as the system prompt, the passage slot and the
    question as the user message (without a chat template the agent loop joins them with a blank line, as
    FlashRAG does)."""
    return [{"role": "system", "content": f"{INSTRUCTION}\n\n{EXAMPLE}"},
            {"role": "user", "content": PASSAGES_SLOT + USER_TEMPLATE.format(question=question)}]


def format_passages(documents: list[dict]) -> str:
    """The prompt text of `documents` (`{"id", "contents"}`, `contents` = title line, then text).

    >>> format_passages([{"id": "1", "contents": '"Paris"\\nCapital of France.'}])
    'Wikipedia Title: "Paris"\\nCapital of France.\\n\\n'
    """
    out = []
    for document in documents:
        title, _, text = str(document.get("contents", "")).partition("\n")
        out.append(PASSAGE_TEMPLATE.format(title=title, text=text))
    return "".join(out)


def answer_begun(turn: str) -> bool:
    """Whether a thought has begun the final answer (`So the answer is` or `<answer>`).

    >>> answer_begun("Paris is in France."), answer_begun("So the answer is: <answer> Paris")
    (False, True)
    """
    return ANSWER_PREFIX in turn or "<answer>" in turn


def answer_open(turn: str) -> bool:
    """Whether a turn has begun its answer and not closed it (its last `<answer>` has no `</answer>` after it,
    or it says `So the answer is` and has no `<answer>` yet).

    >>> answer_open("So the answer is: <answer> St."), answer_open("So the answer is: <answer> no </answer>")
    (True, False)
    """
    if "<answer>" in turn:
        return "</answer>" not in turn[turn.rfind("<answer>"):]
    return ANSWER_PREFIX in turn


def thought_query(turn: str) -> str:
    """The retrieval query of a thought: its text, stripped (FlashRAG searches the thought as generated).

    >>> thought_query(" Kurram Garhi is in Pakistan.\\n")
    'Kurram Garhi is in Pakistan.'
    """
    return turn.strip()


def format_check(response: str) -> tuple[bool, str]:
    """IRCoT's format here: thoughts, then exactly one `<answer>...</answer>` block that ends the response
    (only a `.` and blanks after it); `(ok, reason)`.

    >>> format_check("A is in B. So the answer is: <answer> B </answer>.")
    (True, 'valid')
    >>> format_check("A is in B.")[1]
    'no <answer> block'
    """
    blocks = ANSWER_RE.findall(response)
    if not blocks:
        return False, "no <answer> block"
    if len(blocks) > 1 or response.count("<answer>") > 1:
        return False, "more than one <answer> block"
    if response.rsplit("</answer>", 1)[1].strip(" \n.") or re.search(r"<(search|information)>", response):
        return False, "text after </answer>, or a search tag"
    return True, "valid"


IRCOT = Protocol(
    name="ircot",
    agent_name="ircot_agent",
    summary="baseline: IRCoT, one-sentence thoughts, each the next retrieval query, passages in the prompt",
    messages=messages,
    format_check=format_check,
    extract_answer=extract_answer,
    stop=THOUGHT_STOP,
    default_topk=DEFAULT_TOPK,
    source="IRCoT arXiv 2212.10509; FlashRAG IRCOTPipeline (ReSearch scripts/evaluation/run_eval.py ircot)",
    search_cap_key="max_retrievals",
)
