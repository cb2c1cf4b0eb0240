"""Keep GRPO's checkpoints of chosen steps while `verl-search study` trains.

The study's GRPO stage saves every step and keeps only the newest checkpoint
(`trainer.save_freq=1`, `trainer.max_actor_ckpt_to_keep=1`). This script polls the stage's checkpoint folder
and, once verl has finished saving step N (its `latest_checkpointed_iteration.txt` says N), hard-links
`global_step_N/actor` into `--keep/global_step_N/actor` before the next step's save deletes it (hard links:
no copy, no extra disk). It exits when every step asked for is kept.

    python results/learning_run_steps/keep_steps.py runs/steps12/grpo/ckpt --steps 4 8 --keep runs/steps12_kept
"""

import argparse
import os
import shutil
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt", type=Path, help="the GRPO stage's checkpoint folder (RUN/grpo/ckpt)")
    parser.add_argument("--steps", type=int, nargs="+", required=True)
    parser.add_argument("--keep", type=Path, required=True)
    parser.add_argument("--poll-seconds", type=float, default=5.0)
    args = parser.parse_args()
    left = set(args.steps)
    while left:
        marker = args.ckpt / "latest_checkpointed_iteration.txt"
        step = int(marker.read_text().strip()) if marker.is_file() else 0
        if step in left:
            source, target = args.ckpt / f"global_step_{step}" / "actor", args.keep / f"global_step_{step}" / "actor"
            shutil.copytree(source, target, copy_function=os.link)
            print(f"kept step {step}: {target}", flush=True)
            left.discard(step)
        time.sleep(args.poll_seconds)


if __name__ == "__main__":
    main()
