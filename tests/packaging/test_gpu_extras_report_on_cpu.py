"""The checker CI runs on pip's dry-run reports of the GPU extras (.ci/gpu_extras.sh), on a saved report.

tests/packaging/data/pip_report_vllm.json is `pip install --dry-run --ignore-installed --report` of the built
wheel with `[vllm]` (pip 26.3, Python 3.11, Linux x86_64), trimmed to each distribution's name, version and
requirements. The tests break it the ways a resolver or a careless pin could, and the checker must say so.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from verl_search.runtime.extras import EXTRAS
from verl_search.verl_config.version import SUPPORTED_VERL_VERSION

CHECKER = REPO / ".ci" / "check_install_report.py"
REPORT = REPO / "tests" / "packaging" / "data" / "pip_report_vllm.json"
EXPECTED = [f"verl=={SUPPORTED_VERL_VERSION}", "vllm", "torch", "transformers"]


def _checker():
    spec = importlib.util.spec_from_file_location("check_install_report", CHECKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads(REPORT.read_text())


def _with_version(report: dict, name: str, version: str | None) -> dict:
    """A copy of `report` where `name` has `version` (None: `name` removed from the set)."""
    changed = copy.deepcopy(report)
    changed["install"] = [item for item in changed["install"] if item["metadata"]["name"] != name or version]
    for item in changed["install"]:
        if item["metadata"]["name"] == name:
            item["metadata"]["version"] = version
    return changed


def test_the_saved_report_satisfies_every_pin(report):
    problems, versions = _checker().check_report(report, "verl-search", "vllm", EXPECTED)
    assert problems == []
    assert versions == {"verl": SUPPORTED_VERL_VERSION, "vllm": "0.24.0", "torch": "2.11.0", "transformers": "5.9.0"}


@pytest.mark.parametrize("name, version, expected", [
    # verl 0.9.1 requires transformers <5.11 (and its [vllm] extra ==5.9.0): a resolver picking 5.12.1 is caught
    ("transformers", "5.12.1", "transformers 5.12.1 was picked, but verl requires transformers"),
    # our own pin: verl-search[vllm] requires verl==0.9.1
    ("verl", "0.9.0", "verl 0.9.0 was picked, but verl-search requires verl==0.9.1"),
    # verl[vllm] pins torch 2.11.0
    ("torch", "2.13.0", "torch 2.13.0 was picked, but verl requires torch==2.11.0"),
    # the engine left out of the set
    ("vllm", None, "'vllm==0.24.0; extra == \"vllm\"' (required by verl) is not in the install set"),
])
def test_a_broken_set_is_named(report, name, version, expected):
    problems, _ = _checker().check_report(_with_version(report, name, version), "verl-search", "vllm", EXPECTED)
    assert any(expected in problem for problem in problems), problems


def test_an_expected_engine_missing_is_named(report):
    problems, _ = _checker().check_report(report, "verl-search", "vllm", ["sglang"])
    assert problems == ["expected sglang, but sglang is not in the install set"]


def test_cli_exit_codes(report, tmp_path):
    ok = subprocess.run([sys.executable, str(CHECKER), str(REPORT), "vllm", *EXPECTED],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert f"verl {SUPPORTED_VERL_VERSION}, vllm 0.24.0" in ok.stdout
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(_with_version(report, "transformers", "5.12.1")))
    bad = subprocess.run([sys.executable, str(CHECKER), str(broken), "vllm", *EXPECTED],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "[vllm] transformers 5.12.1 was picked" in bad.stderr


def test_ci_resolves_every_gpu_extra_the_package_names():
    script = (REPO / ".ci" / "gpu_extras.sh").read_text()
    resolved = set(re.search(r"^for extra in ([^;]+);", script, re.M).group(1).split())
    assert resolved == {"vllm", "sglang", "megatron", "dense-gpu"} and resolved <= set(EXTRAS)
