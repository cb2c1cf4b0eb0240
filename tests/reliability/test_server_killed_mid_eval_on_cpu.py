"""`verl-search eval` (run_eval, verl's AgentLoopWorker, one event loop for the
whole run, so one pooled aiohttp session) with `ScriptedLLM` standing in for the GPU engine,
against the real `python -m verl_search.server` process. The server is SIGKILLed when the second
of three batches starts and restarted on the same port when the third starts: every trajectory
completes, the failed searches are flagged and counted, and the searches after the restart
succeed (the pooled client reconnects; no stale-connection error reaches a trajectory)."""

import json
import signal

from transformers import AutoTokenizer

from tests.conftest import MINI_QA
from tests.reliability.scripted_eval import question_of, script
from tests.verl_helpers import ScriptedLLM
from verl_search.eval.harness import EvalOptions, run_eval
from verl_search.server.local import SubprocessServer


def test_server_killed_and_restarted_mid_run(tmp_path, tiny_qwen, bm25_index):
    first = SubprocessServer(["--index", str(bm25_index)], ready_timeout=120).start()
    servers = [first]
    seen: list[str] = []

    def chaos(prompt_text, turn):
        question = question_of(prompt_text)
        if question not in seen:
            seen.append(question)
            if len(seen) == 3:  # batch 2 starts: kill -9 the server
                first.process.send_signal(signal.SIGKILL)
                first.process.wait(30)
            elif len(seen) == 5:  # batch 3 starts: a new server on the same port
                again = SubprocessServer(["--index", str(bm25_index)], ready_timeout=120)
                again.port, again.url = first.port, first.url
                servers.append(again.start())
        return script(prompt_text, turn)

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    options = EvalOptions(data=[str(MINI_QA)], out=str(tmp_path / "run"), retrieval_url=f"{first.url}/retrieve",
                          max_per_source=2, batch_size=2)
    try:
        summary = run_eval(options, engine=(ScriptedLLM(tokenizer, chaos), tokenizer, str(tiny_qwen)))
    finally:
        for server in servers:
            server.stop()
    assert len(servers) == 2
    lines = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    records = {question_of(r["question"]): r for r in map(json.loads, lines)}
    assert len(lines) == 6 and len(records) == 6  # every trajectory completed, once
    assert all(r["answered"] and r["num_searches"] == 1 for r in records.values())  # the loop went on
    for position, question in enumerate(seen):
        record = records[question]
        if position in (2, 3):  # searched while the server was dead: flagged and counted
            assert record["failed_searches"] == 1, record
            assert "cannot connect to the retrieval service" in record["search_errors"][0]
            assert "search failed" in record["turns"][0]["observation"]
        else:  # before the kill, and after the restart through the same pooled client
            assert record["failed_searches"] == 0 and record["search_errors"] == [], record
            assert record["turns"][0]["observation"].startswith("\n\n<information>Doc 1(Title:")
    assert summary["all"]["failed_searches"] == 2
