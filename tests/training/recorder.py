"""Test-only instrumentation through verl's public hook `rollout.agent.agent_loop_manager_class`:
the agent-loop manager of verl's v1 trainer, whose workers also append every *training* sample
they put into TransferQueue (the batch the trainer updates on) to `$VERL_SEARCH_TEST_RECORD` as
JSON lines: TransferQueue key, prompt and response token ids, response_mask, the rollout's log-probs (where
the run asks for them), reward and extra fields. Nothing else changes.

Imported inside Ray workers: the test puts the repository root on PYTHONPATH (no package lives
there in the src layout, so `verl_search` still comes from the install).
"""

from __future__ import annotations

import json
import os

import ray
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

RECORD_ENV = "VERL_SEARCH_TEST_RECORD"


def _plain(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


class RecordingWorker(AgentLoopWorkerTQ.__ray_metadata__.modified_class):
    async def _agent_loop_postprocess(self, output, validate, **kwargs):
        result = await super()._agent_loop_postprocess(output, validate, **kwargs)
        if not validate:
            with open(os.environ[RECORD_ENV], "a", encoding="utf-8") as record:
                for i, item in enumerate(output if isinstance(output, list) else [output]):
                    record.write(json.dumps({
                        "key": f"{kwargs['uid']}_{kwargs['session_id']}_{i}",  # its TransferQueue key
                        "global_steps": _plain(kwargs.get("global_steps")),
                        "prompt_ids": list(item.prompt_ids),
                        "response_ids": list(item.response_ids),
                        "response_mask": list(item.response_mask),
                        "response_logprobs": _plain(item.response_logprobs),
                        "reward_score": item.reward_score,
                        "extra_fields": _plain({k: v for k, v in item.extra_fields.items()
                                                if k in ("num_searches", "failed_searches", "reward_extra_info",
                                                         "turns", "answered", "invalid_actions")}),
                    }) + "\n")
        return result


class RecordingAgentLoopManager(AgentLoopManagerTQ):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = ray.remote(RecordingWorker)
