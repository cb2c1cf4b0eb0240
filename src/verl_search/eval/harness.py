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
* `report.json`, `report.md`, `report.png`: see `verl_search.report.evaluation`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, replace
from pathlib import Path

from verl_search.datasets.preprocess import write_parquet
from verl_search.eval.options import EvalOptions
from verl_search.eval.records import repair_trajectories
from verl_search.report.records import read_trajectories
from verl_search.report.evaluation import write_report
from verl_search.eval.rows import row_id, select_rows
from verl_search.eval.verl_run import (
    load_model_weights,
    make_engine,
    retrieval_service,
    rollout,
    weights_layout_differences,
    start_vllm_client,
    verl_overrides,
    verl_warnings_once,
    vllm_overrides,
    with_vllm,
)
from verl_search.verl_config.version import check_verl_version

__all__ = ["EvalOptions", "run_eval", "run_evals"]

logger = logging.getLogger(__name__)


def run_eval(options: EvalOptions, engine=None) -> dict:
    """Evaluate, resume-safe; return the report summary (see `verl_search.report.evaluation`).

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
    if engine is None and options.engine == "vllm":
        return run_evals([options])[0]

    from verl_search.eval.batch import load_dataset
    from verl_search.verl_config.compose import compose_verl_config

    rows, data_file, trajectories, pending = _prepare(options)
    if pending:
        client, tokenizer, hf_folder = engine or make_engine(options)
        with retrieval_service(options) as url, verl_warnings_once():
            config = compose_verl_config(verl_overrides(options, hf_folder, data_file, url))
            dataset = load_dataset(data_file, tokenizer, config.data)
            _check_kept(dataset, rows)
            asyncio.run(rollout(AgentLoopWorker(config, client), dataset, rows, pending, tokenizer, options.batch_size,
                                trajectories, engine=None if engine else client))
    return _finish(options, rows, trajectories)


def run_evals(evaluations: list[EvalOptions]) -> list[dict]:
    """Evaluate several models on the same questions and retrieval, one after the other; return each
    one's report summary, in order (each into its own `out`, resume-safe as `run_eval`).

    On verl's vLLM rollout (`engine` `vllm`, after `auto` is resolved) the replica, the local Ray and
    the retrieval service start once: the first model still to evaluate is loaded as vLLM loads a model, each
    later one is loaded into the running replica (`verl_run.load_model_weights`: every weight of its
    folder, through the same reload path as the trainer's weight sync; the prefix cache is cleared). A model
    whose architecture, stop tokens or tokenizer differ from the first one's (`verl_run.
    weights_layout_differences`) is evaluated afterwards on a replica of its own (logged). Other engines
    evaluate each model with `run_eval` in turn. Each summary gets `seconds`: `{"load"`: the replica's
    start or the weight load, `"rollout"`: the rollouts} (0.0 for what was done before).

    Raises:
        ValueError: `evaluations` is empty; or on vLLM, they differ in retrieval (`index`,
            `retrieval_url`) or in the replica's settings (`verl_run.vllm_overrides`): evaluate those
            separately.
        FileNotFoundError, RuntimeError: as `run_eval`.
    """
    check_verl_version()
    from verl_search.cpu.engine import choose_engine

    if not evaluations:
        raise ValueError("run_evals needs at least one EvalOptions")
    evaluations = [replace(o, engine=choose_engine(o.engine, o.model)) for o in evaluations]
    if any(o.engine != "vllm" for o in evaluations):
        return [run_eval(o) for o in evaluations]
    first = evaluations[0]
    for other in evaluations[1:]:
        if (other.index, other.retrieval_url) != (first.index, first.retrieval_url):
            raise ValueError(f"run_evals: {other.out} searches {other.index or other.retrieval_url}, {first.out} "
                             f"{first.index or first.retrieval_url}; evaluate them separately")
        if vllm_overrides(other) != vllm_overrides(first):
            raise ValueError(f"run_evals: {other.out} needs other vLLM settings than {first.out} (batch size, prompt "
                             "or response length); evaluate them separately")
    prepared = [_prepare(o) for o in evaluations]
    seconds = _run_on_vllm(evaluations, prepared) if any(p[3] for p in prepared) else {}
    summaries = []
    for options, (rows, _, trajectories, _) in zip(evaluations, prepared):
        summary = _finish(options, rows, trajectories)
        summary["seconds"] = seconds.get(options.out, {"load": 0.0, "rollout": 0.0})
        summaries.append(summary)
    return summaries


def _prepare(options: EvalOptions) -> tuple[list[dict], Path, Path, list[int]]:
    """`(rows, data_file, trajectories, pending)` of one evaluation: its rows selected and written to
    `OUT/eval_data.parquet`, a torn last record cut off, and the positions of the rows still to run."""
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
    return rows, data_file, trajectories, pending


def _check_kept(dataset, rows: list[dict]) -> None:
    if len(dataset) != len(rows):
        raise RuntimeError(f"verl's RLHFDataset kept {len(dataset)} of {len(rows)} rows")


def _finish(options: EvalOptions, rows: list[dict], trajectories: Path) -> dict:
    """Score (and judge, with `--judge-url`) the records of `rows` and write the report."""
    out = Path(options.out)
    wanted = {row_id(row) for row in rows}
    records = [r for r in read_trajectories(trajectories).values() if r["id"] in wanted]
    meta = {"options": asdict(options), "questions": len(records)}
    if options.judge_url:
        from verl_search.eval.judge import judge_records

        meta["judge"] = {"url": options.judge_url, "model": options.judge_model,
                         **judge_records(records, options.judge_url, options.judge_model, out / "judge_cache.jsonl")}
    return write_report(records, out, f"verl-search eval: {Path(options.model).name}, {options.protocol} protocol", meta)


def _run_on_vllm(evaluations: list[EvalOptions], prepared: list[tuple]) -> dict[str, dict]:
    """The rollouts of every evaluation with pending rows on one verl vLLM replica (standalone, CPU build:
    `verl_run.with_vllm`), started with the first such model's folder; each later model's weights are loaded
    into it (`verl_run.load_model_weights`), but for models it cannot serve, which get a replica of their own
    afterwards. Returns `{out: {"load": seconds, "rollout": seconds}}`."""
    import time

    from transformers import AutoTokenizer
    from verl.experimental.agent_loop import AgentLoopWorker

    from verl_search.cpu.local_ray import cpu_ray
    from verl_search.eval.batch import load_dataset
    from verl_search.llm.models import model_folder
    from verl_search.verl_config.compose import compose_verl_config

    todo = [(o, p, model_folder(o.model, o.gguf_file)) for o, p in zip(evaluations, prepared) if p[3]]
    here, later = [todo[0]], []
    for item in todo[1:]:
        differences = weights_layout_differences(todo[0][2], item[2])
        if differences:
            logger.warning("%s cannot be loaded into the replica serving %s (%s): it gets a replica of its own",
                           item[2], todo[0][2], "; ".join(differences))
        (later if differences else here).append(item)
    seconds, client, serving = {}, None, None
    with retrieval_service(*(item[0] for item in todo)) as url, verl_warnings_once(), cpu_ray():
        for options, (rows, data_file, trajectories, pending), hf_folder in here:
            tokenizer = AutoTokenizer.from_pretrained(hf_folder)
            config = compose_verl_config(with_vllm(verl_overrides(options, hf_folder, data_file, url), options))
            dataset = load_dataset(data_file, tokenizer, config.data)
            _check_kept(dataset, rows)
            started = time.perf_counter()
            if client is None:
                manager, client = start_vllm_client(config)
            elif hf_folder != serving:
                load_model_weights(manager, hf_folder)
            serving, loaded = hf_folder, time.perf_counter()
            logger.info("evaluating %s on the vLLM replica into %s", hf_folder, options.out)
            asyncio.run(rollout(AgentLoopWorker(config, client), dataset, rows, pending, tokenizer, options.batch_size,
                                trajectories))
            seconds[options.out] = {"load": round(loaded - started, 1), "rollout": round(time.perf_counter() - loaded, 1)}
    if later:
        seconds.update(_run_on_vllm([o for o, _, _ in later], [p for _, p, _ in later]))
    return seconds
