"""A retrieval server on this machine for the length of a run: in this process (a uvicorn thread) or
as a `python -m verl_search.server` subprocess (the command `verl-search serve` runs), started on a
free port, waited for until `/health` says ready, stopped at the end.

`serve_for_run` is the one home of "serve this index for the run" (`verl-search train --index`,
`verl-search eval --index`); the benchmarks and the tests use `ThreadServer` and `SubprocessServer`
directly. Imports nothing of the server but its `/health` poll (`server.health`): a subprocess runs
the server, or the caller hands `ThreadServer` an app, so the training side can use it without the
server's dependencies loaded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

from verl_search.server.health import wait_until_ready

logger = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ThreadServer:
    """A uvicorn server for `app` on a background thread of this process.

    Use as a context manager; `url` is set once it is listening and the index is ready.

    Args:
        app: an ASGI app (e.g. `create_app(...)`).
        host: bind address (default 127.0.0.1).
        port: port (default: a free one).
        ready_timeout: seconds to wait for `/health` to be ready.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int | None = None, ready_timeout: float = 600.0):
        import uvicorn

        self.host, self.port = host, port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.ready_timeout = ready_timeout
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, name="uvicorn", daemon=True)

    def start(self) -> "ThreadServer":
        """Start serving and wait until ready (raises like `wait_until_ready`)."""
        self._thread.start()
        wait_until_ready(self.url, self.ready_timeout, is_alive=self._thread.is_alive)
        return self

    def stop(self) -> None:
        """Shut the server down and wait for its thread (up to 10 s)."""
        self._server.should_exit = True
        self._thread.join(10.0)

    def __enter__(self) -> "ThreadServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class SubprocessServer:
    """`python -m verl_search.server ARGS...` (= `verl-search serve ARGS...`) as a child process on a free port.

    Args:
        serve_args: the serve flags (e.g. `["--index", DIR]`); `--host/--port` are added.
        ready_timeout: seconds to wait for `/health` to be ready.
        log_path: file for the server's stdout/stderr (default: discarded).
    """

    def __init__(self, serve_args: list[str], ready_timeout: float = 600.0, log_path: str | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.serve_args = list(serve_args)
        self.ready_timeout = ready_timeout
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> "SubprocessServer":
        """Start the process and wait until ready; on failure the process is stopped."""
        command = [sys.executable, "-m", "verl_search.server", *self.serve_args,
                   "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_until_ready(self.url, self.ready_timeout, is_alive=lambda: self.process.poll() is None)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after 10 s)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> "SubprocessServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def serve_for_run(retrieval_url: str | None, index: str | None, log_path: str | None = None) -> Iterator[str | None]:
    """The `/retrieve` URL of a run: `retrieval_url` as given, or that of a `SubprocessServer` serving
    `index` for the length of the block (`verl-search train --index`, `verl-search eval --index`).

    Args:
        retrieval_url: a running `/retrieve` endpoint; yielded as is (None too: the caller's default).
        index: an index folder to serve instead (`--retrieval-url` and `--index` exclude each other).
        log_path: file for the server's output (default: discarded).

    Raises:
        ValueError: both `retrieval_url` and `index` given; as `SubprocessServer.start`.
    """
    if retrieval_url and index:
        raise ValueError(f"pass --retrieval-url ({retrieval_url}) or --index ({index}), not both")
    if not index:
        yield retrieval_url
        return
    with SubprocessServer(["--index", index], log_path=log_path) as server:
        yield f"{server.url}/retrieve"

