"""The CPU-runnable parts of `benchmarks/gpu_check.sh` (the device check): its scripts parse, a dead server fails the
wait at once, and the exact-search step prints its numbers. The whole script runs on a tiny scale on the CPU with
`GPU_CHECK_CPU=1 bash benchmarks/gpu_check.sh` (about 3 minutes on 2 busy cores: not run here)."""

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HELPER = REPO / "benchmarks" / "gpu_check.py"


@pytest.mark.parametrize("script", ["gpu_check.sh", "prepare_gpu_check.sh"])
def test_the_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", str(REPO / "benchmarks" / script)], check=True)


@pytest.mark.parametrize("probe", [[], ["--probe"]])  # --probe: Search-R1's server, which has no /health
def test_a_dead_server_fails_the_wait_at_once(probe):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(HELPER), "wait", "http://127.0.0.1:9", str(gone.pid), "--timeout", "120",
                           *probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "exited before it was ready" in done.stderr
    assert time.monotonic() - started < 30  # python's start-up, not the 120-s deadline


def test_the_exact_step_prints_its_timings(capsys):
    spec = importlib.util.spec_from_file_location("gpu_check", HELPER)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    gpu_check.main(["exact", "--rows", "3000", "--dim", "16", "--device", "cpu", "--batches", "1", "8", "--reps", "1"])
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["step"] == "exact" and record["rows"] == 3000 and record["dtype"] == "float32"
    assert record["b1_ms"] > 0 and record["b8_ms"] > 0 and record["roofline_b8_ms"] > 0
