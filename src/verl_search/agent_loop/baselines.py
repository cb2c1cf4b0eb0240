"""Agent loops of the baselines without a search policy (`verl_search.agent_protocol.baselines`): direct answer and
chain of thought (`AnswerAgentLoop`: no retrieval) and RAG (`RAGAgentLoop`: one retrieval with the question,
its passages in the prompt). IRCoT builds on `RAGAgentLoop` (`verl_search.agent_loop.ircot`).

Register them through the YAML this package ships and select them per row with `agent_name` `direct_agent`,
`cot_agent`, `rag_agent` (our preprocessing writes it for `--protocol direct|cot|rag`)::

    actor_rollout_ref.rollout.agent.agent_loop_config_path=$(verl-search config-path agent-loop)

One trajectory: the prompt (the row's messages through the chat template, or without one their contents joined
by a blank line, as FlashRAG joins its system and user prompts), then one model turn (mask 1), stopped at
`</answer>`, EOS or `max_tokens_per_turn`. RAG first searches the question (the same client as every loop:
retries, deadline, a failure becomes the text `search failed: ...` where the passages would be, never an
exception) and writes the passages into the prompt's `PASSAGES_SLOT`, cut by tokens to `max_obs_tokens` and to
what the prompt length leaves. The retrieval is recorded as a turn of its own before the model's (`generated`
empty, `query` the question, `observation` the passages as the prompt shows them), so `trajectories.jsonl`,
the report and its "gold visible" columns read it as they read an agent's search.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from verl_search.agent_loop.search_r1 import SearchR1AgentLoop, _Trajectory
from verl_search.agent_protocol.answers import extract_answer
from verl_search.agent_protocol.baselines import STOP, fill_passages
from verl_search.agent_protocol.tokens import observation_tokens
from verl_search.agent_protocol.vocabulary import ANSWERED, SEARCH_FAILED_PREFIX, SEARCH_TOOL
from verl_search.tools import client
from verl_search.tools.client import SearchOutcome, record_search
from verl_search.tools.formatting import format_results

logger = logging.getLogger(__name__)

#: prompt tokens left free around the passages for the chat template's tokenisation at their edges
PROMPT_MARGIN = 16

_warned: set[str] = set()


def _warn_once(key: str, message: str, *args) -> None:
    """Log `message` at warning level once per process for `key` (a loop is built per trajectory)."""
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)


class AnswerAgentLoop(SearchR1AgentLoop):
    """Direct answer and chain of thought: the row's prompt, then one model turn.

    Args (the YAML entry's keys; units in brackets):
        max_tokens_per_turn: generation limit of the turn [tokens] (default 500, Search-R1's).
        use_chat_template: `"auto"` (default: when the tokenizer has one), `True` or `False` (the messages'
            contents joined by a blank line).
        retrieval_service_url, topk, ...: any `SearchClientConfig` key, accepted (eval writes them into every
            entry) and unused here.
        **kwargs: verl's agent-loop arguments (config, server manager, tokenizer, ...).

    Trajectory fields: `num_searches` (0), `answered`, `turns` (one record).
    """

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        """Roll out one trajectory; see the module docstring."""
        request_id, trajectory = uuid4().hex, _Trajectory(self.response_length)
        prompt_ids = await self._prompt_ids(list(kwargs["raw_prompt"]))
        await self._answer_turn(request_id, prompt_ids, sampling_params, trajectory)
        return self._finish(prompt_ids, trajectory)

    async def _prompt_ids(self, messages: list[dict]) -> list[int]:
        if self.use_chat_template:
            return await self.ct_build_initial_tokens(messages)
        text = "\n\n".join(str(m["content"]) for m in messages if str(m.get("content", "")))
        return self._cap_text_prompt_length(self.tokenizer.encode(text))

    async def _answer_turn(self, request_id: str, prompt_ids: list[int], sampling_params: dict,
                           trajectory: _Trajectory) -> dict:
        """The model's turn, stopped at `</answer>` (or EOS, or the token limits)."""
        remaining = trajectory.remaining()
        return await self._model_turn(request_id, prompt_ids, sampling_params, remaining, trajectory, stops=list(STOP))

    def _finish(self, prompt_ids: list[int], trajectory: _Trajectory) -> AgentLoopOutput:
        """verl's output, with `answered` read from everything the model wrote."""
        written = self._decode([t for t, m in zip(trajectory.response_ids, trajectory.mask) if m == 1])
        trajectory.extra_fields[ANSWERED] = extract_answer(written) is not None
        return trajectory.output(prompt_ids, self.response_length)


class RAGAgentLoop(AnswerAgentLoop):
    """RAG: one retrieval with the question, its top-k passages in the prompt, then one model turn.

    Args (the YAML entry's keys; units in brackets), beside `AnswerAgentLoop`'s:
        retrieval_service_url, topk (default 3; a row's `tools_kwargs.search.create_kwargs.topk` overrides it),
            timeout [s], max_retries, deadline [s], ...: any `SearchClientConfig` key.
        max_obs_tokens: the passages in the prompt, at most [tokens] (default 500); the prompt length
            (`rollout.prompt_length`) bounds them too. A cut ends with ` ...(truncated)`.

    Raises (at rollout):
        ValueError: the row has no question (`tools_kwargs.search.create_kwargs.question` or
            `extra_info.question`, both written by preprocessing) or its prompt no `PASSAGES_SLOT`.
    """

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        """Roll out one trajectory; see the module docstring."""
        messages, question, topk = self._row(kwargs)
        request_id, trajectory = uuid4().hex, _Trajectory(self.response_length)
        retrieval = self._retrieval_turn(trajectory)
        outcome = await self._search(question, topk, retrieval, trajectory)
        passages = (format_results([question], outcome.hits)[0] + "\n" if outcome.ok
                    else SEARCH_FAILED_PREFIX + str(outcome.error))
        prompt_ids, shown, truncated = await self._fit_prompt(messages, passages, self.max_obs_tokens)
        retrieval.update(observation=shown, truncated=truncated)
        await self._answer_turn(request_id, prompt_ids, sampling_params, trajectory)
        return self._finish(prompt_ids, trajectory)

    def _row(self, kwargs: dict) -> tuple[list[dict], str, int]:
        """`(messages, question, topk)` of verl's row `kwargs`."""
        create = ((kwargs.get("tools_kwargs") or {}).get(SEARCH_TOOL) or {}).get("create_kwargs") or {}
        question = create.get("question") or (kwargs.get("extra_info") or {}).get("question")
        if not question:
            raise ValueError("the row has no question (tools_kwargs.search.create_kwargs.question or "
                             "extra_info.question): preprocess it with verl-search preprocess")
        return list(kwargs["raw_prompt"]), str(question), int(create.get("topk") or self.client_config.topk)

    @staticmethod
    def _retrieval_turn(trajectory: _Trajectory) -> dict:
        """A turn record for a retrieval the environment makes before the model's turn (nothing generated)."""
        record = {"generated": "", "generated_tokens": 0}
        trajectory.turns.append(record)
        return record

    async def _search(self, query: str, topk: int, record: dict, trajectory: _Trajectory) -> SearchOutcome:
        """Search `query` (never raises: a failure is `outcome.error`); counted in the trajectory's fields and
        named in `record` (`query`, `search_failed`)."""
        started = time.perf_counter()
        outcome = await client.search([query], self.client_config, topk=topk)
        trajectory.search_s += time.perf_counter() - started
        record_search(trajectory, outcome)
        record.update(query=query, search_failed=not outcome.ok)
        return outcome

    async def _fit_prompt(self, messages: list[dict], passages: str,
                          max_tokens: int | None) -> tuple[list[int], str, bool]:
        """The prompt ids of `messages` with `passages` in their slot, the passages cut by tokens to `max_tokens`
        (None: no limit of their own) and to what `rollout.prompt_length` leaves (less `PROMPT_MARGIN`).

        Returns:
            `(prompt_ids, passages as shown, truncated)`.
        """
        bare = await self._prompt_ids(fill_passages(messages, ""))
        room = self.rollout_config.prompt_length - len(bare) - PROMPT_MARGIN
        if max_tokens is not None:
            room = min(room, max_tokens)
        ids, truncated = observation_tokens(passages, self._encode, max(room, 0), prefix="", suffix="")
        shown = self._decode(ids) if truncated else passages
        if truncated:
            _warn_once(type(self).__name__, "%s: passages cut to %d tokens (max_obs_tokens %s, prompt_length %d); "
                       "raise --prompt-length to show more", type(self).__name__, max(room, 0), max_tokens,
                       self.rollout_config.prompt_length)
        return await self._prompt_ids(fill_passages(messages, shown)), shown, truncated
