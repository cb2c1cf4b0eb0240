"""`ReSearchAgentLoop`: the ReSearch protocol (`verl_search.agent_protocol.research`) as a verl agent loop.

Register it through the YAML this package ships and select it per row with
`agent_name: research_agent` (our preprocessing writes it for `--protocol research`)::

    actor_rollout_ref.rollout.agent.agent_loop_config_path=$(verl-search config-path agent-loop)

One trajectory, as ReSearch's `vLLMRolloutWithSearch` (branch `re-search`,
`src/verl/workers/rollout/vllm_rollout/vllm_rollout.py`) rolls it out: the prompt (the chat
template on ReSearch's system prompt and the question, or ReSearch's base-model text), then model
turns stopped at `</search>` (mask 1), each followed by ` <result>\\n{passages}\\n</result>` (mask
0), until the model stops with EOS or the response is `response_length` tokens long. The query is
the text between the turn's last `<search>` and `</search>`; the passages are the top 5 of the
retrieval service, their `contents` joined by blank lines. What ReSearch does not have and we add,
all off by default except where said: a cap on searches (`max_searches`), per-turn and
per-observation token limits, a failed search answered with `search failed: ...` instead of a
crash, and a turn cut at the first `</search>` token-exactly (engines may overshoot a stop string).
"""

from __future__ import annotations

import time
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from verl_search.agent_loop.search_r1 import SearchR1AgentLoop, _Trajectory
from verl_search.llm.models import end_of_sequence_ids
from verl_search.agent_protocol import research
from verl_search.agent_protocol.vocabulary import ANSWERED, ENDED_WITH_EOS, SEARCH_FAILED_PREFIX
from verl_search.tools import client
from verl_search.tools.client import record_search

_NO_LIMIT = 10**9


class ReSearchAgentLoop(SearchR1AgentLoop):
    """ReSearch agent loop.

    Args (the YAML entry's keys; units in brackets):
        retrieval_service_url, topk (default 5, ReSearch's), timeout [s], max_retries, deadline [s], ...:
            any `verl_search.tools.client.SearchClientConfig` key: the same client as `SearchTool`.
        max_searches: searches allowed in one trajectory (default None: no cap, as ReSearch; the
            response length bounds them). The turn after the last allowed search ends the trajectory
            if it searches again.
        max_tokens_per_turn: generation limit per model turn [tokens] (default None: what is left of
            `response_length`, as ReSearch).
        max_obs_tokens: limit per `<result>` block [tokens] (default None: what is left of the
            response; ReSearch cuts the whole response there). A cut block keeps its `</result>`.
        use_chat_template: `"auto"` (default: when the tokenizer has one), `True` (the row's system
            prompt and question through the chat template) or `False` (base models: ReSearch's
            base-model text around the row's question, tokenised without special tokens as ReSearch's
            `add_special_tokens=False`: `agent_protocol.research.base_prompt_ids`).
        **kwargs: verl's agent-loop arguments (config, server manager, tokenizer, ...).

    Trajectory fields: `num_searches`, `failed_searches`, `answered` (a `\\boxed{}` answer was
    written), `ended_with_eos` (the reward's over-length rule: the last token is an EOS of
    `llm.models.end_of_sequence_ids`), `turns` (one record per model turn).
    """

    def __init__(self, *args, max_searches: int | None = None, max_tokens_per_turn: int | None = None,
                 max_obs_tokens: int | None = None, **kwargs):
        kwargs.setdefault("topk", research.TOPK)
        super().__init__(*args, max_turns=_NO_LIMIT if max_searches is None else max_searches,
                         max_tokens_per_turn=max_tokens_per_turn or _NO_LIMIT,
                         max_obs_tokens=max_obs_tokens or _NO_LIMIT, min_tokens_after_observation=0, **kwargs)
        self.eos_ids = frozenset(end_of_sequence_ids(self.tokenizer, self.config.actor_rollout_ref.model.get("path")))

    async def _prompt_ids(self, messages: list[dict]) -> list[int]:
        if self.use_chat_template:
            return await self.ct_build_initial_tokens(messages)
        question = next(str(m["content"]) for m in reversed(messages) if m["role"] == "user")
        # without special tokens, as ReSearch tokenises (no BOS added for Llama-style tokenizers)
        return self._cap_text_prompt_length(research.base_prompt_ids(self.tokenizer, question))

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        """Roll out one trajectory; see the module docstring for the protocol."""
        prompt_ids, topk, request_id, trajectory = await self._start(kwargs)
        trajectory.extra_fields[ENDED_WITH_EOS] = False
        searches = 0
        while (remaining := trajectory.remaining()) > 0:
            record = await self._turn(request_id, prompt_ids, sampling_params, remaining, trajectory)
            action = research.parse_action(record["generated"])
            record["action"] = action.kind  # what `search/valid_turns/share` counts (the turn's own protocol)
            if action.kind != "search" or searches >= self.max_turns:
                break  # EOS, the length limit, or a search past the cap: the trajectory ends
            searches += 1
            if not await self._result(action.content, topk, record, trajectory):
                break  # no room left for the result
        text = self._decode([t for t, m in zip(trajectory.response_ids, trajectory.mask) if m == 1])
        trajectory.extra_fields[ANSWERED] = research.extract_answer(text) is not None
        return trajectory.output(prompt_ids, self.response_length)

    async def _turn(self, request_id, prompt_ids, sampling_params, remaining, trajectory) -> dict:
        """One model turn, cut at its first `</search>` or EOS (kept, as ReSearch keeps it)."""
        record = await self._model_turn(request_id, prompt_ids, sampling_params, remaining, trajectory,
                                        stops=list(research.STOP), end_ids=self.eos_ids)
        ids = trajectory.response_ids
        trajectory.extra_fields[ENDED_WITH_EOS] = bool(record["generated_tokens"]) and ids[-1] in self.eos_ids
        return record

    async def _result(self, query: str, topk: int, record: dict, trajectory: _Trajectory) -> bool:
        """Search `query` and append its `<result>` block; False if it does not fit."""
        budget = trajectory.observation_budget(self.max_obs_tokens, self.min_tokens_after_observation)
        started = time.perf_counter()
        outcome = await client.search([query], self.client_config, topk=topk)
        trajectory.search_s += time.perf_counter() - started
        record_search(trajectory, outcome)
        ids, truncated = (research.passages_result_tokens(outcome.hits[0], self._encode, budget) if outcome.ok
                          else research.result_tokens(SEARCH_FAILED_PREFIX + outcome.error, self._encode, budget))
        record.update(query=query, search_failed=not outcome.ok, truncated=truncated)
        if not ids:
            return False
        trajectory.add_observation(ids)
        record["observation"] = self._decode(ids)
        return True

