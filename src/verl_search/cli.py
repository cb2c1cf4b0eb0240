"""`verl-search` command line: `index build|check`, `serve`, `eval`, `train`, `check-config`, `preprocess`, ...

`index build`, `index check`, `serve` and `repeats` run on the base install; `eval`, `check-config` and
`preprocess` need the `[verl]` extra and exit 2 with the `pip install` line when it is missing (see
`verl_search.runtime.extras`).

Each sub-command is a thin wrapper: it parses arguments, calls the library, and turns expected
errors (bad paths, mismatched index) into a one-line message and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from verl_search import __version__
from verl_search.runtime.exits import EXPECTED_ERRORS, configure_logging, exit_code
from verl_search.runtime.extras import require_extra
from verl_search.verl_config.version import UnsupportedVerlVersion, check_verl_version

logger = logging.getLogger("verl_search")

#: sub-commands that need an extra: checked before the command imports anything of it
NEEDS_EXTRA = {"eval": "verl", "check-config": "verl", "train": "verl", "preprocess": "verl",
               "quickstart": "verl", "study": "verl"}
#: sub-commands that drive verl: they stop on another verl version (verl_search.verl_config.version)
NEEDS_VERL = {"eval", "check-config", "train", "quickstart", "study"}


def _add_index_build_arguments(build) -> None:
    from verl_search.runtime.options import add_arguments
    from verl_search.retrieval.index_builder import BuildOptions

    build.add_argument("--corpus", required=True, help='JSONL corpus (.gz too): {"id": ..., "contents": "\\"Title\\"\\ntext"} '
                       "per line, or a shipped corpus by name: mini-wiki")
    build.add_argument("--out", required=True, help="output index folder (appears only when complete)")
    add_arguments(build, BuildOptions)


def _add_index_check_arguments(check) -> None:
    from verl_search.eval.index_check import IndexCheckOptions
    from verl_search.retrieval.hybrid import HybridOptions
    from verl_search.runtime.options import add_arguments

    check.add_argument("index", help="index folder (or a Search-R1 faiss file with --corpus and --encoder)")
    check.add_argument("--corpus", help="the JSONL corpus (default: the manifest's)")
    check.add_argument("--encoder", help="the encoder folder (default: the manifest's)")
    add_arguments(check, IndexCheckOptions)
    add_arguments(check.add_argument_group("hybrid index: fusion, as serve takes it (HybridOptions)"), HybridOptions)


def _add_serve_arguments(serve) -> None:
    from verl_search.server.command import add_serve_arguments

    add_serve_arguments(serve)


def _add_eval_arguments(ev) -> None:
    # Defaults live in EvalOptions (one home): the flags are generated from it with default None,
    # meaning "EvalOptions' default". eval.options is standard library only.
    from verl_search.eval.options import EvalOptions
    from verl_search.runtime.options import add_arguments

    from verl_search.datasets import DEFAULT_EVAL_DATA

    ev.add_argument("--data", action="append", help="[NAME=]PATH of FlashRAG JSONL or verl parquet, or a shipped "
                    f"question set (mini-wiki, mini-wiki:train, mini-wiki:test); repeatable; default: {DEFAULT_EVAL_DATA}")
    add_arguments(ev, EvalOptions, skip=("data", "retrieval_url", "index"), defaults_in_class=True)
    add_arguments(ev.add_mutually_exclusive_group(), EvalOptions, only=("retrieval_url", "index"), defaults_in_class=True)


def _add_check_config_arguments(check) -> None:
    check.add_argument("recipe", help="recipe YAML (extends ppo_trainer via hydra.searchpath)")
    check.add_argument("overrides", nargs=argparse.REMAINDER, help="hydra overrides, as for verl.trainer.main_ppo")


def _add_preprocess_arguments(pre) -> None:
    from verl_search.datasets.preprocess import PreprocessOptions
    from verl_search.runtime.options import add_arguments

    pre.add_argument("--input", action="append", nargs="+", required=True, dest="inputs",
                     help="[NAME=]PATH of FlashRAG JSONL (.gz too), or a shipped question set (mini-wiki:train); "
                          "repeatable, several paths each; NAME (default: the file's folder) is the data_source")
    add_arguments(pre, PreprocessOptions, skip=("inputs",))


def _add_download_arguments(down) -> None:
    down.add_argument("names", nargs="+", choices=["wiki18", "e5-index", "e5-model", "datasets"])
    down.add_argument("--out", required=True, help="folder to write to")


def _add_train_arguments(train) -> None:
    train.add_argument("recipe", help="recipe YAML, e.g. examples/grpo_qwen2.5-3b-instruct_tool/config.yaml")
    _add_train_flags(train)
    train.add_argument("overrides", nargs=argparse.REMAINDER,
                       help="hydra overrides, as for verl.trainer.main_ppo (the flags above may come among them)")


def _add_quickstart_arguments(quick) -> None:
    from verl_search.runtime.options import add_arguments
    from verl_search.quickstart.options import QuickstartOptions

    add_arguments(quick, QuickstartOptions)
    quick.epilog = ("A learning study's flags (frontier questions, the permuted-reward control, group filtering, "
                    "learning rates, token limits, --export): verl-search study --help.")


def _add_study_arguments(study) -> None:
    from verl_search.runtime.options import add_arguments
    from verl_search.quickstart.options import StudyOptions

    add_arguments(study, StudyOptions)


def _add_repeats_arguments(repeats) -> None:
    repeats.add_argument("runs", nargs="+", help="study folders (verl-search study --out) of one setting from one "
                         "cold start: each one's eval/grpo is a GRPO run, eval/grpo_control a control")
    repeats.add_argument("--json", help="also write the comparisons to this JSON file")
    repeats.add_argument("--bootstrap-samples", type=int, default=10000, help="resamples of the paired bootstrap")
    repeats.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")


def _add_config_path_arguments(paths) -> None:
    paths.add_argument("name", choices=["tool", "access-tool", "agent-loop"],
                       help="tool: SearchTool config; access-tool: SearchTool + AccessTool; agent-loop: agent loops")


#: sub-command -> (help, function adding its arguments); the functions import their option classes
#: lazily, so `main` builds only the arguments of the command it runs (`serve` never imports eval)
SUBCOMMANDS = {
    "serve": ("serve an index over HTTP (POST /retrieve, GET /health)", _add_serve_arguments),
    "eval": ("evaluate a model on QA data through verl's agent loop (needs [verl])", _add_eval_arguments),
    "check-config": ("compose a training recipe on CPU and check it before using GPUs", _add_check_config_arguments),
    "train": ("run a training recipe through verl's main_ppo, check-config first (--cpu: on the CPU)",
              _add_train_arguments),
    "preprocess": ("FlashRAG QA JSONL -> one verl parquet file (train or test), errors name file:line",
                   _add_preprocess_arguments),
    "download": ("download wiki-18, its e5 index, e5-base-v2 or the FlashRAG QA sets", _add_download_arguments),
    "config-path": ("print the absolute path of a shipped verl YAML", _add_config_path_arguments),
    "quickstart": ("index, evaluate, cold start, GRPO and evaluate again on the mini corpus, on the CPU, one report",
                   _add_quickstart_arguments),
    "study": ("the quickstart's stages with a learning study's: frontier questions and probes, the permuted-reward "
              "control, group filtering, learning rates, token limits, --export (docs/learning-run.md)",
              _add_study_arguments),
    "repeats": ("several study runs of one setting against their cold start and controls: per question and over "
                "runs, and the runs per arm a t test needs (docs/learning-run.md)", _add_repeats_arguments),
}


def eval_options(args: argparse.Namespace):
    """`EvalOptions` of parsed `eval` flags: the flags given over `--preset`'s values over the class's defaults."""
    from verl_search.eval.options import EvalOptions
    from verl_search.eval.presets import with_preset
    from verl_search.runtime.options import build

    from verl_search.datasets import DEFAULT_EVAL_DATA

    return build(EvalOptions, with_preset(vars(args)), data=args.data or [DEFAULT_EVAL_DATA])


def cmd_eval(args: argparse.Namespace) -> int:
    from verl_search.eval.harness import run_eval

    options = eval_options(args)
    run_eval(options)
    logger.info("report written to %s/report.md", options.out)
    return 0


def _add_train_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cpu", action="store_true",
                        help="train on the CPU: verl_search's CPU plugin, transformers rollout, CPU overrides")
    service = parser.add_mutually_exclusive_group()
    service.add_argument("--retrieval-url", help="a running /retrieve endpoint (default: $VERL_SEARCH_URL)")
    service.add_argument("--index", help="an index folder, served for the length of the run")
    parser.add_argument("--skip-check", action="store_true", help="do not run check-config first")


def _train_flags_among_overrides(args: argparse.Namespace) -> argparse.Namespace:
    """`train RECIPE --cpu a=b`: argparse hands everything after RECIPE to `overrides`; take the
    train flags back out of it (hydra overrides never start with `-`)."""
    flags = argparse.ArgumentParser(prog="verl-search train", add_help=False)
    _add_train_flags(flags)
    args, args.overrides = flags.parse_known_args(args.overrides, namespace=args)
    return args


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `verl-search` argument parser.

    Args:
        command: build the arguments of this sub-command only (the others are listed, empty);
            default: all of them.
    """
    parser = argparse.ArgumentParser(prog="verl-search", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    index = sub.add_parser("index", help="build and check retrieval indexes")
    index_sub = index.add_subparsers(dest="index_command", required=True)
    build = index_sub.add_parser("build", help="build a BM25 or dense index folder from a JSONL corpus")
    check = index_sub.add_parser("check", help="gold-title hit@k of an index on a question set; for a hybrid "
                                 "index, warns where fusion costs recall against its better half")
    if command in (None, "index"):
        _add_index_build_arguments(build)
        _add_index_check_arguments(check)
    for name, (help_text, add_arguments) in SUBCOMMANDS.items():
        subparser = sub.add_parser(name, help=help_text)
        if command in (None, name):
            add_arguments(subparser)
    return parser


def _recipe_checks_pass(recipe: str, overrides: list[str], then: str, require_engine: bool = False, *,
                        in_child: bool = False) -> bool:
    """Run check-config (`in_child`: in a child process, so that verl's imports do not stay in this one);
    log each problem and a summary naming what happens `then`."""
    if in_child:
        from verl_search.training.launch import check_in_child

        problems = check_in_child(recipe, overrides, require_engine=require_engine)
    else:
        from verl_search.verl_config.check import check_config

        problems = check_config(recipe, overrides, require_engine=require_engine)
    for problem in problems:
        logger.error("%s", problem)
    if problems:
        logger.error("%s: %d problem(s); %s", recipe, len(problems), then)
        return False
    logger.info("%s: the config composes and every check passed", recipe)
    return True


def cmd_check_config(args: argparse.Namespace) -> int:
    return 0 if _recipe_checks_pass(args.recipe, args.overrides, "fix them before launching") else 1


def cmd_train(args: argparse.Namespace) -> int:
    args = _train_flags_among_overrides(args)
    from verl_search.training.launch import run_training, train_overrides

    # check-config sets the shipped tool / agent-loop YAML paths itself while it composes
    # on GPUs the rollout engine must be installed here (check-config alone only warns: it runs on laptops too);
    # in a child process: this launcher waits for the whole run, and verl's imports would stay resident here
    if not args.skip_check and not _recipe_checks_pass(args.recipe, train_overrides(args.overrides, args.cpu),
                                                       "not training", require_engine=not args.cpu, in_child=True):
        return 1
    from verl_search.server.local import serve_for_run

    with serve_for_run(args.retrieval_url, args.index) as url:
        return run_training(args.recipe, args.overrides, cpu=args.cpu, retrieval_url=url)


def cmd_preprocess(args: argparse.Namespace) -> int:
    from verl_search.datasets.preprocess import PreprocessOptions, preprocess
    from verl_search.runtime.options import build

    preprocess(build(PreprocessOptions, args, inputs=[spec for group in args.inputs for spec in group]))
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    from verl_search.datasets.download import download

    for path in download(args.names, args.out):
        logger.info("wrote %s", path)
    return 0


def cmd_quickstart(args: argparse.Namespace) -> int:
    from verl_search.runtime.options import build
    from verl_search.quickstart.options import QuickstartOptions, StudyOptions
    from verl_search.quickstart.pipeline import run_quickstart

    run_quickstart(build(StudyOptions if args.command == "study" else QuickstartOptions, args))
    logger.info("report written to %s/report.md", args.out)
    return 0


def cmd_repeats(args: argparse.Namespace) -> int:
    from verl_search.report.repeats import load_repeats, render, summarize

    if args.bootstrap_samples < 1:
        raise ValueError(f"--bootstrap-samples {args.bootstrap_samples}: pass a positive number of resamples")
    summary = summarize(load_repeats(args.runs), args.bootstrap_samples, args.seed)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
        logger.info("comparisons written to %s", args.json)
    print(render(summary))  # the command's output
    return 0


def cmd_config_path(args: argparse.Namespace) -> int:
    from verl_search.verl_config.shipped import config_path

    print(config_path(args.name))  # the command's output, for $(...) in launch scripts
    return 0


def cmd_index_build(args: argparse.Namespace) -> int:
    from verl_search.runtime.options import build
    from verl_search.retrieval.index_builder import BuildOptions, build_index

    manifest = build_index(args.corpus, args.out, build(BuildOptions, args))
    logger.info("built %s index over %d passages at %s", manifest.retriever, manifest.corpus.num_passages, args.out)
    return 0


def cmd_index_check(args: argparse.Namespace) -> int:
    from verl_search.eval.index_check import IndexCheckOptions, check_index
    from verl_search.retrieval.hybrid import HybridOptions
    from verl_search.runtime.options import build

    result = check_index(args.index, build(IndexCheckOptions, args), build(HybridOptions, args),
                         corpus=args.corpus, encoder=args.encoder)
    print(result.table())  # the command's output; each loss is a logged warning
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from verl_search.server.command import serve_from_args

    return serve_from_args(args)


COMMANDS = {
    ("index", "build"): cmd_index_build,
    ("index", "check"): cmd_index_check,
    ("serve", None): cmd_serve,
    ("eval", None): cmd_eval,
    ("check-config", None): cmd_check_config,
    ("train", None): cmd_train,
    ("preprocess", None): cmd_preprocess,
    ("download", None): cmd_download,
    ("config-path", None): cmd_config_path,
    ("quickstart", None): cmd_quickstart,
    ("study", None): cmd_quickstart,
    ("repeats", None): cmd_repeats,
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `verl-search` console script; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    parser = build_parser(command if command in {"index", *SUBCOMMANDS} else None)
    args = parser.parse_args(argv)
    configure_logging()
    command = COMMANDS[(args.command, getattr(args, f"{args.command}_command", None))]

    def run() -> int:
        if args.command in NEEDS_EXTRA:
            require_extra(NEEDS_EXTRA[args.command])
        if args.command in NEEDS_VERL:
            check_verl_version()
        return command(args)

    return exit_code(run, (*EXPECTED_ERRORS, UnsupportedVerlVersion))


if __name__ == "__main__":
    sys.exit(main())
