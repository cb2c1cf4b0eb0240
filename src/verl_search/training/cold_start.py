"""The cold start: supervised search-then-answer trajectories, trained with verl's own SFT trainer.

SmolLM2-135M-Instruct, prompted with Search-R1's instructions, does not close a `<search>` or
`<answer>` tag on its own, so every rollout of a GRPO step scores 0, every group advantage is 0 and
RL has no signal. DeepSeek-R1 (arXiv 2501.12948, section 2.3.1) calls the small supervised warm-up
that fixes this a "cold start".

A trajectory is built with the agent loops' own builder (`trajectory_tokens`: `agent_protocol.trajectory.
ResponseTokens`, the observation functions `tools.formatting.information_tokens` and
`agent_protocol.research.passages_result_tokens`), so it is token for token what `SearchR1AgentLoop` builds:
the prompt through verl's Continuous Token builder (the agent loop's `ct_build_initial_tokens`),
the model turn `<think> .. </think>\\n<search> QUESTION </search>`, the observation of the real
retriever's top-k passages framed by the agent loop's own `observation_tokens` (with the
last-search notice when the protocol allows one search), then `<think> .. </think>\\n<answer>
GOLD </answer>`. For the ReSearch protocol (`protocol="research"`) it is built as `ReSearchAgentLoop`
builds one: `<think> .. </think> <search> QUESTION </search>`, the passages in ` <result>\n...\n</result>`,
then `<think> .. </think> <answer> \\boxed{GOLD} </answer>` and the model's end-of-sequence token (ReSearch's
reward scores a response that did not stop by itself 0). Only the two model turns carry `loss_mask` 1: prompt
and observation tokens are masked, as `response_mask` masks them in RL. Only training questions whose gold answer is
visible in the observation exactly as the agent loop renders it (same tokenizer, same cut to `max_obs_tokens`) are used
(`visible_rows`): a trajectory whose gold is in the full top-k passages but cut out of the observation would teach
the model to answer what it cannot see, i.e. to guess.

Training: `python -m torch.distributed.run --nproc_per_node=1 -m verl.trainer.sft_trainer` on the CPU
with verl_search's CPU plugin, reading the trajectories through `data.custom_cls` =
`SearchTrajectoryDataset` (this module), saving a Hugging Face folder (`hf_model` checkpoint
content).
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from verl_search.training.trajectories import (  # noqa: F401 (re-exported: the cold start's callers read them here)
    ANSWER_TURN,
    RESEARCH_ANSWER_TURN,
    RESEARCH_SEARCH_TURN,
    SEARCH_TURN,
    SECOND_SEARCH_TURN,
    gold_visible,
    observation_text,
    trajectory_tokens,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ColdStartOptions:
    """What `run_cold_start` trains on and how (`verl-search quickstart` builds it from its flags).

    Attributes:
        examples: trajectories, at most (training questions whose gold answer is visible in the observation the
            agent loop renders: `visible_rows`; as many candidates are examined as it takes to find them).
        epochs: passes of verl's SFT trainer over them; batch_size: trajectories per step; lr: learning rate.
        protocol: `search_r1` or `research` (the trajectory's tags and answer form).
        topk: passages per search; max_turns, max_obs_tokens: the protocol's limits the agent loop applies.
        response_length: the response budget in tokens (prompt excluded) a trajectory must fit (the
            quickstart's: max_turns x (tokens per turn + max_obs_tokens) + tokens per turn).
        second_hop: of `examples`, trajectories with a second search (`training.second_hop.second_hop_rows`; 0:
            none); the rest show the gold after one search (`visible_rows`).
        seed: of the order in which candidate questions are drawn.
        dtype: what the SFT trainer computes in: `float32` (default) or `bfloat16` (FSDP mixed precision,
            fp32 master weights; `cpu.precision`).
    """

    examples: int = 32
    epochs: int = 2
    batch_size: int = 4
    lr: float = 1e-4
    protocol: Literal["search_r1", "research"] = "search_r1"
    topk: int = 3
    max_turns: int = 2
    max_obs_tokens: int = 160
    response_length: int = 512
    second_hop: int = 0
    seed: int = 0
    dtype: Literal["float32", "bfloat16"] = "float32"

    def trajectory_settings(self, tokenizer, model: str | os.PathLike) -> dict:
        """`trajectory_tokens`' keyword arguments for these options: the agent loop's limits, the protocol and
        the model's end-of-sequence ids (`llm.models.end_of_sequence_ids` of the folder `model`)."""
        from verl_search.llm.models import end_of_sequence_ids

        return dict(max_turns=self.max_turns, max_obs_tokens=self.max_obs_tokens,
                    response_length=self.response_length, protocol=self.protocol,
                    end_ids=end_of_sequence_ids(tokenizer, model))


def _gold_in_passages(row: dict, hits: list) -> bool:
    from verl_search.rewards.qa import normalize_answer

    text = normalize_answer(" ".join(hit.passage.contents for hit in hits))
    golds = [normalize_answer(g) for g in row["reward_model"]["ground_truth"]["target"]]
    return any(g and g in text for g in golds)


def _shuffled_hits(rows: list[dict], retriever, topk: int, seed: int) -> list[tuple[dict, list]]:
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    return list(zip(rows, retriever.search([row["extra_info"]["question"] for row in rows], topk)))


def answerable_rows(rows: list[dict], retriever, topk: int, limit: int, seed: int) -> list[tuple[dict, list]]:
    """`(row, hits)` for up to `limit` verl rows whose gold answer (normalised) occurs in the
    full top-`topk` passages of their own question, in a random order fixed by `seed`; the observation
    may still cut it out (`visible_rows` selects on what the model sees).

    `retriever`: any `verl_search.retrieval.base.Retriever` (`search(queries, topk)`).
    """
    return [pair for pair in _shuffled_hits(rows, retriever, topk, seed) if _gold_in_passages(*pair)][:limit]


def visible_rows(rows: list[dict], retriever, tokenizer, builder, *, topk: int, limit: int, seed: int,
                 **settings) -> tuple[list[tuple[dict, list]], dict]:
    """`(row, hits)` for up to `limit` verl rows whose gold answer is visible in the observation of their
    trajectory as the agent loop renders it (`trajectory_tokens` with `settings`: same tokenizer, same cut to
    `max_obs_tokens`; `gold_visible`), in a random order fixed by `seed`. Candidates are examined in that order
    until `limit` qualify, so a short observation costs more candidates, not fewer trajectories.

    Args:
        rows: verl rows of the tag protocol; retriever: any `Retriever` (`search(queries, topk)`).
        tokenizer, builder: the model's tokenizer and `prompt_builder`.
        settings: `trajectory_tokens`' keyword arguments (`max_turns`, `max_obs_tokens`, `response_length`, ...).

    Returns `(chosen, counts)`: counts `{"rows": rows offered, "candidates": rows examined, "in_top_k": those
    with the gold in the full top-`topk` passages, "visible": chosen}`.
    """
    chosen, examined, in_top_k = [], 0, 0
    for row, hits in _shuffled_hits(rows, retriever, topk, seed):
        if len(chosen) == limit:
            break
        examined += 1
        if not _gold_in_passages(row, hits):
            continue  # not in the passages, so not in any cut of them
        in_top_k += 1
        if gold_visible(row, *trajectory_tokens(row, hits, tokenizer, builder, **settings), tokenizer):
            chosen.append((row, hits))
    return chosen, {"rows": len(rows), "candidates": examined, "in_top_k": in_top_k, "visible": len(chosen)}


def prompt_builder(model: str | os.PathLike, tokenizer):
    """verl's Continuous Token builder for the model's `model_type`: what the agent loop's
    `ct_build_initial_tokens` renders the first prompt with (`builder.build_initial_tokens(messages)`)."""
    from transformers import AutoConfig
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    model_type = getattr(AutoConfig.from_pretrained(model), "model_type", None)
    return create_continuous_token_builder(tokenizer, hf_model_type=model_type)


def write_trajectories(chosen: list[tuple], tokenizer, builder, path: Path, **settings) -> tuple[int, int]:
    """Write the trajectories of `chosen` (`(row, hits)`, or `(row, hits, (query, second_hits))` with a second
    search) to a parquet (`input_ids`, `loss_mask`, `question`, `gold_visible`)
    for `SearchTrajectoryDataset`; return `(longest trajectory in tokens, trajectories whose gold is visible in
    their observation)` (`gold_visible`, on the tokens written). `settings`: see `trajectory_tokens`."""
    from verl_search.datasets.preprocess import write_parquet

    records = []
    for row, hits, *second in chosen:  # a second search's `(query, hits)` follows the hits (`training.second_hop`)
        ids, mask = trajectory_tokens(row, hits, tokenizer, builder, second=second[0] if second else None, **settings)
        records.append({"input_ids": ids, "loss_mask": mask, "question": row["extra_info"]["question"],
                        "gold_visible": gold_visible(row, ids, mask, tokenizer)})
    write_parquet(records, path)
    return max(len(r["input_ids"]) for r in records), sum(r["gold_visible"] for r in records)


class SearchTrajectoryDataset:
    """verl SFT dataset (`data.custom_cls`) over the parquet `write_trajectories` writes.

    verl's `create_sft_dataset` calls it as `(parquet_files=, tokenizer=, config=, processor=,
    max_samples=)`. Each item is what verl's `MultiTurnSFTDataset` yields in `no_padding` mode:
    `input_ids`, `position_ids` (0..n-1) and `loss_mask`, 1-D long tensors of one trajectory's
    length (verl's `SFTTensorCollator` nests them).

    Raises:
        ValueError: `data.pad_mode` is not `no_padding`, or a trajectory is longer than
            `data.max_length` (nothing is cut silently).
    """

    def __init__(self, parquet_files, tokenizer=None, config=None, processor=None, max_samples: int = -1):
        import pandas as pd

        files = [parquet_files] if isinstance(parquet_files, str | os.PathLike) else list(parquet_files)
        config = config or {}
        if config.get("pad_mode", "no_padding") != "no_padding":
            raise ValueError(f"data.pad_mode={config.get('pad_mode')}: SearchTrajectoryDataset yields no_padding items")
        frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
        if max_samples is not None and max_samples > 0:
            frame = frame.iloc[:max_samples]
        self.items = [(list(ids), list(mask)) for ids, mask in zip(frame["input_ids"], frame["loss_mask"])]
        limit = config.get("max_length", None)
        longest = max((len(ids) for ids, _ in self.items), default=0)
        if limit is not None and longest > limit:
            raise ValueError(f"a trajectory has {longest} tokens, data.max_length={limit}: raise data.max_length")

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        import torch

        ids, mask = self.items[index]
        return {"input_ids": torch.tensor(ids, dtype=torch.long),
                "position_ids": torch.arange(len(ids), dtype=torch.long),
                "loss_mask": torch.tensor(mask, dtype=torch.long)}


def sft_command(model: str, data: Path, out: Path, *, steps: int, batch_size: int, lr: float,
                max_length: int, dtype: str = "float32") -> list[str]:
    """The command running verl's SFT trainer on the CPU over `data` (one process, gloo; fp32 weights,
    computing in `dtype`: `float32`, as `verl-search train --cpu` sets for the actor, or `bfloat16`,
    FSDP mixed precision, `cpu.precision.mixed_precision`).

    Raises:
        ValueError: `dtype` is not `float32` or `bfloat16`.
    """
    from verl_search.cpu.precision import mixed_precision

    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
        "-m", "verl_search.training.sft_main",
        f"model.path={model}", "model.use_remove_padding=false", "model.enable_gradient_checkpointing=false",
        "++model.override_config.attn_implementation=sdpa",
        "engine.strategy=fsdp2", "engine.model_dtype=fp32", f"++engine.mixed_precision={mixed_precision(dtype)}",
        "engine.use_torch_compile=false",
        f"data.train_files={data}", "data.val_files=null", "data.pad_mode=no_padding", "data.num_workers=0",
        f"data.train_batch_size={batch_size}", f"data.micro_batch_size_per_gpu={batch_size}",
        "data.use_dynamic_bsz=false", f"data.max_length={max_length}", "data.truncation=error",
        "data.custom_cls.path=pkg://verl_search.training.cold_start", "data.custom_cls.name=SearchTrajectoryDataset",
        f"optim.lr={lr}", "optim.lr_warmup_steps_ratio=0.0", "optim.weight_decay=0.0",
        f"trainer.total_training_steps={steps}", "trainer.total_epochs=1000", f"trainer.default_local_dir={out}",
        "trainer.logger=[console,file]", "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.save_freq=-1",
        "trainer.resume_mode=auto", "trainer.project_name=verl-search-quickstart", "trainer.experiment_name=cold-start",
        "checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    ]


def run_sft(model: str, data: Path, out: Path, log: Path, metrics: Path, **settings) -> Path:
    """Run verl's SFT trainer (`sft_command`); return the Hugging Face folder of its last step.

    Raises:
        RuntimeError: the trainer failed (the message names `log` and quotes its end, `progress.failure_message`).
    """
    from verl_search.cpu.overrides import cpu_env
    from verl_search.training.progress import failure_message, run_logged

    command = sft_command(model, data, out, **settings)
    env = {**cpu_env(), "VERL_FILE_LOGGER_PATH": str(metrics)}
    code = run_logged(command, env, log, metrics, settings["steps"], "cold start (verl SFT)")
    folder = out / f"global_step_{settings['steps']}" / "huggingface"
    if code != 0 or not (folder / "config.json").is_file():
        raise RuntimeError(failure_message(f"verl's SFT trainer failed (exit {code})", log))
    return folder


def sft_losses(metrics: Path) -> list[float]:
    """`train/loss` per step from verl's file logger output."""
    from verl_search.training.progress import logged_steps

    steps = logged_steps(metrics)
    return [round(float(steps[s]["train/loss"]), 4) for s in sorted(steps) if "train/loss" in steps[s]]


def read_rows(path: Path) -> list[dict]:
    """verl rows from a parquet, with lists where parquet gives numpy arrays."""
    import pandas as pd

    rows = pd.read_parquet(path).to_dict("records")
    for row in rows:
        row["prompt"] = [dict(m) for m in row["prompt"]]
        row["reward_model"]["ground_truth"]["target"] = list(row["reward_model"]["ground_truth"]["target"])
    return rows


def run_cold_start(model: str, index: Path, train_file: Path, out: Path, options: ColdStartOptions) -> Path:
    """The cold start: trajectories of up to `options.examples` training questions of `train_file` (verl rows)
    whose gold answer is visible in their observation (`visible_rows`), retrieved from `index`, then
    `options.epochs` passes of verl's SFT trainer over them in steps of `options.batch_size`, from `model` (a
    Hugging Face folder); return the Hugging Face folder `out/hf`.

    Writes `out/trajectories.parquet`, `out/sft.log`, `out/metrics.jsonl` (verl's file logger),
    `out/ckpt/` (verl's checkpoints) and `out/cold_start.json` (examples, `gold_visible`: trajectories whose gold
    is visible in their observation, recounted on the tokens written; `selection`: `visible_rows`' counts, its
    `visible` all trajectories; `second_hop`: `second_hop_rows`' counts with `options.second_hop`, else None;
    steps, losses, questions). With `options.second_hop`, that many of the trajectories search twice
    (`training.second_hop`), the rest once, shuffled together.

    Raises:
        ValueError: fewer qualifying training questions than one batch.
        RuntimeError: the SFT trainer failed.
    """
    import shutil

    from transformers import AutoTokenizer

    from verl_search.retrieval.loader import resolve_index

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(model)
    builder = prompt_builder(model, tokenizer)
    settings = options.trajectory_settings(tokenizer, model)
    rows, retriever = read_rows(train_file), resolve_index(index).load()
    chosen, counts = visible_rows(rows, retriever, tokenizer, builder, topk=options.topk,
                                  limit=options.examples - options.second_hop, seed=options.seed, **settings)
    logger.info("cold start: %d trajectories whose gold is visible in the %d-token observation, from %d candidate "
                "questions examined (%d with the gold in the full top-%d passages, the rest cut off or absent)",
                counts["visible"], options.max_obs_tokens, counts["candidates"], counts["in_top_k"], options.topk)
    second_counts = None
    if options.second_hop:
        from verl_search.training.second_hop import second_hop_rows

        second, second_counts = second_hop_rows(rows, retriever, tokenizer, builder, topk=options.topk,
                                                limit=options.second_hop, seed=options.seed, **settings)
        chosen = chosen + second  # disjoint: a second-hop question's first search does not show its gold
        random.Random(options.seed).shuffle(chosen)  # both kinds in every SFT batch
        counts = {**counts, "visible": len(chosen)}
    if counts["visible"] < options.examples:
        logger.warning("cold start: only %d of the %d training questions have their gold visible in the "
                       "observation: %d trajectories instead of --sft-examples %d", counts["visible"], counts["rows"],
                       counts["visible"], options.examples)
    if len(chosen) < options.batch_size:
        raise ValueError(f"{len(chosen)} training questions have their answer visible in their {options.max_obs_tokens}"
                         f"-token observation, fewer than one batch ({options.batch_size}; --sft-batch-size)")
    longest, visible = write_trajectories(chosen, tokenizer, builder, out / "trajectories.parquet", **settings)
    steps = options.epochs * (len(chosen) // options.batch_size)  # verl drops an incomplete last batch
    metrics = out / "metrics.jsonl"
    folder = run_sft(model, out / "trajectories.parquet", out / "ckpt", out / "sft.log", metrics, steps=steps,
                     batch_size=options.batch_size, lr=options.lr, max_length=longest, dtype=options.dtype)
    target = out / "hf"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(folder, target)
    summary = {"examples": len(chosen), "gold_visible": visible, "max_obs_tokens": options.max_obs_tokens,
               "selection": counts, "second_hop": second_counts, "steps": steps, "batch_size": options.batch_size,
               "lr": options.lr, "dtype": options.dtype, "losses": sft_losses(metrics),
               "questions": [row["extra_info"]["question"] for row, *_ in chosen]}
    (out / "cold_start.json").write_text(json.dumps(summary, indent=1))
    return target
