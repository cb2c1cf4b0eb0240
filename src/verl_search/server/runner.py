"""Run the retrieval service in the background: in this process (a uvicorn thread) or as a
`python -m verl_search.server` subprocess (the command `verl-search serve` runs), and wait until
`/health` says ready.

Used by `verl-search eval` (which serves an index folder itself for the length of a run), by the
benchmarks and by the tests.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time

import httpx

logger = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_until_ready(url: str, timeout: float = 600.0, is_alive=lambda: True) -> dict:
    """Poll `GET {url}/health` every 0.2 s until it says ready; return its body.

    Args:
        url: the server's base URL, e.g. `http://127.0.0.1:8000`.
        timeout: seconds to wait in all.
        is_alive: returns False once the server is gone (stop waiting early).

    Raises:
        RuntimeError: if the server reports `failed` or dies.
        TimeoutError: if it is not ready within `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if not is_alive():
                raise RuntimeError(f"the retrieval server at {url} exited before it was ready")
            try:
                response = client.get(f"{url}/health")
                body = response.json()
                if body.get("status") == "ready":
                    return body
                if body.get("status") == "failed":
                    raise RuntimeError(f"the retrieval server at {url} failed to load its index: {body.get('error')}")
            except (httpx.TransportError, ValueError):
                pass
            time.sleep(0.2)
    raise TimeoutError(f"the retrieval server at {url} was not ready after {timeout:.0f} s")


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
