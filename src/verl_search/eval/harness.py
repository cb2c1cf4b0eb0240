"""`verl-search eval`: rollouts through verl's own `AgentLoopWorker`, scored with our rewards.

The rollouts take the code path of verl's validation: `RLHFDataset` rows -> `AgentLoopWorker.
generate_sequences` (greedy `val_kwargs`) -> `ToolAgentLoop` + `SearchTool` (tool protocol) or
`SearchR1AgentLoop` (tag protocol) -> the LLM engine and the retrieval service. Each response is
then scored with `verl_search.rewards.compute_score`, as verl's reward loop would.

Output folder:

* `eval_data.parquet`: the rows evaluated (after `--max-per-source` sampling);
* `trajectories.jsonl`: one line per question (question, gold answers, every turn's generated
  text, search query and observation, prediction, EM, F1, cover-EM, searches, failed searches,
  tokens), appended batch by batch; a rerun skips the ids already there (resume);
* `report.json`, `report.md`, `report.png`: see `verl_search.eval.report`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from dataclasses import asdict
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from verl_search.configs import config_path
from verl_search.data.preprocess import Source, build_rows, write_parquet
from verl_search.eval.options import EvalOptions
from verl_search.eval.report import write_report
from verl_search.protocol import (
    FAILED_SEARCHES,
    INVALID_ACTIONS,
    NUM_SEARCHES,
    SEARCH_ERRORS,
    TOOL_CALL_RE,
    parse_action,
)
from verl_search.rewards import compute_score, gold_answers
from verl_search.verl_compat import check_verl_version

logger = logging.getLogger(__name__)


def row_id(row: dict) -> str:
    """A question's id in the output: `data_source/id`."""
    return f"{row['data_source']}/{row['extra_info']['id']}"


def select_rows(data: list[str], protocol: str, max_per_source: int | None, seed: int) -> list[dict]:
    """The verl rows to evaluate: JSONL inputs are preprocessed, parquet rows used as they are.

    Raises:
        FileNotFoundError: an input does not exist.
        RowError: a malformed JSONL row (file and line named).
    """
    rows: list[dict] = []
    for spec in data:
        source = Source.parse(spec)
        if not source.path.is_file():
            raise FileNotFoundError(f"data file {source.path} does not exist")
        if source.path.suffix == ".parquet":
            frame = pd.read_parquet(source.path)
            if max_per_source is not None:
                frame = frame.groupby("data_source", group_keys=False, sort=False).apply(
                    lambda g: g.sample(n=min(len(g), max_per_source), random_state=seed).sort_index())
            rows += frame.to_dict("records")
        else:
            rows += build_rows([source], "test", protocol, max_per_source, seed)
    for index, row in enumerate(rows):
        row["extra_info"] = {**row["extra_info"], "index": index}
    return rows


def _shipped_yaml(name: str, updates: dict, path: Path) -> str:
    """A copy of a shipped YAML with `updates` applied to its (first) entry's settings."""
    config = OmegaConf.load(config_path(name))
    entry = config.tools[0].config if name == "tool" else config[0]
    for key, value in updates.items():
        entry[key] = value
    OmegaConf.save(config, path)
    return str(path)


