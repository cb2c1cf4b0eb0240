"""`SearchR1AgentLoop`: the Search-R1 paper's plain-text protocol as a verl agent loop.

Register it through the YAML this package ships (verl takes no `pkg://` there)::

    actor_rollout_ref.rollout.agent.agent_loop_config_path=$(verl-search config-path agent-loop)

and select it per row with `agent_name: search_r1_agent` (our preprocessing writes it for
`--protocol search_r1`). Settings are the YAML entry's keys (copy the YAML to change them); the
service URL also comes from `$VERL_SEARCH_URL`.

One trajectory: the prompt (chat template for the first message only, or the raw text for base
models), then up to `max_turns` rounds of *model turn* (stopped at `</search>` or `</answer>`,
mask 1) + *observation* (`<information>` block or Search-R1's correction message, mask 0), then
one last model turn to answer. Everything after the prompt is one long response, as in Search-R1.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

from verl_search.agent_protocol.tokens import cut_at_first_stop, observation_tokens
from verl_search.agent_protocol.trajectory import ResponseTokens
from verl_search.agent_protocol.vocabulary import (
    ANSWERED,
    FAILED_SEARCHES,
    INVALID_ACTION_MESSAGE,
    INVALID_ACTIONS,
    LAST_SEARCH_NOTICE,
    NUM_SEARCHES,
    SEARCH_FAILED_PREFIX,
    SEARCH_TOOL,
    STOP_STRINGS,
    TURNS,
    parse_action,
)
from verl_search.tools import client
from verl_search.tools.client import record_search
from verl_search.tools.formatting import information_tokens
from verl_search.verl_config.version import check_verl_version

logger = logging.getLogger(__name__)


class _Trajectory(ResponseTokens):
    """Token buffers (`agent_protocol.trajectory.ResponseTokens`, the builder the cold start uses too) and counters of
    one rollout (also what `record_search` updates)."""

    def __init__(self, response_length: int):
        super().__init__(response_length)
        self.turns: list[dict] = []
        self.extra_fields: dict[str, Any] = {NUM_SEARCHES: 0, FAILED_SEARCHES: 0, INVALID_ACTIONS: 0,
                                             ANSWERED: False}
        self.generate_s = 0.0
        self.search_s = 0.0

    def output(self, prompt_ids: list[int], response_length: int) -> AgentLoopOutput:
        """verl's `AgentLoopOutput` of this trajectory, cut to `response_length` tokens."""
        self.extra_fields[TURNS] = self.turns
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=self.response_ids[:response_length],
            response_mask=self.mask[:response_length],
            response_logprobs=self.logprobs[:response_length] if self.logprobs else None,
            num_turns=1 + sum(1 + ("observation" in t) for t in self.turns),
            metrics={"generate_sequences": self.generate_s, "tool_calls": self.search_s},
            extra_fields={**self.extra_fields, "turn_scores": [], "tool_rewards": []},
        )


