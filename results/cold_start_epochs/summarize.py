"""The GRPO table of this folder's README, recomputed from the two GRPO stages' verl metrics: per step, the groups
generated (`search/groups/generated`; 2 were trained at each step), the score before filtering, and the seconds of
generation, old log-probs, update and the whole step.

Usage: python results/cold_start_epochs/summarize.py
"""

import gzip
import json
from pathlib import Path

HERE = Path(__file__).parent
COLUMNS = ("timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor", "timing_s/step")


def main() -> None:
    print("| cold start | step | groups generated | score before filtering | generation s | old log-probs s "
          "| update s | step s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in ("2_epochs", "1_epoch"):
        with gzip.open(HERE / f"grpo_metrics_{name}.jsonl.gz", "rt") as lines:
            for line in lines:
                record = json.loads(line)
                data = record.get("data", record)
                generated = data["search/groups/generated"]
                cells = " | ".join(f"{data[key]:.0f}" for key in COLUMNS)
                print(f"| {name.replace('_', ' ')} | {record['step']} | {generated:.0f} "
                      f"| {data['search/score_before_filter/mean']:.2f} | {cells} |")


if __name__ == "__main__":
    main()
