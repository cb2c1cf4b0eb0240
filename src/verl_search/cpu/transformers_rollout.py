"""A transformers rollout for verl's trainer on the CPU: replica, server actor, in-worker adapter.

verl 0.9.1 generates through rollout *replicas* (`verl/workers/rollout/replica.py`): each replica
launches server actors; the agent loops call `server.generate.remote(prompt_ids=...,
sampling_params=..., request_id=...) -> TokenOutput` (`verl/workers/rollout/llm_server.py`); after
each update the trainer pushes weights through the `BaseRollout` adapter living in every trainer
worker (`verl/workers/engine_workers.py`, `update_weights`). vLLM and SGLang need a GPU; this is
the same contract on `TransformersEngine` (the one `verl-search eval` uses), registered as
rollout name `verl_search.cpu.names.ROLLOUT_NAME`:

* `TransformersReplica`: hybrid mode (the trainer's workers own the resources); one
  `TransformersRolloutServer` actor per replica, on the node of the replica's first worker, named
  `server_actor_name(replica_rank)`.
* `TransformersRolloutServer`: loads the model from `model.path`, batches concurrent `generate`
  calls into one `model.generate` (stop strings, EOS, `max_tokens`, temperature / top-p / top-k,
  log-probs when `calculate_log_probs`), takes weights with `update_weights`; for verl's asynchronous
  trainers (partial rollout) it aborts running turns (`abort_all_requests`: the tokens so far, stop reason
  `aborted`, which verl's `FullyAsyncLLMServerClient` resumes) and holds new ones until `resume_generation`.
  Each output's `extra_fields["global_steps"]` is the trainer's step of the weights that generated it (as
  verl's vLLM server reports it; before the first update, or where no step came, the count of updates).
  Sleep / wake-up / KV-cache calls are no-ops: nothing to free on a CPU.
* `TransformersServerAdapter`: in each trainer worker; sends the trainer's full tensors to its
  replica's server (through Ray's object store) after every update.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import ray
import torch

from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from verl_search.cpu.names import ROLLOUT_NAME

logger = logging.getLogger(__name__)

MAX_BATCH_SIZE = 64
"""Most requests the server batches into one `generate` (also capped by `rollout.max_num_seqs`)."""


def server_actor_name(replica_rank: int) -> str:
    """The Ray actor name of replica `replica_rank`'s server (the adapter finds it by name)."""
    return f"verl_search_cpu_rollout_server_{replica_rank}"


def weights_checksum(named_tensors) -> float:
    """Sum of all weights in float64, tensors taken in name order: the same weights give the same
    number wherever it is computed (a checkpoint, the trainer, this server's log)."""
    return float(sum(tensor.detach().double().sum().item() for _, tensor in sorted(named_tensors, key=lambda p: p[0])))


def default_max_tokens(config, prompt_length: int) -> int:
    """New tokens allowed when a request names no `max_tokens` (SGLang server's rule in verl):
    `min(response_length, prompt_length + response_length - len(prompt))`, at least 0."""
    return max(0, min(config.response_length, config.prompt_length + config.response_length - prompt_length))


