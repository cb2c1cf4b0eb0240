"""Item 1 of issue 12, CI variant: `benchmarks/soak_retrieval_server.py` (the 60 s soak's own code)
run for 8 s after a 10 s warm-up, 256 concurrent aiohttp clients against the real dense server.
It cannot pass by accident: requests must have been answered (at least one per client), with zero
errors, the server still alive, and its RSS after the soak within 5% of its RSS after warm-up."""

import json
import os
import subprocess
import sys

from tests.conftest import REPO


def test_soak_256_clients_no_errors_no_growth(dense_index):
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "soak_retrieval_server.py"), "--index", str(dense_index),
         "--seconds", "8", "--warmup", "10", "--json"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    numbers = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert numbers["errors"] == 0 and numbers["warmup_errors"] == 0, numbers["first_errors"]
    assert numbers["requests"] >= 256, numbers  # every client got answers, not a quiet pass
    assert numbers["rss_warm_mb"] > 100 and numbers["growth_pct"] <= 5.0, numbers  # a real MiniLM server, no leak
    assert numbers["ok"]
