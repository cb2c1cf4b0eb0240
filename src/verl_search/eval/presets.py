"""Evaluation presets: `verl-search eval --preset search-r1|research` evaluates as each paper's code does.

A preset is a declared table: each of its `options` is an `EvalOptions` field set to the value the
paper's evaluation code uses, and each of its `fixed` settings is one our harness does not take as an
option (the metric, the chat template, a judge it has no option for); every setting names its
source (`path:line` in the reference repository at `Preset.commit`) and, where our harness cannot do
exactly the same, what it does otherwise (`differs`). docs/eval.md ("Presets") shows the same tables;
`tests/eval/test_presets_on_cpu.py` checks they agree key by key.

The presets set no data, index or model: the papers' question sets and retrievers (e5-base-v2 over
2018 Wikipedia for both) are the run's `--data` and `--index`. Standard library only, nothing done on
import (the CLI builds `eval`'s flags from `EvalOptions`, which imports `PresetName` from here).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

logger = logging.getLogger(__name__)

PresetName = Literal["search-r1", "research"]


@dataclass(frozen=True)
class Setting:
    """One evaluation setting of a paper's code.

    Attributes:
        value: the `EvalOptions` field's value (in `Preset.options`), or what the reference does, in a
            few words (in `Preset.fixed`).
        source: where the reference sets it: `path:line`, `path:first-last` or `path:a,b`, several joined
            by `; `, in the preset's repository at its commit.
        differs: what our harness does otherwise; empty where it does the same.
    """

    value: Any
    source: str
    differs: str = ""


@dataclass(frozen=True)
class Preset:
    """A paper's evaluation settings.

    Attributes:
        name: the `--preset` value.
        repository, commit: the reference code (GitHub `owner/name`, full commit hash) the sources point into.
        entry: the reference's evaluation entry point the settings are read from.
        options: `EvalOptions` field name -> `Setting`; applied by `with_preset`.
        fixed: setting name -> `Setting`: what the harness does without an option (documented only).
    """

    name: str
    repository: str
    commit: str
    entry: str
    options: dict[str, Setting]
    fixed: dict[str, Setting]

    def option_values(self) -> dict[str, Any]:
        """`{EvalOptions field: value}` of this preset."""
        return {key: setting.value for key, setting in self.options.items()}


_SR1_ROLLOUT = "verl/workers/rollout/vllm_rollout/vllm_rollout.py"
_SR1_LOOP = "search_r1/llm_agent/generation.py"
_SR1_EVAL = "scripts/nq_hotpotqa/evaluate.sh"

SEARCH_R1 = Preset(
    name="search-r1",
    repository="PeterGriffinJin/Search-R1",
    commit="a14dc3a4ffc6fe88c1e95038d9738e21ba3f7a06",
    entry=f"{_SR1_EVAL} (verl's validation only: +trainer.val_only=true)",
    options={
        "protocol": Setting("search_r1", f"scripts/data_process/nq_search.py:32-36; {_SR1_LOOP}:353-436"),
        "max_turns": Setting(4, f"{_SR1_EVAL}:63; {_SR1_LOOP}:234,279-298"),
        "topk": Setting(3, f"{_SR1_EVAL}:65"),
        "max_tokens_per_turn": Setting(
            500, f"{_SR1_EVAL}:21; verl/trainer/config/ppo_trainer.yaml:73; {_SR1_ROLLOUT}:108"),
        "max_obs_tokens": Setting(500, f"{_SR1_EVAL}:23; {_SR1_LOOP}:87-89", differs=(
            "a cut observation keeps its closing `</information>` here; Search-R1 cuts the tokens where they "
            "reach 500")),
        "prompt_length": Setting(2048, f"{_SR1_EVAL}:22; {_SR1_LOOP}:223", differs=(
            "both keep the last 2,048 tokens of a longer prompt (`max_start_length`; verl with a warning), but "
            "Search-R1 refuses one over 4,096 (`data.max_prompt_length`, `scripts/nq_hotpotqa/evaluate.sh:20`). "
            "QA prompts are far shorter")),
        "response_length": Setting(4500, f"{_SR1_EVAL}:21,23,63; {_SR1_LOOP}:234,279-298", differs=(
            "Search-R1 has no cap on the whole response: its loop bounds it at 4 x (500 + 500) + 500 = 4,500 "
            "tokens, this value. It shows the model only the last 4,096 tokens of prompt and response "
            f"(`{_SR1_LOOP}:108-115`), so a trajectory longer than that loses the start of its prompt; ours "
            "shows all")),
        "temperature": Setting(0.0, f"verl/trainer/ppo/ray_trainer.py:508; {_SR1_ROLLOUT}:162-171"),
        "samples": Setting(1, f"{_SR1_EVAL}:42; verl/trainer/ppo/ray_trainer.py:501; {_SR1_ROLLOUT}:170"),
    },
    fixed={
        "metric": Setting("EM", "verl/trainer/main_ppo.py:25-27; verl/utils/reward_score/qa_em.py:36-46,85-110",
                          differs="ours reports F1 and cover-EM beside EM"),
        "judge": Setting("none", "verl/trainer/main_ppo.py:25-29"),
        "chat_template": Setting("when the tokenizer has one", "verl/utils/dataset/rl_dataset.py:128-131"),
    },
)

_RS_PIPE = "src/flashrag/pipeline/active_pipeline.py"
_RS_GEN = "src/flashrag/generator/generator.py"
_RS_CONFIG = "scripts/evaluation/eval_config.yaml"

RESEARCH = Preset(
    name="research",
    repository="Agent-RL/ReCall",  # ReSearch's repository, renamed; ReSearch is its branch re-search
    commit="4bdb872b7187ec6c19337251f57f9614ba7ce5ab",
    entry="scripts/evaluation/run_eval.py --method_name research (branch re-search)",
    options={
        "protocol": Setting("research", f"{_RS_PIPE}:26-29,44-91"),
        "max_turns": Setting(7680, f"{_RS_PIPE}:57", differs=(
            "ReSearch has no search cap; each search takes at least one of the 7,680 response tokens, so this cap "
            "never binds")),
        "topk": Setting(5, f"{_RS_CONFIG}:19; src/flashrag/retriever/retriever.py:453-457"),
        "max_tokens_per_turn": Setting(8192, f"{_RS_GEN}:323; {_RS_CONFIG}:32", differs=(
            "each turn gets at most what is left of the response, as SGLang clips `max_new_tokens` to the context")),
        "max_obs_tokens": Setting(8192, f"{_RS_PIPE}:66-76", differs=(
            "ReSearch appends the whole result; ours cuts a `<result>` block to what is left of the response "
            "(keeping `</result>`), where ReSearch's next call would find the context full")),
        "prompt_length": Setting(512, "scripts/train/train.sh:8", differs=(
            "ReSearch's evaluation caps prompts only by the 8,192-token context; 512 is its training's cap, and "
            "verl keeps the last 512 tokens of a longer prompt (with a warning). ReSearch's instruct prompt with "
            "a question is about 230 Qwen2.5 tokens")),
        "response_length": Setting(7680, f"README.md:118; {_RS_CONFIG}:32; {_RS_PIPE}:55-57,89", differs=(
            "ReSearch bounds prompt + response by the 8,192-token context (SGLang `--context-length 8192`); ours "
            "bounds the response at 8,192 - 512 tokens: about 280 fewer after a 230-token prompt. ReSearch "
            f"scores a response cut at the context as no answer (`{_RS_PIPE}:81-85,94-95`); ours reads its "
            "boxed answer")),
        "temperature": Setting(0.0, f"{_RS_CONFIG}:34; {_RS_GEN}:318-321"),
        "samples": Setting(1, f"{_RS_PIPE}:58"),
        "judge_model": Setting("gpt-4o-mini", "scripts/evaluation/llm_judge.py:104-106", differs=(
            "the judge runs only with `--judge-url`, an OpenAI-compatible endpoint serving it (OpenAI's: "
            "`https://api.openai.com/v1`, key in `$VERL_SEARCH_JUDGE_API_KEY`); without it the report has no "
            "judge column")),
    },
    fixed={
        "metric": Setting("EM, F1, acc, precision, recall", f"{_RS_CONFIG}:39", differs=(
            "ours reports EM, F1 and cover-EM (FlashRAG's acc, `src/flashrag/evaluator/metrics.py:178-181`), "
            "not precision or recall")),
        "chat_template": Setting(
            "applied (--apply_chat True)", f"scripts/evaluation/run_eval.py:95; {_RS_PIPE}:26-29,45-51", differs=(
            "ours applies it when the tokenizer has one (Qwen2.5 base tokenizers do); run_eval.py's `type=bool` "
            "flag reads `--apply_chat False` as True, so ReSearch applied it to base models too")),
    },
)

PRESETS: dict[str, Preset] = {preset.name: preset for preset in (SEARCH_R1, RESEARCH)}


def get_preset(name: str) -> Preset:
    """The preset called `name`.

    Raises:
        ValueError: no preset of that name (the message names it and the choices).
    """
    if name not in PRESETS:
        raise ValueError(f"--preset {name!r}: no such preset; choices: {', '.join(PRESETS)}")
    return PRESETS[name]


def with_preset(values: dict[str, Any]) -> dict[str, Any]:
    """`values` (flag name -> value, `None` = not given, as the CLI parses `eval`'s flags) over the
    option values of the preset `values["preset"]` names: a given flag wins over the preset. Without a
    preset, `values` unchanged. Logs the preset, its values and the flags that override them.

    >>> merged = with_preset({"preset": "search-r1", "topk": 5, "max_turns": None})
    >>> merged["max_turns"], merged["topk"], merged["preset"]
    (4, 5, 'search-r1')

    Raises:
        ValueError: an unknown preset name (`get_preset`).
    """
    name = values.get("preset")
    if not name:
        return dict(values)
    preset = get_preset(name)
    given = {key: value for key, value in values.items() if value is not None}
    overridden = sorted(key for key in preset.options if key in given)
    logger.info("preset %s (%s@%s): %s%s", name, preset.repository, preset.commit[:7],
                ", ".join(f"{k}={v}" for k, v in preset.option_values().items()),
                f"; given flags win: {', '.join(overridden)}" if overridden else "")
    merged = {**preset.option_values(), **given}
    if merged.get("judge_model") and not merged.get("judge_url"):
        logger.warning("preset %s: the judge %s runs only with --judge-url (an OpenAI-compatible endpoint serving it)",
                       name, merged["judge_model"])
    return merged