class TransformersRolloutServer:
    """One replica's generation server (a Ray actor): `TransformersEngine` over `model.path`.

    Args:
        config: verl's `RolloutConfig` (`response_length`, `prompt_length`, `max_num_seqs` are read).
        model_config: verl's `HFModelConfig` (`local_path`, `trust_remote_code`).
        replica_rank: this replica's rank (logs only).
        num_threads: torch threads for generation (default: every core; Ray starts actors with 1).
    """

    def __init__(self, config, model_config, replica_rank: int, num_threads: int | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig

        from verl_search.llm.engines import TransformersEngine

        torch.set_num_threads(num_threads or os.cpu_count() or 1)
        # the replica hands over the model section as a DictConfig (as to SGLang's server)
        model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.config = config
        self.replica_rank = replica_rank
        path = model_config.local_path
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=model_config.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                     trust_remote_code=model_config.trust_remote_code)
        batch = max(1, min(MAX_BATCH_SIZE, int(getattr(config, "max_num_seqs", MAX_BATCH_SIZE) or MAX_BATCH_SIZE)))
        self.engine = TransformersEngine(model, tokenizer, max_batch_size=batch)
        self._steps: dict[int, int] = {}  # engine weight version -> the trainer's step of those weights
        logger.info("rollout server %d: %s loaded from %s, batches of up to %d", replica_rank,
                    type(model).__name__, path, batch)

    async def generate(self, prompt_ids, sampling_params: dict[str, Any], request_id: str,
                       image_data=None, video_data=None, **kwargs) -> TokenOutput:
        """One turn: token ids in, `TokenOutput` (token ids, log-probs if asked) out."""
        if image_data is not None or video_data is not None:
            raise NotImplementedError("the CPU transformers rollout serves text-only models")
        prompt_ids = [int(t) for t in (prompt_ids.tolist() if hasattr(prompt_ids, "tolist") else prompt_ids)]
        params = dict(sampling_params)
        requested = params.pop("max_new_tokens", None) or params.get("max_tokens")
        limit = default_max_tokens(self.config, len(prompt_ids))
        params["max_tokens"] = min(int(requested), limit) if requested else limit
        if params["max_tokens"] == 0:
            return TokenOutput(token_ids=[], log_probs=[] if params.get("logprobs") else None, stop_reason="completed",
                               extra_fields={"global_steps": self._steps.get(self.weight_updates, self.weight_updates)})
        output = await self.engine.generate(request_id, prompt_ids=prompt_ids, sampling_params=params)
        version = output.extra_fields.pop("weight_version")
        output.extra_fields["global_steps"] = self._steps.get(version, version)
        return output

    @property
    def weight_updates(self) -> int:
        """Weight updates loaded so far."""
        return self.engine.weight_version

    async def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]],
                             global_steps: int | None = None) -> int:
        """Load the trainer's tensors (names as in the model's `state_dict`) of trainer step `global_steps`;
        returns how many."""
        loaded = await asyncio.to_thread(self.engine.load_weights, named_tensors)
        if global_steps is not None:
            self._steps[self.engine.weight_version] = int(global_steps)
        logger.info("rollout server %d: weight update %d, %d tensors, checksum %.10e", self.replica_rank,
                    self.weight_updates, loaded, weights_checksum(named_tensors))
        return loaded

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict[str, Any]:
        """Partial rollout: stop the running turns (answered with their tokens so far, stop reason `aborted`)
        and hold new requests until `resume_generation` (answer them `aborted` at once with `reject_request`);
        `{"aborted_count": n}` as verl's vLLM server (`vllm_async_server.py`, `abort_all_requests`)."""
        return {"aborted_count": await self.engine.abort(reject=reject_request)}

    async def resume_generation(self) -> None:
        """Admit requests again after `abort_all_requests`."""
        self.engine.resume()

    async def stats(self) -> dict[str, int]:
        """Counters: `batches`, `requests`, `weight_updates`, and `batch_steps` (tokens the running batch
        has generated so far, 0 when idle)."""
        return {"batches": self.engine.batches, "requests": self.engine.requests,
                "weight_updates": self.weight_updates, "batch_steps": self.engine.batch_steps}

    async def _noop(self, *args, **kwargs) -> None:
        return None

    # nothing to free or pause on a CPU: the model stays in host memory between steps
    wake_up = sleep = clear_kv_cache = release_kv_cache = resume_kv_cache = _noop
    start_profile = stop_profile = _noop


class TransformersReplica(RolloutReplica):
    """verl rollout replica served by `TransformersRolloutServer` (hybrid mode only)."""

    async def launch_servers(self):
        """Start this replica's server actor beside its first worker and wait until it is loaded."""
        if not self.workers:
            raise RuntimeError(f"{ROLLOUT_NAME} supports verl's hybrid mode only (actor_rollout_ref.hybrid_engine"
                               "=true): the trainer's workers hold the resources the rollout runs on")
        node_id = await self.workers[0].__ray_call__.remote(lambda worker: ray.get_runtime_context().get_node_id())
        server = ray.remote(TransformersRolloutServer).options(
            name=server_actor_name(self.replica_rank),
            num_cpus=0,
            max_concurrency=self.max_concurrency,
            scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node_id=node_id,
                                                                                             soft=False),
        ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        await server.stats.remote()  # raises here if the model failed to load
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"ray://{server_actor_name(self.replica_rank)}"


class TransformersServerAdapter(BaseRollout):
    """In-worker side of the rollout: pushes the trainer's weights to its replica's server.

    Each trainer rank belongs to replica `rank // rollout_world_size`; the rank that is tensor
    parallel rank 0 of its replica sends, every rank consumes the weight generator (FSDP gathers
    full tensors collectively).
    """

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1, **kwargs):
        super().__init__(config, model_config, device_mesh)
        world = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                 * self.config.pipeline_model_parallel_size)
        rank = int(os.environ.get("RANK", 0))
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.sends = rank % world == 0
        self._server = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(self, weights, wire_format: str = "named_tensors", global_steps: int | None = None,
                             **kwargs):
        """Send `(name, tensor)` pairs and the trainer's step to the server; raises `NotImplementedError` for
        other wire formats."""
        if wire_format != "named_tensors":
            raise NotImplementedError(f"{ROLLOUT_NAME} takes full named tensors, not {wire_format!r}")
        named = [(name, tensor.detach().to("cpu", copy=True).contiguous()) for name, tensor in weights]
        if self.sends:
            await self._server_handle().update_weights.remote(named, global_steps=global_steps)
