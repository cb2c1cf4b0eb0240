"""`run_quickstart`: the quickstart's stages in order, each skipped when its output is complete.

| stage | writes (under `--out`) | depends on |
| --- | --- | --- |
| `index` | `index/` (BM25 over the mini corpus) | |
| `data` | `data/train.parquet`, `data/test.parquet` (`mini-wiki:train`, `--test-questions` of `mini-wiki:test`) | |
| `cold_start` | `cold_start/` (trajectories parquet, verl SFT log, metrics, checkpoint, `hf/`) | index, data |
| `frontier` | `data/frontier.parquet`, `eval/frontier/` (`--frontier-questions` only) | cold_start |
| `grpo` | `grpo/` (train log, metrics, rollouts per step, checkpoint, merged `hf/`) | cold_start, frontier |
| `grpo_control` | `grpo_control/`: GRPO on scores shuffled within each step (`--control` only) | as grpo |
| `evaluate` | `eval/NAME/` (`verl-search eval`'s folder: `trajectories.jsonl`, `report.*`) for `untrained`, `cold_start`, `grpo`, `grpo_control`; with `--frontier-questions` also `eval/probe_NAME/` (the start model and each GRPO model sampled again on the frontier); `eval/seconds.json` | every stage above |
| `report` | `report.md`, `report.json`, `curves.png`; `eval/NAME/gold_in_top_k.json` (each evaluation's searches replayed on `index/`, `report.funnel`) | every evaluation |

The `evaluate` stage runs every evaluation in one child process on one start of the rollout engine
(`eval.harness.run_evals`: on verl's vLLM rollout each later model's weights are loaded into the running
replica), so the engine's start-up (about a minute on 2 cores) is paid once, not once per model.

Memory: each stage runs in a child process of its own (or launches one), so the command's own process
stays small while verl's trainer and vLLM run (GRPO's own settings: `quickstart.grpo`).

Resume: each stage's record `stages/NAME.json` holds its fingerprint, status and seconds; a finished stage with
the same fingerprint is skipped, an unfinished one resumes, another fingerprint is refused (`quickstart.stages`).
`--start-from` begins a new folder with a finished study's stages before GRPO (`quickstart.reuse`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from verl_search.quickstart.options import QuickstartOptions, StudyOptions, for_model, protocol_options, response_length
from verl_search.quickstart.stages import Stage, run_stages
from verl_search.report.quickstart import CONTROL
from verl_search.runtime.child import in_child

logger = logging.getLogger(__name__)

PROTOCOL_KEYS = ("protocol", "max_turns", "topk", "max_tokens_per_turn", "max_obs_tokens", "temperature")


class Quickstart:
    """The stages of one run (see the module docstring) over `options`.

    Args:
        options: see `QuickstartOptions`; a learning study's, `StudyOptions` (a `QuickstartOptions` is run
            as the study with every study flag at its default).
    """

    def __init__(self, options: QuickstartOptions):
        options = StudyOptions.of(options)
        if options.dtype == "auto":  # resolved once, in a child (torch), so the stages record what ran
            from verl_search.cpu.precision import resolve_dtype

            options = dataclasses.replace(options, dtype=in_child(resolve_dtype, options.dtype))
            logger.info("compute dtype of the trainers and vLLM rollouts: %s (--dtype auto)", options.dtype)
        self.options = options
        self.out = Path(options.out).resolve()
        self.index = self.out / "index"
        self.train_file = self.out / "data" / "train.parquet"
        self.test_file = self.out / "data" / "test.parquet"
        self.frontier_file = self.out / "data" / "frontier.parquet"
        self.balanced_file = self.out / "data" / "frontier_balanced.parquet"
        from verl_search.cpu.engine import choose_engine

        # one engine for every evaluation and GRPO's rollouts, chosen as `verl-search eval` chooses
        self.engine = choose_engine(options.engine, options.model)
        self.protocol = protocol_options(options, self.index, self.engine)
        logger.info("rollout engine of the evaluations and GRPO: %s", self.engine)

    @property
    def recipe(self) -> Path:
        """`--recipe`, or the shipped GRPO recipe (`grpo.shipped_recipe`)."""
        from verl_search.quickstart.grpo import shipped_recipe

        return Path(self.options.recipe).resolve() if self.options.recipe else shipped_recipe()

    def stages(self) -> list[Stage]:
        """The stages this run's options ask for, in order: the trainings first, then one `evaluate` stage that
        evaluates every model (and probes it on the frontier) on one start of the rollout engine."""
        o = self.options
        protocol = (*PROTOCOL_KEYS, "batch_size", "engine", "dtype")
        stages = [Stage("index", (), (), self.build_index), Stage("data", ("test_questions", "seed", "protocol"), (),
                                                                   self.write_data)]
        trained = []  # the stages whose models the evaluate stage reads
        if o.sft_examples:
            stages += [Stage("cold_start", ("model", "sft_examples", "sft_epochs", "sft_batch_size", "sft_lr", "seed",
                                            "dtype", "sft_second_hop", *PROTOCOL_KEYS), ("index", "data"),
                             self.cold_start, self.out / "cold_start" / "ckpt")]
            trained.append("cold_start")
        frontier = ("frontier",) if o.grpo_steps and o.frontier_questions else ()
        if frontier:
            stages += [Stage("frontier", ("model", "sft_examples", "frontier_questions", "frontier_samples",
                                          "prompts_per_step", "reward", "seed", *protocol), ("index", "data", *trained),
                             self.frontier)]
        grpo = ("model", "recipe", "grpo_steps", "prompts_per_step", "group_size", "grpo_lr", "engine", "reward",
                "filter_groups", "filter_metric", "max_gen_batches", "permuted_reward", "balance_positions", "seed",
                "dtype", *PROTOCOL_KEYS)
        if o.grpo_steps:
            stages += [Stage("grpo", grpo, ("index", "data", *trained, *frontier), self.grpo,
                             self.out / "grpo" / "ckpt")]
            trained.append("grpo")
        if o.control:
            stages += [Stage(CONTROL, (*grpo, "control"), ("index", "data", *trained[:-1], *frontier),
                             lambda: self.grpo(CONTROL, permuted_reward=True), self.out / CONTROL / "ckpt")]
            trained.append(CONTROL)
        probes = ("frontier_samples",) if frontier else ()
        stages += [Stage("evaluate", ("model", *protocol, *probes), ("index", "data", *trained, *frontier),
                         self.evaluate)]
        return stages

    def evaluations(self) -> list[tuple[str, object]]:
        """`(name, EvalOptions)` of every evaluation of the `evaluate` stage, grouped by model: each model on
        the held-out questions into `eval/NAME` (`untrained`, `cold_start`, `grpo`, the control) and, with
        `--frontier-questions`, GRPO's start model and each GRPO model sampled again on the frontier questions
        (the probe set) into `eval/probe_NAME` (the start model's as `probe_cold_start`)."""
        o = self.options
        models = [("untrained", o.model)]
        if o.sft_examples:
            models.append(("cold_start", self.out / "cold_start" / "hf"))
        if o.grpo_steps:
            models.append(("grpo", self.out / "grpo" / "hf"))
        if o.control:
            models.append((CONTROL, self.out / CONTROL / "hf"))
        probes = {}
        if o.grpo_steps and o.frontier_questions:
            probes = {"cold_start" if o.sft_examples else "untrained": "cold_start", "grpo": "grpo", CONTROL: CONTROL}
        out = []
        for name, model in models:
            out.append((name, for_model(self.protocol, str(model), self.test_file, self.out / "eval" / name)))
            if name in probes:
                probe = f"probe_{probes[name]}"
                out.append((probe, self.sampled(model, self.frontier_file, probe)))
        return out

    def build_index(self) -> None:
        from verl_search.quickstart.data import corpus_path
        from verl_search.retrieval.index_builder import BuildOptions, build_index

        in_child(build_index, corpus_path(), self.index, BuildOptions(retriever="bm25", overwrite=True))

    def write_data(self) -> None:
        from verl_search.quickstart.data import write_split

        in_child(write_split, self.train_file, self.test_file, self.options.test_questions, self.options.seed,
                 self.options.protocol)

    def base_model(self) -> str:
        """`--model` as a Hugging Face folder (SmolLM2's GGUF is converted once, in a child process)."""
        from verl_search.llm.models import model_folder

        return in_child(model_folder, self.options.model)

    def evaluate(self) -> None:
        """Every evaluation (`evaluations`) in one child process, on one start of the rollout engine
        (`eval.harness.run_evals`); each one's load and rollout seconds go to `eval/seconds.json`."""
        from verl_search.eval.harness import run_evals

        names, evaluations = zip(*self.evaluations())
        summaries = in_child(run_evals, list(evaluations))
        seconds = {name: summary.get("seconds") for name, summary in zip(names, summaries)}
        (self.out / "eval" / "seconds.json").write_text(json.dumps(seconds, indent=1))

    def cold_start_options(self):
        """The cold start's `ColdStartOptions` from this run's flags."""
        from verl_search.training.cold_start import ColdStartOptions

        o = self.options
        return ColdStartOptions(examples=o.sft_examples, epochs=o.sft_epochs, batch_size=o.sft_batch_size, lr=o.sft_lr,
                                dtype=o.dtype, second_hop=o.sft_second_hop,
                                protocol=o.protocol, topk=o.topk, max_turns=o.max_turns,
                                max_obs_tokens=o.max_obs_tokens, response_length=response_length(o), seed=o.seed)

    def cold_start(self) -> None:
        from verl_search.training.cold_start import run_cold_start

        in_child(run_cold_start, self.base_model(), self.index, self.train_file, self.out / "cold_start",
                 self.cold_start_options())

    def grpo_questions(self) -> Path:
        """GRPO's training questions without `--frontier-questions`: those whose gold is visible in the
        observation, the cold start's own left out (`data.write_grpo_questions`, `data/grpo_questions.parquet`,
        `GRPO_QUESTIONS_PER_STEP` per step and question trained)."""
        from verl_search.quickstart.data import GRPO_QUESTIONS_PER_STEP, write_grpo_questions

        o = self.options
        target = self.out / "data" / "grpo_questions.parquet"
        counts = in_child(write_grpo_questions, self.train_file, self.index, self.start_model(),
                          self.out / "cold_start" / "cold_start.json", target,
                          GRPO_QUESTIONS_PER_STEP * o.grpo_steps * o.prompts_per_step, self.cold_start_options())
        (self.out / "data" / "grpo_questions.json").write_text(json.dumps(counts, indent=1))
        return target

    def start_model(self) -> str:
        """GRPO's start: the cold-start model, or `--model` without a cold start."""
        return str(self.out / "cold_start" / "hf") if self.options.sft_examples else self.base_model()

    def sampled(self, model, data: Path, name: str):
        """The protocol's `EvalOptions` for `model` on `data` into `eval/NAME`, `--frontier-samples` rollouts per
        question at the frontier temperature."""
        from verl_search.quickstart.frontier import FRONTIER_TEMPERATURE

        return dataclasses.replace(for_model(self.protocol, str(model), data, self.out / "eval" / name),
                                   samples=self.options.frontier_samples, temperature=FRONTIER_TEMPERATURE)

    def frontier(self) -> None:
        """The start model's sampled success on `--frontier-questions` training questions; those answered
        sometimes (`report.grpo_signal.trained_measure`) become GRPO's training questions and the probe set."""
        from verl_search.eval.harness import run_eval
        from verl_search.quickstart.frontier import write_candidates, write_frontier
        from verl_search.report.grpo_signal import trained_measure

        o = self.options
        candidates = self.out / "data" / "frontier_candidates.parquet"
        in_child(write_candidates, self.train_file, candidates, o.frontier_questions, o.seed)
        in_child(run_eval, self.sampled(self.start_model(), candidates, "frontier"))
        summary = in_child(write_frontier, candidates, self.out / "eval" / "frontier", self.frontier_file,
                           o.prompts_per_step, trained_measure(o.reward, o.protocol))
        logger.info("frontier: %s", summary)

    def grpo(self, name: str = "grpo", permuted_reward: bool | None = None) -> None:
        """GRPO from the start model into `out/NAME`; `permuted_reward` (default: `--permuted-reward`) trains on
        scores shuffled within each step (the control)."""
        from verl_search.quickstart.grpo import grpo_overrides, run_grpo

        o = self.options
        start = self.start_model()
        out = self.out / name
        out.mkdir(parents=True, exist_ok=True)
        train_file = self.frontier_file if o.frontier_questions else self.grpo_questions()
        if o.balance_positions:  # pandas in a child: the driver stays light
            from verl_search.quickstart.frontier import balance_gold_positions

            logger.info("GRPO's questions balanced by the gold's position: %s", in_child(
                balance_gold_positions, self.frontier_file, self.balanced_file, o.seed, o.prompts_per_step))
            train_file = self.balanced_file
        overrides = grpo_overrides(self.protocol, model=start, train_file=train_file, val_file=self.test_file,
                                   out=out, steps=o.grpo_steps, prompts_per_step=o.prompts_per_step,
                                   group_size=o.group_size, lr=o.grpo_lr, kl=False, reward=o.reward,
                                   max_gen_batches=o.max_gen_batches if o.filter_groups else None,
                                   filter_metric=o.filter_metric,
                                   permuted_reward=o.permuted_reward if permuted_reward is None else permuted_reward,
                                   seed=o.seed, dtype=o.dtype)
        run_grpo(self.recipe, self.index, overrides, out, o.grpo_steps)

    def report(self, timings: dict[str, dict]) -> dict:
        """Write the report (always redone: it reads every stage's output)."""
        from verl_search.report.grpo_signal import read_rollouts, tokenizer_counter
        from verl_search.training.progress import logged_steps
        from verl_search.report.quickstart import load_probes, load_records, training_answer, write_report

        records = load_records(self.out)
        if records and self.index.is_dir():  # each evaluation's searches replayed on the BM25 index (under a
            from verl_search.report.funnel import write_gold_in_top_k  # second): "Where the answers were lost"

            write_gold_in_top_k(self.out, self.index, self.options.topk)
        elif records:
            logger.warning("%s does not exist: the report's searches are not replayed (no \"Where the answers were "
                           "lost\"); a kept gold_in_top_k.json is still read", self.index)
        seconds = self.out / "eval" / "seconds.json"
        if "evaluate" in timings and seconds.is_file():  # each evaluation's load and rollout seconds
            timings = {**timings, "evaluate": {**timings["evaluate"], "models": json.loads(seconds.read_text())}}
        steps = logged_steps(self.out / "grpo" / "metrics.jsonl")
        trained = self.out / "grpo" / "hf"
        count_tokens = tokenizer_counter(trained) if (trained / "tokenizer_config.json").is_file() else None
        meta = {"title": f"verl-search quickstart: {Path(self.options.model).name}, mini-wiki test split",
                "options": dataclasses.asdict(self.options), "recipe": str(self.recipe), "engine": self.engine,
                "trajectories": {name: f"eval/{name}/trajectories.jsonl" for name in records}}
        return write_report(self.out, records, timings, steps, meta, self.options.bootstrap_samples, self.options.seed,
                            read_rollouts(self.out / "grpo" / "rollouts"), count_tokens,
                            training_answer(self.train_file),
                            load_probes(self.out))


def run_quickstart(options: QuickstartOptions) -> dict:
    """Run (or resume) every stage, write the report and, with `options.export`, export the run;
    return the report (`report.json`).

    Every stage but the report runs in a child process (`runtime.child.in_child`) or launches one, so
    that this process holds none of verl, torch or Ray while training runs.

    With `options.start_from`, a new `out` first receives that study's stages before GRPO (`reuse.start_from`).

    Raises:
        ValueError: `options.out` holds a run made with other options (see `needs_run`), or `start_from`'s stages
            ran with other options.
        FileNotFoundError: the recipe or the model does not exist.
        RuntimeError: a trainer failed (the message names its log).
    """
    run = Quickstart(options)
    options = run.options
    run.out.mkdir(parents=True, exist_ok=True)
    stages = run.stages()
    if options.start_from:
        from verl_search.quickstart.reuse import start_from

        start_from(Path(options.start_from), run.out, stages, options)
    timings = run_stages(stages, options)
    report = run.report(timings)
    logger.info("report written to %s", run.out / "report.md")
    if options.export:
        from verl_search.quickstart.export import export_run

        files = export_run(run.out, Path(options.export))
        logger.info("exported %d files to %s", len(files), options.export)
    return report
