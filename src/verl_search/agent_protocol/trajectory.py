"""`ResponseTokens`: the response of one trajectory, built turn by turn, as every agent loop of ours builds it
and as the cold start builds its supervised trajectories (`verl_search.training.trajectories.trajectory_tokens`):
one builder, so the cold start's token sequences cannot drift from what the loops produce.

A response is everything after the prompt (Search-R1's one long response): model turns, whose tokens carry
mask 1 (trained on; `response_mask` in RL, `loss_mask` in SFT), and the environment's observations, mask 0. An
observation gets at most `observation_budget` tokens: the protocol's per-observation cap, and no more than
leaves `min_tokens_after_observation` tokens of the response for the model's next turn. Standard library only.
"""

from __future__ import annotations


class ResponseTokens:
    """Token ids, mask and (where the engine returned them) log-probabilities of a trajectory's response.

    Args:
        response_length: the response budget [tokens] (verl's `rollout.response_length`; the cold start's
            `ColdStartOptions.response_length`); turns are added as they come, and cut by the caller.

    Attributes:
        response_ids, mask: equal-length lists; mask 1 on model turns, 0 on observations.
        logprobs: per-token log-probabilities, `None` until a model turn brings some (then 0.0 on every
            token before it and on every observation token).
    """

    def __init__(self, response_length: int):
        self.response_length = response_length
        self.response_ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] | None = None

    def remaining(self) -> int:
        """Response tokens still free (<= 0 when the response is full)."""
        return self.response_length - len(self.response_ids)

    def observation_budget(self, max_obs_tokens: int, min_tokens_after_observation: int = 0) -> int:
        """Tokens the next observation may take: at most `max_obs_tokens`, and what leaves
        `min_tokens_after_observation` for the model's next turn (may be <= 0: no room)."""
        return min(max_obs_tokens, self.remaining() - min_tokens_after_observation)

    def add_model_turn(self, ids: list[int], logprobs: list[float] | None = None) -> None:
        """Append a model turn (mask 1) and, when given, its log-probabilities (cut to `ids`)."""
        self._append(ids, 1, logprobs)

    def add_observation(self, ids: list[int]) -> None:
        """Append an observation of the environment (mask 0; log-probability 0.0)."""
        self._append(ids, 0, None)

    def _append(self, ids: list[int], mask_value: int, logprobs: list[float] | None) -> None:
        self.response_ids += ids
        self.mask += [mask_value] * len(ids)
        if logprobs is not None and self.logprobs is None:
            self.logprobs = [0.0] * (len(self.response_ids) - len(ids))
        if self.logprobs is not None:
            self.logprobs += logprobs[: len(ids)] if logprobs is not None else [0.0] * len(ids)