class SearchR1AgentLoop(AgentLoopBase):
    """Search-R1 tag-protocol agent loop.

    Args (the YAML entry's keys; units in brackets):
        retrieval_service_url, topk, timeout [s], max_retries, deadline [s], max_concurrency, ...:
            any `verl_search.tools.client.SearchClientConfig` key, with its defaults: the same
            client as `SearchTool`.
        max_turns: searches allowed (default 4, the paper's; the shipped YAML sets 2, Search-R1's
            scripts'); invalid actions count as turns. After the last one the model gets one more turn
            to answer.
        last_search_notice: append `LAST_SEARCH_NOTICE` ("no more searches are allowed") to the last
            observation (default False: Search-R1's observation is the passages only,
            `search_r1/llm_agent/generation.py`).
        max_tokens_per_turn: generation limit per model turn [tokens] (default 500, Search-R1's).
        max_obs_tokens: observation limit [tokens] (default 500); the closing `</information>`
            is always kept.
        max_chars_per_passage: cut each passage's text [characters] (default: no cut).
        min_tokens_after_observation: an observation is shortened so that at least this many
            response tokens remain for the model (default 64).
        use_chat_template: `"auto"` (default: when the tokenizer has one), `True` or `False`
            (base models: the prompt is the raw Search-R1 text).
        **kwargs: verl's agent-loop arguments (config, server manager, tokenizer, ...).
    """

    def __init__(
        self,
        *args,
        max_turns: int = 4,
        last_search_notice: bool = False,
        max_tokens_per_turn: int = 500,
        max_obs_tokens: int = 500,
        max_chars_per_passage: int | None = None,
        min_tokens_after_observation: int = 64,
        use_chat_template: bool | str = "auto",
        **kwargs,
    ):
        check_verl_version()  # verl's agent-loop internals change between releases: fail here, not mid-rollout
        client_keys = set(client.SearchClientConfig.__dataclass_fields__)
        self.client_config = client.SearchClientConfig(**{k: kwargs.pop(k) for k in list(kwargs) if k in client_keys})
        super().__init__(*args, **kwargs)
        if max_turns < 0 or max_tokens_per_turn < 1 or max_obs_tokens < 1:
            raise ValueError(f"max_turns={max_turns} must be >= 0, token limits >= 1")
        self.max_turns = max_turns
        self.last_search_notice = bool(last_search_notice)
        self.max_tokens_per_turn = max_tokens_per_turn
        self.max_obs_tokens = max_obs_tokens
        self.max_chars_per_passage = max_chars_per_passage
        self.min_tokens_after_observation = min_tokens_after_observation
        if use_chat_template == "auto":
            use_chat_template = bool(getattr(self.tokenizer, "chat_template", None))
        self.use_chat_template = bool(use_chat_template)
        self.response_length = self.rollout_config.response_length

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    async def _prompt_ids(self, messages: list[dict]) -> list[int]:
        if self.use_chat_template:
            return await self.ct_build_initial_tokens(messages)
        text = "".join(str(m["content"]) for m in messages)
        return self._cap_text_prompt_length(self.tokenizer.encode(text))

    async def _start(self, kwargs: dict) -> tuple[list[int], int, str, _Trajectory]:
        """`(prompt_ids, topk, request_id, trajectory)` of a new rollout of verl's row `kwargs` (a row's
        `tools_kwargs.search.create_kwargs.topk` overrides the loop's top-k)."""
        prompt_ids = await self._prompt_ids(list(kwargs["raw_prompt"]))
        create_kwargs = (kwargs.get("tools_kwargs") or {}).get(SEARCH_TOOL, {}).get("create_kwargs", {}) or {}
        topk = int(create_kwargs.get("topk") or self.client_config.topk)
        return prompt_ids, topk, uuid4().hex, _Trajectory(self.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        """Roll out one trajectory; see the class docstring for the protocol."""
        prompt_ids, topk, request_id, trajectory = await self._start(kwargs)
        for turn in range(self.max_turns + 1):
            remaining = trajectory.remaining()
            if remaining <= 0:
                break
            record = await self._model_turn(request_id, prompt_ids, sampling_params, remaining, trajectory)
            action = parse_action(record["generated"])
            if action.kind == "answer":
                trajectory.extra_fields[ANSWERED] = True
                break
            if turn == self.max_turns:
                break  # the last turn was for answering
            if not await self._observe(action, topk, turn == self.max_turns - 1, record, trajectory):
                break  # no room left for an observation
        return trajectory.output(prompt_ids, self.response_length)

    async def _model_turn(self, request_id, prompt_ids, sampling_params, remaining, trajectory,
                          stops: list[str] = STOP_STRINGS, end_ids: frozenset[int] = frozenset()) -> dict:
        """One model turn, cut at its first stop string, or after its first token of `end_ids` (kept)."""
        params = {**sampling_params, "stop": list(stops), "max_tokens": min(self.max_tokens_per_turn, remaining)}
        started = time.perf_counter()
        output = await self.server_manager.generate(
            request_id=request_id, prompt_ids=prompt_ids + trajectory.response_ids, sampling_params=params
        )
        trajectory.generate_s += time.perf_counter() - started
        _track_weight_versions(trajectory.extra_fields, output.extra_fields)
        ids = list(output.token_ids)
        first_end = next((i for i, token in enumerate(ids) if token in end_ids), None)
        ids = cut_at_first_stop(ids if first_end is None else ids[: first_end + 1], self._decode, list(stops))
        ids = ids[:remaining]
        trajectory.add_model_turn(ids, output.log_probs)
        record = {"generated": self._decode(ids), "generated_tokens": len(ids), **_turn_versions(output.extra_fields)}
        trajectory.turns.append(record)
        return record

    async def _observe(self, action, topk: int, last: bool, record: dict, trajectory: _Trajectory) -> bool:
        """Append the environment's answer to a non-final turn; False if it does not fit."""
        budget = trajectory.observation_budget(self.max_obs_tokens, self.min_tokens_after_observation)
        notice = LAST_SEARCH_NOTICE if last and self.last_search_notice else ""
        if action.kind == "search":
            started = time.perf_counter()
            outcome = await client.search([action.content], self.client_config, topk=topk)
            trajectory.search_s += time.perf_counter() - started
            record_search(trajectory, outcome)
            if outcome.ok:
                ids, truncated = information_tokens(action.content, outcome.hits[0], self._encode, budget, notice,
                                                    self.max_chars_per_passage)
            else:
                ids, truncated = observation_tokens(SEARCH_FAILED_PREFIX + outcome.error, self._encode, budget, notice)
            record.update(query=action.content, search_failed=not outcome.ok, truncated=truncated)
        else:
            trajectory.extra_fields[INVALID_ACTIONS] += 1
            ids = self._encode(INVALID_ACTION_MESSAGE + (notice.strip() + "\n" if notice else ""))
            if len(ids) > trajectory.remaining() - self.min_tokens_after_observation:
                ids = []
        if not ids:
            return False
        trajectory.add_observation(ids)
        record["observation"] = self._decode(ids)
        return True


def _turn_versions(output_fields: dict) -> dict:
    """The weight versions one model turn was generated with: `{"min_global_steps", "max_global_steps"}`
    where verl's client reports them (they differ when an asynchronous trainer's weight update aborted the
    turn and verl's `FullyAsyncLLMServerClient` resumed it under the new weights), else `{}`."""
    return {key: output_fields[key] for key in ("min_global_steps", "max_global_steps")
            if output_fields.get(key) is not None}


def _track_weight_versions(fields: dict, output_fields: dict) -> None:
    """Keep the weight versions a trajectory was generated with, as verl's `ToolAgentLoop` does:
    the first turn's `min_global_steps`, the last turn's `max_global_steps` (verl's LLM client sets
    both on every output; the v1 trainer reads them from the trajectory to measure staleness)."""
    if "min_global_steps" not in fields and "min_global_steps" in output_fields:
        fields["min_global_steps"] = output_fields["min_global_steps"]
    if output_fields.get("max_global_steps") is not None:
        fields["max_global_steps"] = output_fields["max_global_steps"]
