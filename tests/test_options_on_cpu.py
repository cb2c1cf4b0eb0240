"""One declaration per option: CLI flags come from the option classes; `VERL_SEARCH_*` through env.py."""

import subprocess
import sys
from dataclasses import fields

from verl_search import cli
from verl_search.agent_protocol.registry import get_protocol
from verl_search.eval.options import EvalOptions
from verl_search.agent_protocol.vocabulary import DEFAULT_TOPK
from verl_search.retrieval.hybrid import HybridOptions
from verl_search.retrieval.index_builder import BuildOptions
from verl_search.retrieval.rerank import RerankOptions
from verl_search.runtime import env
from verl_search.runtime.options import flag_name, option_fields
from verl_search.server.serve import RayOptions, ServeOptions
from verl_search.server.settings import ServerSettings
from verl_search.tools.client import SearchClientConfig
from verl_search.server.web.options import WebOptions


def _flags(*argv):
    parser = cli.build_parser(argv[0])
    sub = next(a for a in parser._actions if a.dest == "command").choices[argv[0]]
    if argv[0] == "index":
        sub = next(a for a in sub._actions if a.dest == "index_command").choices["build"]
    return {option for action in sub._actions for option in action.option_strings} - {"-h", "--help"}


def test_every_option_field_is_a_flag_and_every_flag_a_field():
    assert _flags("serve") == {flag_name(s) for s in option_fields(ServeOptions) + option_fields(ServerSettings)
                               + option_fields(RayOptions) + option_fields(HybridOptions)
                               + option_fields(RerankOptions) + option_fields(WebOptions)}
    assert _flags("index") == {flag_name(s) for s in option_fields(BuildOptions)} | {"--corpus", "--out"}
    assert _flags("eval") == {flag_name(s) for s in option_fields(EvalOptions)}


def test_the_quickstart_lists_a_users_flags_and_the_study_adds_its_own():
    from verl_search.quickstart.options import QuickstartOptions, StudyOptions

    quickstart, study = _flags("quickstart"), _flags("study")
    assert quickstart == {flag_name(s) for s in option_fields(QuickstartOptions)} and len(quickstart) <= 15
    assert study == {flag_name(s) for s in option_fields(StudyOptions)} and quickstart < study
    assert {"--frontier-questions", "--control", "--permuted-reward", "--export", "--grpo-lr"} <= study - quickstart
    # the main job is the study at its defaults: the same options, so the same stage fingerprints
    assert StudyOptions.of(QuickstartOptions(grpo_steps=3)) == StudyOptions(grpo_steps=3)


def test_cli_defaults_are_the_classes_defaults():
    args = cli.build_parser("serve").parse_args(["serve", "--index", "x"])
    assert {f: getattr(args, f) for f in ServerSettings.model_fields} == ServerSettings().model_dump()
    args = cli.build_parser("serve").parse_args(["serve", "--index", "x", "--no-micro-batching", "--max-topk", "7"])
    assert args.micro_batching is False and args.max_topk == 7
    args = cli.build_parser("index").parse_args(["index", "build", "--corpus", "c", "--out", "o"])
    assert {f.name: getattr(args, f.name) for f in fields(BuildOptions)} == vars(BuildOptions())


def test_topk_default_is_declared_once():
    assert ServerSettings().default_topk == SearchClientConfig().topk == DEFAULT_TOPK
    # eval's default is the protocol's own: Search-R1's 3 for search_r1 and tool, ReSearch's 5 for research
    assert EvalOptions(data=[]).topk is None
    assert get_protocol("search_r1").default_topk == get_protocol("tool").default_topk == DEFAULT_TOPK
    assert get_protocol("research").default_topk == 5


SERVE_IMPORTS = """
import sys
from verl_search import cli
rc = cli.main(["serve", "--index", "/nonexistent"])
eval_side = ("verl_search.eval", "verl_search.tools", "verl_search.agent_loop", "pandas", "omegaconf", "verl.")
print(rc, sorted(m for m in sys.modules if m.startswith(eval_side) or m == "verl"))
"""


def test_serve_imports_nothing_of_the_eval_side(tmp_path):
    script = tmp_path / "serve_imports.py"
    script.write_text(SERVE_IMPORTS)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "2 []", result.stderr  # exit code 2 (no such index), nothing of eval loaded


def test_env_is_read_in_one_place(monkeypatch, tmp_path):
    snapshot = env.read_env({})
    assert snapshot.url == env.DEFAULT_URL and not snapshot.skip_verl_version_check and snapshot.tool_config is None
    monkeypatch.setenv(env.CACHE, str(tmp_path))
    monkeypatch.setenv(env.SKIP_VERL_VERSION_CHECK, "1")
    assert env.read_env().cache_dir == tmp_path and env.read_env().skip_verl_version_check
