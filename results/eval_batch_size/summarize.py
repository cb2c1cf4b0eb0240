"""Print the table of README.md from the kept runs (`*.json`, written by collect.py): per run its batch size,
the `evaluate` stage's seconds and each model's rollout seconds; per later run, the ratio to the first one and the
questions whose prediction differs from the first run's.

    python results/eval_batch_size/summarize.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
RUNS = ("1_batch34", "2_batch102", "3_batch34")
MODELS = ("untrained", "cold_start", "grpo")


def main() -> None:
    runs = {name: json.loads((HERE / f"{name}.json").read_text()) for name in RUNS}
    first = runs[RUNS[0]]
    print("| run | batch size | evaluate stage s | " + " | ".join(f"{m} rollout s" for m in MODELS)
          + " | rollouts s | vs run 1 | predictions differing from run 1 |")
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in MODELS) + " | ---: | ---: | ---: |")
    for name, run in runs.items():
        rollouts = [run["model_seconds"][m]["rollout"] for m in MODELS]
        ratio = sum(rollouts) / sum(first["model_seconds"][m]["rollout"] for m in MODELS)
        differing = sum(run["predictions"][m][q] != first["predictions"][m][q]
                        for m in MODELS for q in first["predictions"][m])
        total = sum(len(first["predictions"][m]) for m in MODELS)
        cells = [name, run["batch_size"], f"{run['stage_seconds']:.1f}", *(f"{s:.1f}" for s in rollouts),
                 f"{sum(rollouts):.1f}", f"{ratio:.2f}x", f"{differing} of {total}"]
        print("| " + " | ".join(str(cell) for cell in cells) + " |")


if __name__ == "__main__":
    main()
