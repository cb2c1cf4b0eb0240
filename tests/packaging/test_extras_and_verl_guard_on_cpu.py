"""Optional parts and the verl version guard: missing pieces and another verl stop with one clear line."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from verl_search import cli
from verl_search.runtime.extras import MissingExtraError, install_line, require_extra
from verl_search.verl_config import version

RECIPE = REPO / "examples" / "grpo_qwen2.5-3b-instruct_tool" / "config.yaml"


def _run_cli_without(module: str, *argv: str) -> subprocess.CompletedProcess:
    """`verl-search ARGV` in a fresh interpreter where `module` cannot be imported (as if not installed)."""
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            "from verl_search.cli import main\n"
            f"sys.exit(main({list(argv)!r}))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv", [("eval", "--out", "unused"), ("check-config", str(RECIPE))])
def test_verl_command_without_verl_exits_2_naming_the_extra(argv):
    done = _run_cli_without("verl", *argv)
    assert done.returncode == 2, done.stderr
    assert install_line("verl") in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_ray_without_ray_exits_2_naming_the_extra():
    done = _run_cli_without("ray", "serve", "--index", "unused", "--ray")
    assert done.returncode == 2, done.stderr
    assert install_line("ray") in done.stderr and "Traceback" not in done.stderr


def test_serve_parser_does_not_need_the_verl_side():
    # the retrieval service's CLI must build without pandas / omegaconf / verl
    code = ("import sys\n"
            "for m in ('verl', 'pandas', 'omegaconf', 'hydra', 'torch'): sys.modules[m] = None\n"
            "from verl_search.cli import build_parser\n"
            "build_parser().parse_args(['serve', '--index', 'x'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_require_extra_names_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)
    with pytest.raises(MissingExtraError, match=re.escape(install_line("dense"))):
        require_extra("dense")
    with pytest.raises(KeyError, match="unknown extra 'nope'"):
        require_extra("nope")


def test_supported_version_passes_and_another_names_both(monkeypatch):
    version.check_verl_version(version.SUPPORTED_VERL_VERSION)
    with pytest.raises(version.UnsupportedVerlVersion) as raised:
        version.check_verl_version("0.10.0.dev0")
    assert "verl 0.10.0.dev0 is installed" in str(raised.value)
    assert f"supports verl {version.SUPPORTED_VERL_VERSION} only" in str(raised.value)
    monkeypatch.setenv(version.SKIP_CHECK_ENV, "1")
    version.check_verl_version("0.10.0.dev0")


def test_installed_verl_is_the_supported_one():
    assert version.installed_verl_version() == version.SUPPORTED_VERL_VERSION


@pytest.fixture
def other_verl(monkeypatch):
    monkeypatch.delenv(version.SKIP_CHECK_ENV, raising=False)
    monkeypatch.setattr(version, "installed_verl_version", lambda: "0.10.0")


def test_check_config_stops_on_another_verl(other_verl, caplog):
    with caplog.at_level(logging.ERROR, logger="verl_search"):
        assert cli.main(["check-config", str(RECIPE)]) == 2
    assert "verl 0.10.0 is installed" in caplog.text and version.SUPPORTED_VERL_VERSION in caplog.text


def test_eval_stops_on_another_verl(other_verl, caplog, tmp_path):
    with caplog.at_level(logging.ERROR, logger="verl_search"):
        assert cli.main(["eval", "--out", str(tmp_path / "run")]) == 2
    assert "verl 0.10.0 is installed" in caplog.text
    assert not (tmp_path / "run").exists()  # stopped before doing anything


def test_agent_loop_and_tool_construction_stop_on_another_verl(other_verl):
    from verl_search.agent_loop.search_r1 import SearchR1AgentLoop
    from verl_search.tools.search_tool import SearchTool

    with pytest.raises(version.UnsupportedVerlVersion, match="verl 0.10.0 is installed"):
        SearchR1AgentLoop(trainer_config=None, server_manager=None, tokenizer=None, processor=None,
                          dataset_cls=None, data_config=None, a_keyword_a_newer_verl_passes=1)
    with pytest.raises(version.UnsupportedVerlVersion):
        SearchTool({"retrieval_service_url": "http://127.0.0.1:1/retrieve"})


@pytest.mark.parametrize("direct_url, line", [
    (None, 'pip install "verl-search[verl]"'),  # from an index that has it
    ({"url": "https://github.com/org/verl-search", "vcs_info": {"vcs": "git", "commit_id": "abc123"}},
     'pip install "verl-search[verl] @ git+https://github.com/org/verl-search@abc123"'),
    ({"url": "file://{repo}", "dir_info": {"editable": True}}, 'pip install -e "{repo}[verl]"'),
    ({"url": "file://{repo}", "dir_info": {}}, 'pip install "{repo}[verl]"'),
    ({"url": "file:///nowhere/verl_search-0.1-py3-none-any.whl", "archive_info": {}}, 'pip install "verl-search[verl]"'),
])
def test_install_line_names_the_source_verl_search_came_from(monkeypatch, direct_url, line):
    """The hint repeats the source of this install (PEP 610 direct_url.json): the package is not on PyPI."""
    import importlib.metadata

    text = None if direct_url is None else json.dumps(direct_url).replace("{repo}", str(REPO))

    class Distribution:
        def read_text(self, name):
            return text if name == "direct_url.json" else None

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Distribution())
    assert install_line("verl") == line.replace("{repo}", str(REPO))


@pytest.mark.parametrize("extra", ["sglang", "megatron"])
def test_gpu_trainer_extras_name_their_install_line(extra):
    # SGLang and Megatron-LM are never installed on a CPU machine: the real "missing" path
    with pytest.raises(MissingExtraError, match=re.escape(install_line(extra))):
        require_extra(extra)
