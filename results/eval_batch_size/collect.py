"""Copy what summarize.py reads out of quickstart run folders: the `evaluate` stage's record, each evaluation's
load and rollout seconds, and each model's prediction per question.

    python results/eval_batch_size/collect.py RUN_FOLDER TAG   # writes results/eval_batch_size/TAG.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
MODELS = ("untrained", "cold_start", "grpo")


def collect(run: Path) -> dict:
    stage = json.loads((run / "stages" / "evaluate.json").read_text())
    predictions = {}
    for model in MODELS:
        records = [json.loads(line) for line in (run / "eval" / model / "trajectories.jsonl").open()]
        predictions[model] = {r["id"]: r["prediction"] for r in records}
    return {"batch_size": stage["fingerprint"]["options"]["batch_size"], "stage_seconds": stage["seconds"],
            "model_seconds": json.loads((run / "eval" / "seconds.json").read_text()), "predictions": predictions}


if __name__ == "__main__":
    (HERE / f"{sys.argv[2]}.json").write_text(json.dumps(collect(Path(sys.argv[1])), indent=1) + "\n")
