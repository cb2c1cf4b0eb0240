"""Test-only: a fitted tiny model kept in `$VERL_SEARCH_TEST_CACHE` (CI sets it for its whole run), keyed by
everything its fit reads, so that the tests that fit the same model fit it once."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


FIT_LOCK = Path(tempfile.gettempdir()) / "verl-search-tests-fit.lock"
"""Held by the fit in progress: one fit at a time on the machine, whichever pytest process runs it."""


def cached_fit(name: str, inputs: list, fallback: Path, fit: Callable[[Path], object]) -> Path:
    """The folder of the model `fit(folder)` writes: `$VERL_SEARCH_TEST_CACHE/{name}_{hash of inputs}` where the
    cache is set (fitted once), else `fallback`.

    Fits take turns (`FIT_LOCK`), and a model another process fitted while this one waited is taken as it is, not
    fitted twice. README's test command starts three workers whose first modules each fit a stand-in before their
    trainer run or vLLM engine, and those runs take turns (tests/trainer_runs.py): side by side on 2 cores, every fit
    ends late (the first engine turn began 137 s into the suite in a CI run of 2026-11-30); one at a time, the first
    ends sooner and the others run beside the engine turns. Measured with two modules that fit the same stand-in
    (`eval/test_eval_vllm_on_cpu.py`, `integration/test_partial_rollout_on_cpu.py`; `-n 2`, an empty cache, one run
    after the other): the engine turn began 73 s into the run with both fitting it, 56 s with one fitting it while
    the other waited; the run took 197.8 s against 177.5 s."""
    from filelock import FileLock

    cache = os.environ.get("VERL_SEARCH_TEST_CACHE")
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    model = Path(cache) / f"{name}_{key}" if cache else Path(fallback)
    if (model / "fitted.json").is_file():
        return model
    with FileLock(str(FIT_LOCK)):
        if not (model / "fitted.json").is_file():
            partial = model.with_name(model.name + f".partial{os.getpid()}")
            shutil.rmtree(partial, ignore_errors=True)
            fit(partial)
            partial.rename(model)
    return model
