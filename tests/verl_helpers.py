"""Helpers to run verl's real `AgentLoopWorker` on the CPU.

`ScriptedLLM` stands in for verl's rollout engine (SGLang / vLLM servers need a GPU): it answers
`generate(prompt_ids, sampling_params)` with fixed text for each turn of a trajectory, tokenised
with the real tokenizer, and records what it was asked. Everything else is verl's own code.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from verl.workers.rollout.replica import TokenOutput

from tests.conftest import QWEN_TOKENIZER  # noqa: F401  (re-exported for tests)
from verl_search.verl_config.compose import compose_verl_config


class ScriptedLLM:
    """A stand-in LLM client: `script(prompt_text, turn) -> reply text` (turn counts from 0).

    Attributes:
        calls: `(request_id, prompt_text, sampling_params, reply_ids)` per `generate` call.
    """

    def __init__(self, tokenizer, script: Callable[[str, int], str]):
        self.tokenizer = tokenizer
        self.script = script
        self.turns: dict[str, int] = defaultdict(int)
        self.calls: list[tuple] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        prompt_text = self.tokenizer.decode(prompt_ids)
        turn = self.turns[request_id]
        self.turns[request_id] += 1
        reply_ids = self.tokenizer.encode(self.script(prompt_text, turn), add_special_tokens=False)
        self.calls.append((request_id, prompt_text, dict(sampling_params), reply_ids))
        return TokenOutput(token_ids=reply_ids, num_preempted=0, stop_reason="completed")


def tool_agent_config(model_dir, data_file, *extra: str):
    """verl's trainer config for the tool-call protocol with our SearchTool and reward."""
    from verl_search.verl_config.shipped import config_path

    return compose_verl_config([
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.rollout.name=sglang",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={config_path('tool')}",
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=3000",
        "actor_rollout_ref.rollout.prompt_length=1024",
        "actor_rollout_ref.rollout.response_length=1024",
        f"data.train_files={data_file}",
        f"data.val_files={data_file}",
        f"data.tool_config_path={config_path('tool')}",
        "reward.custom_reward_function.path=pkg://verl_search.rewards",
        "reward.custom_reward_function.name=compute_score",
        *extra,
    ])


def tag_agent_config(model_dir, data_file, agent_loop_yaml, response_length: int = 3000):
    """verl's trainer config for our tag-protocol agent loops (Search-R1, ReSearch) registered through
    `agent_loop_yaml`, with our reward."""
    return compose_verl_config([
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.rollout.name=sglang",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loop_yaml}",
        "actor_rollout_ref.rollout.prompt_length=1024",
        f"actor_rollout_ref.rollout.response_length={response_length}",
        f"data.train_files={data_file}", f"data.val_files={data_file}",
        "reward.custom_reward_function.path=pkg://verl_search.rewards",
        "reward.custom_reward_function.name=compute_score",
    ])


def row_tokens(output, i: int) -> tuple[list[int], list[int]]:
    """`(response ids, response mask)` of row `i` of an agent-loop output batch, without padding."""
    length = int(output.batch["attention_mask"][i, output.batch["prompts"].shape[1]:].sum())
    return output.batch["responses"][i, :length].tolist(), output.batch["response_mask"][i, :length].tolist()


def calls_for(llm: "ScriptedLLM", question: str) -> list[tuple]:
    """The `ScriptedLLM` calls of the trajectory whose first prompt holds `question`, in order."""
    request = next(c[0] for c in llm.calls if question in c[1])
    return [c for c in llm.calls if c[0] == request]
