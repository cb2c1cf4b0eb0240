"""The docstrings' examples, run against the installed package.

pytest's `--doctest-modules` collects files from the checkout, which would put `src/` on `sys.path`
and import the source tree instead of the wheel CI installed; this walks the installed package.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

import verl_search


def _modules_with_examples() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(verl_search.__path__, "verl_search."):
        origin = importlib.util.find_spec(info.name).origin
        if origin and origin.endswith(".py") and ">>> " in Path(origin).read_text(encoding="utf-8"):
            names.append(info.name)
    return sorted(names)


MODULES = _modules_with_examples()


def test_examples_were_found():
    # a walk that finds nothing would pass every doctest vacuously
    assert {"verl_search.rewards.qa", "verl_search.rewards.score", "verl_search.retrieval.base"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    failures: list[str] = []
    tests = [t for t in finder.find(module) if t.examples]
    assert tests, f"{name} has '>>> ' in its source but no doctest was found"
    for test in tests:
        result = runner.run(test, out=failures.append)
        assert result.failed == 0, "".join(failures)
