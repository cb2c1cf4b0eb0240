"""Start the retrieval service: resolve the index, build the app, run uvicorn.

`python -m verl_search.server --index DIR [--port 8000 ...]` and `verl-search serve` are the same
command (the CLI calls `add_serve_arguments` and `serve_from_args`); `server.runner.SubprocessServer`
starts it as a child process. Every flag is generated from `ServeOptions` and `ServerSettings`
(`verl_search.options`), so defaults live in those two classes only.

Imports nothing of the verl side (tools, agent loop, eval, verl): it runs in a retriever-only install.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass, field

from verl_search.exits import configure_logging, exit_code
from verl_search.options import add_arguments, build
from verl_search.server.settings import ServerSettings

logger = logging.getLogger(__name__)

#: errors that mean a bad path or a mismatched index: one line and exit code 2, no traceback
EXPECTED_ERRORS = (FileNotFoundError, FileExistsError, ValueError, ImportError, KeyError)


@dataclass
class ServeOptions:
    """What to serve and where (the server's limits are `ServerSettings`).

    Attributes:
        index: index folder, or a faiss file (Search-R1 layout).
        corpus, encoder: default: the manifest's; required with a faiss file.
        host: bind address (default 127.0.0.1, this machine only); port: TCP port (default 8000).
        cpu: keep the faiss index on the CPU even if GPUs are visible (default: GPUs when present).
        verify_corpus: check the corpus SHA-256 against the manifest (reads the whole corpus).
        log_level: uvicorn's log level (default `info`).
    """

    index: str = field(metadata={"help": "index folder, or a faiss file (Search-R1 layout)"})
    corpus: str | None = field(default=None, metadata={
        "help": "JSONL corpus (default: the one in the manifest; required for a faiss file)"})
    encoder: str | None = field(default=None, metadata={
        "help": "encoder folder (default: the one in the manifest; required for a faiss file)"})
    host: str = field(default="127.0.0.1", metadata={"help": "bind address (this machine only by default)"})
    port: int = field(default=8000, metadata={"help": "TCP port"})
    cpu: bool = field(default=False, metadata={"help": "keep the faiss index on the CPU even if GPUs are visible"})
    verify_corpus: bool = field(default=False, metadata={"help": "check the corpus SHA-256 against the manifest"})
    log_level: str = field(default="info", metadata={"help": "uvicorn log level"})


def add_serve_arguments(parser) -> None:
    """Add the flags of `ServeOptions` and `ServerSettings` to an argparse parser."""
    add_arguments(parser, ServeOptions)
    add_arguments(parser.add_argument_group("limits and batching (ServerSettings)"), ServerSettings)


def serve(options: ServeOptions, settings: ServerSettings | None = None) -> int:
    """Serve until stopped (SIGINT/SIGTERM); return the exit code: 0, or 1 if the index failed to load.

    The cheap checks (`resolve_index`: files exist, corpus size, encoder fingerprint) run before
    the port is bound; the slow load runs in the app's background thread (`/health` says
    `loading` meanwhile) and a failure there stops the server.

    Raises:
        FileNotFoundError, IndexMismatchError (a ValueError), ValueError: see `resolve_index`.
    """
    import uvicorn

    from verl_search.retrieval.loader import resolve_index
    from verl_search.server.app import create_app

    spec = resolve_index(options.index, corpus=options.corpus, encoder=options.encoder,
                         verify_corpus=options.verify_corpus, use_gpu=False if options.cpu else None)
    failed: list[BaseException] = []

    def stop_on_failure(exc: BaseException) -> None:
        failed.append(exc)
        server.should_exit = True

    app = create_app(spec.load, settings or ServerSettings(), on_load_failure=stop_on_failure)
    server = uvicorn.Server(uvicorn.Config(app, host=options.host, port=options.port, log_level=options.log_level))
    server.run()
    if failed:
        logger.error("the index could not be loaded: %s", failed[0])
        return 1
    return 0


def serve_from_args(args: argparse.Namespace) -> int:
    """`serve` with the options and settings parsed by a parser that `add_serve_arguments` built."""
    return serve(build(ServeOptions, args), build(ServerSettings, args))


def main(argv: list[str] | None = None) -> int:
    """`python -m verl_search.server`: parse flags, serve; returns the exit code (2 on a bad index or path)."""
    parser = argparse.ArgumentParser(prog="python -m verl_search.server", description=__doc__.splitlines()[0])
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging()
    return exit_code(lambda: serve_from_args(args), EXPECTED_ERRORS)


if __name__ == "__main__":
    sys.exit(main())