def verl_overrides(options: EvalOptions, hf_folder: str, data_file: Path, retrieval_url: str) -> list[str]:
    """The hydra overrides that make verl's config fit this evaluation."""
    out = Path(options.out)
    client = {"retrieval_service_url": retrieval_url, "topk": options.topk}
    tool_yaml = _shipped_yaml("tool", client, out / "search_tool_config.yaml")
    loop_yaml = _shipped_yaml("agent-loop", {**client, "max_turns": options.max_turns,
                                             "max_tokens_per_turn": options.max_tokens_per_turn,
                                             "max_obs_tokens": options.max_obs_tokens}, out / "agent_loops.yaml")
    rollout = "actor_rollout_ref.rollout"
    return [
        f"actor_rollout_ref.model.path={hf_folder}",
        f"{rollout}.name=sglang",
        f"{rollout}.prompt_length={options.prompt_length}",
        f"{rollout}.response_length={options.response_length}",
        f"{rollout}.calculate_log_probs=false",
        f"{rollout}.val_kwargs.temperature={options.temperature}",
        f"{rollout}.multi_turn.enable=true",
        f"{rollout}.multi_turn.format=hermes",
        f"{rollout}.multi_turn.tool_config_path={tool_yaml}",
        f"{rollout}.multi_turn.max_tool_response_length=4000",
        f"{rollout}.multi_turn.max_assistant_turns={options.max_turns + 1}",
        f"{rollout}.agent.agent_loop_config_path={loop_yaml}",
        f"data.train_files={data_file}",
        f"data.val_files={data_file}",
        f"data.max_prompt_length={options.prompt_length}",
        "data.filter_overlong_prompts=false",  # never drop a question silently
    ]


@contextlib.contextmanager
def retrieval_service(options: EvalOptions):
    """Yield the `/retrieve` URL: the given one, or a server started on `options.index`."""
    if options.retrieval_url:
        yield options.retrieval_url
        return
    if not options.index:
        raise ValueError("pass --retrieval-url URL (a running server) or --index DIR (served for this run)")
    from verl_search.server.runner import SubprocessServer

    with SubprocessServer(["--index", options.index], log_path=str(Path(options.out) / "retrieval_server.log")) as server:
        yield f"{server.url}/retrieve"


def make_engine(options: EvalOptions):
    """`(engine, tokenizer, hf_folder)` for `options.engine`."""
    from verl_search.rollout.engines import SGLangEngine, TransformersEngine
    from verl_search.rollout.models import load_causal_lm

    if options.engine == "transformers":
        model, tokenizer, folder = load_causal_lm(options.model, options.gguf_file)
        return TransformersEngine(model, tokenizer, max_batch_size=options.batch_size), tokenizer, folder
    if options.engine == "sglang":
        if not options.engine_url:
            raise ValueError("--engine sglang needs --engine-url http://HOST:PORT (a running SGLang server)")
        from transformers import AutoTokenizer

        return SGLangEngine(options.engine_url), AutoTokenizer.from_pretrained(options.model), options.model
    raise ValueError(f"unknown engine {options.engine!r}; use transformers or sglang")


def _turns(ids: list[int], mask: list[int], decode) -> list[dict]:
    """Model turns (mask 1) with the observation (mask 0) that followed each."""
    turns: list[dict] = []
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or mask[end] != mask[start]:
            text = decode(ids[start:end])
            if mask[start] == 1:
                turns.append({"generated": text, "queries": _queries(text)})
            elif turns:
                turns[-1]["observation"] = text
            start = end
    return turns


def _queries(text: str) -> list[str]:
    action = parse_action(text)
    if action.kind == "search":
        return [action.content]
    queries = []
    for body in TOOL_CALL_RE.findall(text):
        try:
            arguments = json.loads(body).get("arguments", {})
        except (ValueError, AttributeError):
            continue
        found = arguments.get("query_list", arguments.get("query", [])) if isinstance(arguments, dict) else []
        queries += [found] if isinstance(found, str) else [q for q in found if isinstance(q, str)]
    return queries


