"""`IRCoTAgentLoop`: IRCoT (`verl_search.agent_protocol.ircot`) as a verl agent loop, `agent_name: ircot_agent`.

One trajectory, as FlashRAG's `IRCOTPipeline.run_batch` runs one question:

1. the question is searched; its passages start the collection;
2. up to `max_retrievals` steps: the prompt is rebuilt with every passage collected so far before the question
   (`Wikipedia Title: ...` blocks in the user message), the thoughts so far follow it, and the model writes
   one thought, stopped at `.` or a newline (mask 1). A thought that begins the answer (`So the answer is` or
   `<answer>`) runs on to `</answer>` and ends the trajectory; any other thought is searched as it stands and
   the passages not yet collected join the collection (at most `max_passages`);
3. the step after the last allowed retrieval is the answer step: stopped at `</answer>` only.

So a trajectory makes at most `max_retrievals` retrievals (the question's included) and as many model steps.
verl's output is the last step's prompt and the thoughts, one after the other, as one response; each step is a
turn record (`query`: the thought searched after it, `observation`: that retrieval's passages in the prompt's
format, `new_passages`: how many joined the collection), after a first record for the question's retrieval.

What differs from FlashRAG: the answer tags (see the protocol); the collection keeps retrieval order (FlashRAG
re-sorts it by retrieval score, ascending, after every step; scores of different queries do not compare) and
stops at `max_passages` (the IRCoT paper's 15; FlashRAG has no cap); the passages are cut by tokens to what
`rollout.prompt_length` leaves (FlashRAG cuts the whole prompt in its middle); a thought keeps its `.` (FlashRAG's
engine drops the stop string and joins thoughts with a space); a thought still blank at its newline goes on
(twice at most; FlashRAG searches an empty thought), and one that stays blank searches nothing; a thought that
ends with EOS ends the trajectory; a failed search adds no passage and the steps go on (its reason is in the
turn's observation and in `search_errors`).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from verl_search.agent_loop.baselines import RAGAgentLoop
from verl_search.agent_loop.search_r1 import _Trajectory
from verl_search.llm.models import end_of_sequence_ids
from verl_search.agent_protocol import ircot
from verl_search.agent_protocol.vocabulary import SEARCH_FAILED_PREFIX

#: a thought that is still blank when it reaches a newline is generated on (the newline kept) this many times at
#: most, so a model that opens its turn with a line break does not spend a step on it
BLANK_RETRIES = 2


class IRCoTAgentLoop(RAGAgentLoop):
    """IRCoT agent loop; see the module docstring for the control flow.

    Args (the YAML entry's keys; units in brackets), beside `RAGAgentLoop`'s:
        max_retrievals: retrievals per trajectory, the question's included, and model steps (default 5, FlashRAG's
            `max_iter` in ReSearch's run_eval.py); at least 1 (1: the question's passages, then the answer step).
        max_passages: passages collected at most (default 15, the IRCoT paper's cap).
        max_tokens_per_turn: generation limit per step [tokens], a thought's continuation to `</answer>` included.
        max_obs_tokens: accepted and unused: the collection is bounded by `max_passages` and the prompt length.

    Raises:
        ValueError: `max_retrievals` or `max_passages` below 1.
    """

    def __init__(self, *args, max_retrievals: int = ircot.MAX_STEPS, max_passages: int = ircot.MAX_PASSAGES,
                 **kwargs):
        super().__init__(*args, **kwargs)
        if max_retrievals < 1 or max_passages < 1:
            raise ValueError(f"max_retrievals={max_retrievals} and max_passages={max_passages} must be >= 1")
        self.max_retrievals = max_retrievals
        self.max_passages = max_passages
        self.eos_ids = frozenset(end_of_sequence_ids(self.tokenizer, self.config.actor_rollout_ref.model.get("path")))

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        """Roll out one trajectory; see the module docstring."""
        messages, question, topk = self._row(kwargs)
        request_id, trajectory = uuid4().hex, _Trajectory(self.response_length)
        collected: dict[str, dict] = {}  # passage id -> document, in the order collected
        await self._retrieve(question, topk, self._retrieval_turn(trajectory), trajectory, collected)
        for step in range(self.max_retrievals):
            passages = ircot.format_passages(list(collected.values()))
            prompt_ids, _, _ = await self._fit_prompt(messages, passages, None)
            remaining = trajectory.remaining()
            if remaining <= 0:
                break
            last = step == self.max_retrievals - 1
            turn = await self._step(request_id, prompt_ids, sampling_params, remaining, trajectory, last)
            if last or ircot.answer_begun(turn["generated"]) or self._ended(trajectory, turn):
                break
            query = ircot.thought_query(turn["generated"])
            if query:
                await self._retrieve(query, topk, turn, trajectory, collected)
        return self._finish(prompt_ids, trajectory)

    async def _step(self, request_id: str, prompt_ids: list[int], sampling_params: dict, remaining: int,
                    trajectory: _Trajectory, last: bool) -> dict:
        """One thought (the answer step when `last`), within the step's token limit: a thought that has begun its
        answer goes on to `</answer>`; a thought still blank at its newline goes on to its sentence's end
        (`BLANK_RETRIES` times at most). Returns the step's turn record."""
        stops = ircot.ANSWER_STOP if last else ircot.THOUGHT_STOP
        record = await self._model_turn(request_id, prompt_ids, sampling_params, remaining, trajectory,
                                        stops=list(stops), end_ids=self.eos_ids)
        blank_retries = BLANK_RETRIES
        while not self._ended(trajectory, record):
            if ircot.answer_open(record["generated"]):
                stops = ircot.ANSWER_STOP
            elif not record["generated"].strip() and not last and blank_retries > 0:
                blank_retries -= 1
            else:
                break
            budget = min(self.max_tokens_per_turn - record["generated_tokens"],
                         trajectory.remaining())
            if budget <= 0:
                break
            more = await self._model_turn(request_id, prompt_ids, sampling_params, budget, trajectory,
                                          stops=list(stops), end_ids=self.eos_ids)
            trajectory.turns.pop()  # one step, one record
            if not more["generated_tokens"]:
                break
            record["generated_tokens"] += more["generated_tokens"]
            record["generated"] = self._decode(trajectory.response_ids[-record["generated_tokens"]:])
        return record

    def _ended(self, trajectory: _Trajectory, record: dict) -> bool:
        """Whether the step ended with an end-of-sequence token (the model closed its turn)."""
        return bool(record["generated_tokens"]) and trajectory.response_ids[-1] in self.eos_ids

    async def _retrieve(self, query: str, topk: int, record: dict, trajectory: _Trajectory,
                        collected: dict[str, dict]) -> None:
        """Search `query`; its passages not yet in `collected` join it while there is room (`max_passages`).
        `record` gets the query, the retrieval's passages in the prompt's format (`observation`) and the number
        that joined (`new_passages`)."""
        outcome = await self._search(query, topk, record, trajectory)
        if not outcome.ok:
            record.update(observation=SEARCH_FAILED_PREFIX + str(outcome.error), new_passages=0)
            return
        documents = outcome.hits[0]
        before = len(collected)
        for document in documents:
            key = str(document.get("id", document.get("contents", "")))
            if key not in collected and len(collected) < self.max_passages:
                collected[key] = document
        record.update(observation=ircot.format_passages(documents), new_passages=len(collected) - before)
