"""The 1-epoch cold start of this folder: a finished main-job run's cold start again with `epochs=1` (every other
setting the quickstart's), evaluated as the quickstart's `evaluate` stage evaluates (its protocol options, its
102 test questions, one start of verl's vLLM rollout).

Usage: python one_epoch.py RUN OUT   (RUN: README's main job's folder, e.g. runs/quickstart; OUT: a new folder)
"""

import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

from verl_search.eval.harness import run_evals
from verl_search.quickstart.options import QuickstartOptions, for_model
from verl_search.quickstart.pipeline import Quickstart
from verl_search.training.cold_start import run_cold_start


def main(run: Path, out: Path) -> None:
    logging.basicConfig(level=logging.INFO)
    quickstart = Quickstart(QuickstartOptions(out=str(run)))
    options = dataclasses.replace(quickstart.cold_start_options(), epochs=1)
    started = time.perf_counter()
    model = run_cold_start(quickstart.base_model(), quickstart.index, quickstart.train_file, out / "cold_start",
                           options)
    sft_seconds = time.perf_counter() - started
    evaluation = for_model(quickstart.protocol, str(model), quickstart.test_file, out / "eval" / "cold_start_1_epoch")
    summary = run_evals([evaluation])[0]
    print(json.dumps({"cold_start_seconds": round(sft_seconds, 1), "all": summary.get("all")}, default=str))


if __name__ == "__main__":  # the quickstart's child processes are spawned: they re-import this file
    main(Path(sys.argv[1]), Path(sys.argv[2]))
