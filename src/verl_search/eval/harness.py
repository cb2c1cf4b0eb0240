"""`verl-search eval`: rollouts through verl's own `AgentLoopWorker`, scored with our rewards.

The flow, one module per concern: `options` (`EvalOptions`) -> `rows` (select and sample) ->
`verl_run` (config, retrieval service, engine, rollout) -> `records` (one scored record per
question) -> `report`.

The rollouts take the code path of verl's validation: `RLHFDataset` rows -> `AgentLoopWorker.
generate_sequences` (greedy `val_kwargs`) -> `ToolAgentLoop` + `SearchTool` (tool protocol) or
`SearchR1AgentLoop` (tag protocol) -> the LLM engine and the retrieval service. Each response is
then scored with `verl_search.rewards.compute_score`, as verl's reward loop would.

Output folder:

* `eval_data.parquet`: the rows evaluated (after `--max-per-source` sampling);
* `trajectories.jsonl`: one line per question (question, gold answers, every turn's generated
  text, search query and observation, prediction, EM, F1, cover-EM, searches, failed searches,
  tokens), appended batch by batch (one write, flushed and fsynced); a rerun first cuts off a
  torn last line (a run killed while writing) and skips the ids already there (resume);
* `judge_cache.jsonl` (with `--judge-url`): the judge's verdicts, see `verl_search.eval.judge`;
* `report.json`, `report.md`, `report.png`: see `verl_search.eval.report`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, replace
from pathlib import Path

from verl_search.datasets.preprocess import write_parquet
from verl_search.eval.options import EvalOptions
from verl_search.eval.records import read_trajectories, repair_trajectories
from verl_search.eval.report import write_report
from verl_search.eval.rows import row_id, select_rows
from verl_search.eval.verl_run import (
    make_engine,
    retrieval_service,
    rollout,
    start_vllm_client,
    verl_overrides,
    verl_warnings_once,
    with_vllm,
)
from verl_search.verl_config.version import check_verl_version

__all__ = ["EvalOptions", "run_eval"]

logger = logging.getLogger(__name__)


def run_eval(options: EvalOptions, engine=None) -> dict:
    """Evaluate, resume-safe; return the report summary (see `verl_search.eval.report`).

    Args:
        options: see `EvalOptions`; `engine="auto"` resolves through `cpu.engine.choose_engine`
            (the report records the engine that ran).
        engine: `(client, tokenizer, hf_folder)` to use instead of `make_engine(options)` (any
            object with verl's `generate(request_id, prompt_ids=..., sampling_params=...)`); the
            caller keeps it (only an engine made here is closed here).

    Raises:
        FileNotFoundError, ValueError: bad inputs or options (named in the message).
        RuntimeError: verl's dataset did not keep every row.
    """
    check_verl_version()
    from verl.experimental.agent_loop import AgentLoopWorker

    from verl_search.cpu.engine import choose_engine

    if engine is None:
        options = replace(options, engine=choose_engine(options.engine, options.model))

    from verl_search.eval.batch import load_dataset
    from verl_search.verl_config.compose import compose_verl_config

    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = select_rows(options.data, options.protocol, options.max_per_source, options.seed, options.samples)
    data_file = out / "eval_data.parquet"
    write_parquet(rows, data_file)
    trajectories = out / "trajectories.jsonl"
    torn = repair_trajectories(trajectories)
    if torn:
        logger.warning("cut %d bytes of an unfinished last record off %s (a killed run); redoing it", torn, trajectories)
    done = read_trajectories(trajectories)
    pending = [i for i, row in enumerate(rows) if row_id(row) not in done]
    logger.info("%d questions, %d already in %s, %d to run", len(rows), len(rows) - len(pending), trajectories, len(pending))
    if pending and engine is None and options.engine == "vllm":
        _run_on_vllm(options, rows, pending, data_file, trajectories)
    elif pending:
        client, tokenizer, hf_folder = engine or make_engine(options)
        with retrieval_service(options) as url, verl_warnings_once():
            config = compose_verl_config(verl_overrides(options, hf_folder, data_file, url))
            dataset = load_dataset(data_file, tokenizer, config.data)
            if len(dataset) != len(rows):
                raise RuntimeError(f"verl's RLHFDataset kept {len(dataset)} of {len(rows)} rows")
            asyncio.run(rollout(AgentLoopWorker(config, client), dataset, rows, pending, tokenizer, options.batch_size,
                                trajectories, engine=None if engine else client))
    wanted = {row_id(row) for row in rows}
    records = [r for r in read_trajectories(trajectories).values() if r["id"] in wanted]
    meta = {"options": asdict(options), "questions": len(records)}
    if options.judge_url:
        from verl_search.eval.judge import judge_records

        meta["judge"] = {"url": options.judge_url, "model": options.judge_model,
                         **judge_records(records, options.judge_url, options.judge_model, out / "judge_cache.jsonl")}
    return write_report(records, out, f"verl-search eval: {Path(options.model).name}, {options.protocol} protocol", meta)


def _run_on_vllm(options: EvalOptions, rows: list[dict], pending: list[int], data_file: Path, trajectories: Path) -> None:
    """The rollouts on verl's own vLLM replica (standalone, CPU build): `verl_run.with_vllm`."""
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop import AgentLoopWorker

    from verl_search.eval.batch import load_dataset
    from verl_search.verl_config.compose import compose_verl_config
    from verl_search.cpu.local_ray import cpu_ray
    from verl_search.llm.models import model_folder

    hf_folder = model_folder(options.model, options.gguf_file)
    tokenizer = AutoTokenizer.from_pretrained(hf_folder)
    with retrieval_service(options) as url, verl_warnings_once(), cpu_ray():
        config = compose_verl_config(with_vllm(verl_overrides(options, hf_folder, data_file, url), options))
        dataset = load_dataset(data_file, tokenizer, config.data)
        if len(dataset) != len(rows):
            raise RuntimeError(f"verl's RLHFDataset kept {len(dataset)} of {len(rows)} rows")
        _, client = start_vllm_client(config)
        asyncio.run(rollout(AgentLoopWorker(config, client), dataset, rows, pending, tokenizer, options.batch_size,
                            trajectories))
