"""`GET /health` from the caller's side: wait until a retrieval server says it is ready.

Used by `server.ray_serve` (a deployment is up once its proxies answer) and by the local servers
of a run (`server.local`).
"""

from __future__ import annotations

import time

import httpx


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
