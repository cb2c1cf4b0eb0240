"""Means over the 2 steps of each variant's verl metrics (the table in docs/benchmarks/observation-window.md).

    python results/observation_window_cost/summarize.py
"""

import json
from pathlib import Path

KEYS = ["response_length/mean", "perf/total_num_tokens", "timing_s/gen", "timing_s/update_actor",
        "timing_s/old_log_prob", "timing_s/step", "timing_per_token_ms/update_actor"]

for budget in (160, 320, 480, 640):
    lines = (Path(__file__).parent / f"obs{budget}_metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["data"] for line in lines]
    print(budget, " ".join(f"{key}={sum(s[key] for s in steps) / len(steps):.1f}" for key in KEYS))
