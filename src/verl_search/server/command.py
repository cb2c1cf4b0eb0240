"""The `serve` command: `python -m verl_search.server --index DIR [--port 8000 ...]` and `verl-search serve`.

Both are this module (the CLI calls `add_serve_arguments` and `serve_from_args`). It builds the
flags from `ServeOptions`, `ServerSettings`, `HybridOptions`, `RerankOptions`, `RayOptions` and
`WebOptions`, and hands the parsed options to one of three servers: `server.serve.serve` (one
uvicorn process), `server.ray_serve.serve_with_ray` (`--ray`) or `server.web.service.serve_web`
(`--backend web`). Those modules never import this one, so the dependency runs one way.

Imports nothing of the verl side (tools, agent loop, eval, verl): it runs in a retriever-only install.
"""

from __future__ import annotations

import argparse
import sys

from verl_search.retrieval.hybrid import HybridOptions
from verl_search.retrieval.rerank import RerankOptions
from verl_search.runtime.exits import EXPECTED_ERRORS, configure_logging, exit_code
from verl_search.runtime.options import add_arguments, build
from verl_search.server.serve import RayOptions, ServeOptions, serve
from verl_search.server.settings import ServerSettings
from verl_search.server.web.options import WebOptions


def add_serve_arguments(parser) -> None:
    """Add the flags of `ServeOptions`, `ServerSettings`, `HybridOptions`, `RerankOptions`,
    `RayOptions` and `WebOptions` to an argparse parser (one group each after the first)."""
    add_arguments(parser, ServeOptions)
    add_arguments(parser.add_argument_group("limits and batching (ServerSettings)"), ServerSettings)
    add_arguments(parser.add_argument_group("hybrid index: fusion (HybridOptions)"), HybridOptions)
    add_arguments(parser.add_argument_group("rerank stage (RerankOptions)"), RerankOptions)
    add_arguments(parser.add_argument_group("Ray Serve (RayOptions; pip install \"verl-search[ray]\")"), RayOptions)
    add_arguments(parser.add_argument_group("--backend web (WebOptions; pip install \"verl-search[web]\")"), WebOptions)


def serve_from_args(args: argparse.Namespace) -> int:
    """Serve with the options parsed by a parser that `add_serve_arguments` built; returns the exit code.

    `--ray` deploys with Ray Serve (`server.ray_serve.serve_with_ray`), `--backend web` serves a web
    search API (`server.web.service.serve_web`), `--http-workers N` (N > 1) N HTTP processes in front of this
    one (`server.workers.serve_with_workers`), otherwise one uvicorn process (`server.serve.serve`).

    Raises:
        ValueError: a combination of flags that does not fit (named in the message); as the server called.
    """
    ray_options = build(RayOptions, args)
    hybrid, rerank, options = build(HybridOptions, args), build(RerankOptions, args), build(ServeOptions, args)
    if options.http_workers < 1:
        raise ValueError(f"--http-workers must be >= 1, got {options.http_workers}")
    if options.backend == "web":
        if options.http_workers > 1:
            raise ValueError("--http-workers applies to --backend index")
        if ray_options.ray or options.index:
            raise ValueError("--backend web serves a web search API: leave out --index and --ray")
        from verl_search.server.web.service import serve_web

        return serve_web(options.host, options.port, options.log_level, options.drain_timeout,
                         build(ServerSettings, args), build(WebOptions, args))
    if options.index is None:
        raise ValueError("--index is required (an index folder or a faiss file), unless --backend web")
    if options.http_workers > 1:
        if ray_options.ray:
            raise ValueError("--http-workers and --ray do not combine: Ray Serve runs its own HTTP proxies")
        from verl_search.server.workers import serve_with_workers

        return serve_with_workers(options, build(ServerSettings, args), hybrid, rerank)
    if ray_options.ray:
        from verl_search.runtime.extras import require_extra

        require_extra("ray")
        from verl_search.server.ray_serve import serve_with_ray

        return serve_with_ray(options, build(ServerSettings, args), ray_options, hybrid, rerank)
    return serve(options, build(ServerSettings, args), hybrid, rerank)


def main(argv: list[str] | None = None) -> int:
    """`python -m verl_search.server`: parse flags, serve; returns the exit code (2 on a bad index or path)."""
    parser = argparse.ArgumentParser(prog="python -m verl_search.server", description=__doc__.splitlines()[0])
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging()
    return exit_code(lambda: serve_from_args(args), EXPECTED_ERRORS)


if __name__ == "__main__":
    sys.exit(main())
