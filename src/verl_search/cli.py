"""`verl-search` command line: `index build`, `serve`, `eval`, `train`, `check-config`, `download`, `config-path`.

`index build` and `serve` run on the base install; `eval` and `check-config` need the `[verl]`
extra and exit 2 with the `pip install` line when it is missing (see `verl_search.extras`).

Each sub-command is a thin wrapper: it parses arguments, calls the library, and turns expected
errors (bad paths, mismatched index) into a one-line message and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from dataclasses import fields
from pathlib import Path

from verl_search import __version__
from verl_search.extras import require_extra
from verl_search.verl_compat import UnsupportedVerlVersion, check_verl_version

logger = logging.getLogger("verl_search")

EXPECTED_ERRORS = (FileNotFoundError, FileExistsError, ValueError, ImportError, ConnectionError, KeyError,
                   UnsupportedVerlVersion)
#: sub-commands that need an extra: checked before the command imports anything of it
NEEDS_EXTRA = {"eval": "verl", "check-config": "verl", "train": "verl"}
#: sub-commands that drive verl: they stop on another verl version (verl_search.verl_compat)
NEEDS_VERL = {"eval", "check-config", "train"}


def _add_index_parser(sub) -> None:
    index = sub.add_parser("index", help="build retrieval indexes")
    index_sub = index.add_subparsers(dest="index_command", required=True)
    build = index_sub.add_parser("build", help="build a BM25 or dense index folder from a JSONL corpus")
    build.add_argument("--corpus", required=True, help='JSONL corpus: {"id": ..., "contents": "\\"Title\\"\\ntext"} per line')
    build.add_argument("--out", required=True, help="output index folder (appears only when complete)")
    build.add_argument("--retriever", choices=["bm25", "dense"], default="bm25")
    build.add_argument("--encoder", help="dense: sentence-transformers / Hugging Face encoder folder")
    build.add_argument("--faiss-factory", default="Flat", help="dense: faiss factory string (Flat, HNSW64, IVF4096,PQ64)")
    build.add_argument("--batch-size", type=int, default=64, help="dense: passages per encoder pass")
    build.add_argument("--chunk-size", type=int, default=8192, help="dense: passages encoded per chunk written to disk")
    build.add_argument("--query-prefix", default=None, help='dense: query prefix (default: "query: " for e5, else none)')
    build.add_argument("--passage-prefix", default=None, help='dense: passage prefix (default: "passage: " for e5)')
    build.add_argument("--max-length", type=int, default=None, help="dense: encoder input limit in tokens")
    build.add_argument("--overwrite", action="store_true", help="replace an existing output folder")


def _add_serve_parser(sub) -> None:
    serve = sub.add_parser("serve", help="serve an index over HTTP (POST /retrieve, GET /health)")
    serve.add_argument("--index", required=True, help="index folder, or a faiss file (Search-R1 layout)")
    serve.add_argument("--corpus", help="JSONL corpus (default: the one in the manifest; required for a faiss file)")
    serve.add_argument("--encoder", help="encoder folder (default: the one in the manifest; required for a faiss file)")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1, this machine only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--default-topk", type=int, default=3)
    serve.add_argument("--max-topk", type=int, default=100)
    serve.add_argument("--max-queries", type=int, default=512, help="most queries per request")
    serve.add_argument("--max-query-chars", type=int, default=4096, help="longest query, in characters")
    serve.add_argument("--no-micro-batching", action="store_true", help="search each request alone")
    serve.add_argument("--max-batch-size", type=int, default=256, help="most queries per coalesced batch")
    serve.add_argument("--max-wait-ms", type=float, default=2.0, help="wait for more requests, in milliseconds")
    serve.add_argument("--cpu", action="store_true", help="keep the faiss index on the CPU even if GPUs are visible")
    serve.add_argument("--verify-corpus", action="store_true", help="check the corpus SHA-256 against the manifest")
    serve.add_argument("--log-level", default="info")


def default_data_dir() -> Path:
    """`$VERL_SEARCH_DATA`, or `../shared/data` from the current folder (where the bundle lives)."""
    return Path(os.environ.get("VERL_SEARCH_DATA", Path.cwd().parent / "shared" / "data"))


def _add_eval_parser(sub) -> None:
    # Defaults live in EvalOptions (one home); None here means "EvalOptions' default". The parser
    # imports nothing of the eval side, so `verl-search serve` works in a retriever-only install.
    ev = sub.add_parser("eval", help="evaluate a model on QA data through verl's agent loop (needs [verl])")
    ev.add_argument("--data", action="append", help="[NAME=]PATH of FlashRAG JSONL or verl parquet (repeatable); "
                    "default: $VERL_SEARCH_DATA or ../shared/data, mini_wiki/qa.jsonl")
    ev.add_argument("--out", default="runs/eval", help="output folder (a rerun resumes it)")
    ev.add_argument("--protocol", choices=["search_r1", "tool"], help="default: search_r1")
    ev.add_argument("--model", help="HF model folder, a folder holding --gguf-file, or smollm2 (default)")
    ev.add_argument("--gguf-file", default=None)
    ev.add_argument("--engine", choices=["transformers", "sglang"], help="default: transformers")
    ev.add_argument("--engine-url", default=None, help="sglang: the server's base URL")
    group = ev.add_mutually_exclusive_group()
    group.add_argument("--retrieval-url", help="a running /retrieve endpoint")
    group.add_argument("--index", help="an index folder, served for the length of the run")
    ev.add_argument("--max-per-source", type=int, default=None, help="at most N questions per data source")
    ev.add_argument("--seed", type=int, help="default: 0")
    ev.add_argument("--batch-size", type=int, help="questions rolled out together (default 16)")
    ev.add_argument("--max-turns", type=int, help="searches allowed (default 4, Search-R1's)")
    ev.add_argument("--topk", type=int, help="passages per search (default 3)")
    ev.add_argument("--max-tokens-per-turn", type=int, help="default 128 (CPU-sized)")
    ev.add_argument("--max-obs-tokens", type=int, help="default 500")
    ev.add_argument("--prompt-length", type=int, help="verl's rollout.prompt_length, tokens")
    ev.add_argument("--response-length", type=int, help="verl's rollout.response_length, tokens")
    ev.add_argument("--temperature", type=float, help="0 (default): greedy")


def cmd_eval(args: argparse.Namespace) -> int:
    from verl_search.eval.harness import EvalOptions, run_eval

    data = args.data
    if not data:
        default = default_data_dir() / "mini_wiki" / "qa.jsonl"
        if not default.is_file():
            raise FileNotFoundError(
                f"no --data given and {default} does not exist. Pass --data PATH (FlashRAG JSONL or verl parquet), "
                "or fetch the FlashRAG QA sets on a machine with internet: verl-search download datasets --out DIR"
            )
        data = [str(default)]
    given = {key: value for key, value in vars(args).items() if value is not None and key != "data"}
    options = EvalOptions(data=data, **{f.name: given[f.name] for f in fields(EvalOptions) if f.name in given})
    run_eval(options)
    logger.info("report written to %s/report.md", args.out)
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


def build_parser() -> argparse.ArgumentParser:
    """The `verl-search` argument parser."""
    parser = argparse.ArgumentParser(prog="verl-search", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_index_parser(sub)
    _add_serve_parser(sub)
    _add_eval_parser(sub)
    check = sub.add_parser("check-config", help="compose a training recipe on CPU and check it before using GPUs")
    check.add_argument("recipe", help="recipe YAML (extends ppo_trainer via hydra.searchpath)")
    check.add_argument("overrides", nargs=argparse.REMAINDER, help="hydra overrides, as for verl.trainer.main_ppo")
    train = sub.add_parser("train", help="run a training recipe through verl's main_ppo (check-config first)")
    train.add_argument("recipe", help="recipe YAML, e.g. examples/grpo_qwen2.5-3b-instruct_tool/config.yaml")
    _add_train_flags(train)
    train.add_argument("overrides", nargs=argparse.REMAINDER,
                       help="hydra overrides, as for verl.trainer.main_ppo (the flags above may come among them)")
    down = sub.add_parser("download", help="download wiki-18, its e5 index, e5-base-v2 or the FlashRAG QA sets")
    down.add_argument("names", nargs="+", choices=["wiki18", "e5-index", "e5-model", "datasets"])
    down.add_argument("--out", required=True, help="folder to write to")
    paths = sub.add_parser("config-path", help="print the absolute path of a shipped verl YAML")
    paths.add_argument("name", choices=["tool", "agent-loop"], help="tool: SearchTool config; agent-loop: agent loops")
    return parser


def cmd_check_config(args: argparse.Namespace) -> int:
    from verl_search.check_config import check_config

    problems = check_config(args.recipe, args.overrides)
    for problem in problems:
        logger.error("%s", problem)
    if problems:
        logger.error("%s: %d problem(s); fix them before launching", args.recipe, len(problems))
        return 1
    logger.info("%s: the config composes and every check passed", args.recipe)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    args = _train_flags_among_overrides(args)
    from verl_search.training.launch import run_training, train_env, train_overrides

    overrides = train_overrides(args.overrides, args.cpu)
    if not args.skip_check:
        from verl_search.check_config import check_config

        with _environment(train_env(args.cpu, args.retrieval_url)):
            problems = check_config(args.recipe, overrides)
        for problem in problems:
            logger.error("%s", problem)
        if problems:
            logger.error("%s: %d problem(s); not training", args.recipe, len(problems))
            return 1
    with contextlib.ExitStack() as stack:
        url = args.retrieval_url
        if args.index:
            from verl_search.server.runner import SubprocessServer

            url = f"{stack.enter_context(SubprocessServer(['--index', args.index])).url}/retrieve"
        return run_training(args.recipe, args.overrides, cpu=args.cpu, retrieval_url=url)


@contextlib.contextmanager
def _environment(env: dict[str, str]):
    """Run a block with `os.environ` set to `env`, then restore it."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def cmd_download(args: argparse.Namespace) -> int:
    from verl_search.download import download

    for path in download(args.names, args.out):
        logger.info("wrote %s", path)
    return 0