def trajectory_record(output, position: int, row: dict, tokenizer) -> dict:
    """One `trajectories.jsonl` line for row `position` of an agent-loop output batch."""
    prompt_width = output.batch["prompts"].shape[1]
    valid = int(output.batch["attention_mask"][position, prompt_width:].sum())
    ids = output.batch["responses"][position, :valid].tolist()
    mask = output.batch["response_mask"][position, :valid].tolist()
    fields = {}
    for key in (NUM_SEARCHES, FAILED_SEARCHES, SEARCH_ERRORS, INVALID_ACTIONS):
        value = output.non_tensor_batch[key][position] if key in output.non_tensor_batch else None
        if value is not None:
            fields[key] = value if key == SEARCH_ERRORS else int(value)
    extra_info = {**row["extra_info"], **fields}
    response = tokenizer.decode(ids, skip_special_tokens=True)  # what verl's reward manager decodes
    score = compute_score(row["data_source"], response, row["reward_model"]["ground_truth"], extra_info)
    return {
        "id": row_id(row), "data_source": row["data_source"], "question": row["extra_info"].get("question"),
        "golden_answers": gold_answers(row["reward_model"]["ground_truth"]), "prediction": score["pred"],
        "em": score["acc"], "f1": score["f1"], "cover_em": score["cover_em"], "score": score["score"],
        "format_ok": score["format_ok"], "answered": bool(score["answered"]), NUM_SEARCHES: score[NUM_SEARCHES],
        FAILED_SEARCHES: score[FAILED_SEARCHES], SEARCH_ERRORS: list(fields.get(SEARCH_ERRORS) or []),
        INVALID_ACTIONS: fields.get(INVALID_ACTIONS, 0), "generated_tokens": int(sum(mask)),
        "response_tokens": len(ids), "turns": _turns(ids, mask, lambda t: tokenizer.decode(t, skip_special_tokens=False)),
    }


def _read_trajectories(path: Path) -> dict[str, dict]:
    records = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                records[record["id"]] = record
    return records


def run_eval(options: EvalOptions, engine=None) -> dict:
    """Evaluate, resume-safe; return the report summary (see `verl_search.eval.report`).

    Args:
        options: see `EvalOptions`.
        engine: `(client, tokenizer, hf_folder)` to use instead of `make_engine(options)` (any
            object with verl's `generate(request_id, prompt_ids=..., sampling_params=...)`).

    Raises:
        FileNotFoundError, ValueError: bad inputs or options (named in the message).
        RuntimeError: verl's dataset did not keep every row.
    """
    check_verl_version()
    from verl.experimental.agent_loop import AgentLoopWorker

    from verl_search.rollout.batch import load_dataset
    from verl_search.rollout.verl_config import compose_verl_config

    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = select_rows(options.data, options.protocol, options.max_per_source, options.seed)
    data_file = out / "eval_data.parquet"
    write_parquet(rows, data_file)
    trajectories = out / "trajectories.jsonl"
    done = _read_trajectories(trajectories)
    pending = [i for i, row in enumerate(rows) if row_id(row) not in done]
    logger.info("%d questions, %d already in %s, %d to run", len(rows), len(rows) - len(pending), trajectories, len(pending))
    if pending:
        client, tokenizer, hf_folder = engine or make_engine(options)
        with retrieval_service(options) as url:
            config = compose_verl_config(verl_overrides(options, hf_folder, data_file, url))
            dataset = load_dataset(data_file, tokenizer, config.data)
            if len(dataset) != len(rows):
                raise RuntimeError(f"verl's RLHFDataset kept {len(dataset)} of {len(rows)} rows")
            asyncio.run(_rollout(AgentLoopWorker(config, client), dataset, rows, pending, tokenizer, options, trajectories))
    records = [r for r in _read_trajectories(trajectories).values() if r["id"] in {row_id(row) for row in rows}]
    meta = {"options": asdict(options), "questions": len(records)}
    return write_report(records, out, f"verl-search eval: {Path(options.model).name}, {options.protocol} protocol", meta)


async def _rollout(worker, dataset, rows, pending, tokenizer, options, trajectories: Path) -> None:
    from verl_search.rollout.batch import make_batch

    with open(trajectories, "a", encoding="utf-8") as sink, tqdm(total=len(rows), initial=len(rows) - len(pending),
                                                                   unit="question", desc="eval") as progress:
        for start in range(0, len(pending), options.batch_size):
            chunk = pending[start : start + options.batch_size]
            output = await worker.generate_sequences(make_batch(dataset, chunk))
            for position, index in enumerate(chunk):
                sink.write(json.dumps(trajectory_record(output, position, rows[index], tokenizer)) + "\n")
            sink.flush()
            os.fsync(sink.fileno())
            progress.update(len(chunk))
