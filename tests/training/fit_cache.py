"""Test-only: a fitted tiny model kept in `$VERL_SEARCH_TEST_CACHE` (CI sets it for its whole run), keyed by
everything its fit reads, so that the tests that fit the same model fit it once."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path


def cached_fit(name: str, inputs: list, fallback: Path, fit: Callable[[Path], object]) -> Path:
    """The folder of the model `fit(folder)` writes: `$VERL_SEARCH_TEST_CACHE/{name}_{hash of inputs}` where the
    cache is set (fitted once; a concurrent fit of the same model is discarded), else `fallback`."""
    cache = os.environ.get("VERL_SEARCH_TEST_CACHE")
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    model = Path(cache) / f"{name}_{key}" if cache else Path(fallback)
    if not (model / "fitted.json").is_file():
        partial = model.with_name(model.name + f".partial{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        fit(partial)
        try:
            partial.rename(model)
        except OSError:  # fitted by another process meanwhile
            shutil.rmtree(partial, ignore_errors=True)
    return model