def cmd_config_path(args: argparse.Namespace) -> int:
    from verl_search.configs import config_path

    print(config_path(args.name))  # the command's output, for $(...) in launch scripts
    return 0


def cmd_index_build(args: argparse.Namespace) -> int:
    from verl_search.retrieval.index_builder import BuildOptions, build_index

    options = BuildOptions(
        retriever=args.retriever,
        encoder=args.encoder,
        faiss_factory=args.faiss_factory,
        batch_size=args.batch_size,
        chunk_size=args.chunk_size,
        query_prefix=args.query_prefix,
        passage_prefix=args.passage_prefix,
        max_length=args.max_length,
        overwrite=args.overwrite,
    )
    manifest = build_index(args.corpus, args.out, options)
    logger.info("built %s index over %d passages at %s", manifest.retriever, manifest.corpus.num_passages, args.out)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from verl_search.retrieval.loader import resolve_index
    from verl_search.server.app import create_app
    from verl_search.server.settings import ServerSettings

    spec = resolve_index(args.index, corpus=args.corpus, encoder=args.encoder, verify_corpus=args.verify_corpus,
                         use_gpu=False if args.cpu else None)
    settings = ServerSettings(
        default_topk=args.default_topk,
        max_topk=args.max_topk,
        max_queries=args.max_queries,
        max_query_chars=args.max_query_chars,
        micro_batching=not args.no_micro_batching,
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
    )
    failed: list[BaseException] = []

    def stop_on_failure(exc: BaseException) -> None:
        failed.append(exc)
        server.should_exit = True

    app = create_app(spec.load, settings, on_load_failure=stop_on_failure)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level))
    server.run()
    if failed:
        logger.error("the index could not be loaded: %s", failed[0])
        return 1
    return 0


COMMANDS = {
    ("index", "build"): cmd_index_build,
    ("serve", None): cmd_serve,
    ("eval", None): cmd_eval,
    ("check-config", None): cmd_check_config,
    ("train", None): cmd_train,
    ("download", None): cmd_download,
    ("config-path", None): cmd_config_path,
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `verl-search` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    command = COMMANDS[(args.command, getattr(args, f"{args.command}_command", None))]
    try:
        if args.command in NEEDS_EXTRA:
            require_extra(NEEDS_EXTRA[args.command])
        if args.command in NEEDS_VERL:
            check_verl_version()
        return command(args)
    except EXPECTED_ERRORS as exc:
        logger.error("%s", exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
