"""Property-based fuzzing of `POST /retrieve` on a real uvicorn server over the
real BM25 index. Random JSON, random UTF-8 (lone surrogates, NUL, 1 MB strings), random bytes and
random headers: never a 5xx, the batch worker never dies, and a valid request is answered after."""

import json
import socket

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from verl_search.server.app import create_app, index_service
from verl_search.server.local import ThreadServer

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)

# any str, lone surrogates included (JSON-escaped as \udXXX by json.dumps(ensure_ascii=True))
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | ANY_TEXT
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(ANY_TEXT, inner, max_size=5),
                           max_leaves=20)
BODIES = st.fixed_dictionaries(
    {"queries": st.lists(ANY_TEXT, max_size=6) | JSON_VALUES},
    optional={"topk": st.integers(-5, 200) | JSON_VALUES, "return_scores": st.booleans() | JSON_VALUES,
              "extra": JSON_VALUES},
)
HEADER_NAMES = st.text("abcdefghijklmnopqrstuvwxyz-_0123456789!#$%&'*+.^`|~", min_size=1, max_size=20).filter(
    lambda name: name.lower() not in {"content-length", "transfer-encoding", "host", "connection", "expect", "upgrade"})
HEADER_VALUES = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=60)
HEADERS = st.dictionaries(HEADER_NAMES, HEADER_VALUES, max_size=6) | st.fixed_dictionaries(
    {"content-type": st.sampled_from(["application/json", "text/plain", "application/json; charset=latin-1",
                                      "multipart/form-data; boundary=x", "application/x-www-form-urlencoded", ""])})


@pytest.fixture(scope="module")
def fuzzed(bm25_retriever):
    app = create_app(index_service(bm25_retriever))
    with ThreadServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        app.state.url = server.url
        yield app, client


def check(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:300])


@FUZZ
@given(body=JSON_VALUES | BODIES)
@example(body={"queries": ["\ud800"]})
@example(body={"queries": ["\udfff lone low", "a\x00b"], "topk": 2})
@example(body={"queries": ["\x00" * 100]})
@example(body={"queries": ["x" * 1_000_000]})
@example(body={"queries": ["q"], "topk": 10**30})
@example(body={"queries": ["q"], "topk": 1e308})
def test_random_json_is_never_a_5xx(fuzzed, body):
    _, client = fuzzed
    raw = json.dumps(body, ensure_ascii=True, allow_nan=True).encode()
    check(client.post("/retrieve", content=raw, headers={"content-type": "application/json"}))


@FUZZ
@given(raw=st.binary(max_size=300) | ANY_TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")))
@example(raw=b'{"queries": ["\xed\xa0\x80"]}')  # a UTF-8-encoded lone surrogate: invalid UTF-8
@example(raw=b'{"queries": ["\xff\xfe"]}')
@example(raw=b'{"queries": ["a\x00"]}')  # raw NUL inside a JSON string
@example(raw=b'{"queries": ["' + b"\xc3\xa9" * 500_000 + b'"]}')  # 1 MB of UTF-8
@example(raw=b"[" * 100_000)  # deep nesting
def test_random_bytes_are_never_a_5xx(fuzzed, raw):
    _, client = fuzzed
    check(client.post("/retrieve", content=raw, headers={"content-type": "application/json"}))


@FUZZ
@given(headers=HEADERS, body=BODIES)
def test_random_headers_are_never_a_5xx(fuzzed, headers, body):
    _, client = fuzzed
    app, _ = fuzzed
    payload = json.dumps(body).encode()
    lines = [b"POST /retrieve HTTP/1.1", b"host: x", b"connection: close", b"content-length: %d" % len(payload)]
    lines += [name.encode() + b": " + value.encode("latin-1") for name, value in headers.items()]  # obs-text too
    status = raw_status(app.state.url, b"\r\n".join(lines) + b"\r\n\r\n" + payload)
    assert status is None or status < 500, status  # None: the server closed a malformed request without answering


def raw_status(url: str, request: bytes) -> int | None:
    """Send raw bytes on a fresh connection; the response's status code, or None if it closed without one."""
    host, port = url.rsplit("/", 1)[-1].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None


def test_server_is_alive_after_fuzzing(fuzzed):
    app, client = fuzzed
    for raw in (b"\xff" * 10, b'{"queries": ["\\ud800"]}', json.dumps({"queries": ["x" * 1_000_000]}).encode()):
        check(client.post("/retrieve", content=raw, headers={"content-type": "application/json"}))
    response = client.post("/retrieve", json={"queries": ["Lilu mythology"], "topk": 2})
    assert response.status_code == 200 and len(response.json()["result"][0]) == 2
    assert client.get("/health").json()["status"] == "ready"
    assert app.state.service.batcher._thread.is_alive()  # the batch worker never died
