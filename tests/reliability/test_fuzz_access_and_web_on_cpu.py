"""Property-based fuzzing of `POST /access` on a real uvicorn server over the real mini corpus, and of the web
backend's `/retrieve` and `/access` against the local fake of the web APIs (`tests/server/web/fake_apis.py`; the paid
APIs cannot be called here): random JSON, lone surrogates, NUL, long strings: never a 5xx."""

import json

import httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.conftest import MINI_CORPUS
from tests.reliability.test_fuzz_retrieve_on_cpu import ANY_TEXT, BODIES, FUZZ, JSON_VALUES, check
from tests.server.web.fake_apis import SEARCH_KEY, FakeWeb
from verl_search.retrieval.corpus import JsonlCorpus
from verl_search.retrieval.pages import PageLookup
from verl_search.server.access import CorpusPages
from verl_search.server.app import create_app, index_service
from verl_search.server.local import ThreadServer
from verl_search.server.web.service import WebService, build_backend
from verl_search.server.web.options import WebOptions


ACCESS_BODIES = st.fixed_dictionaries({}, optional={"ids": st.lists(ANY_TEXT, max_size=4) | JSON_VALUES,
                                                    "titles": st.lists(ANY_TEXT, max_size=4) | JSON_VALUES,
                                                    "urls": st.lists(ANY_TEXT.map(lambda t: "https://x.org/" + t), max_size=3)
                                                    | JSON_VALUES})


def post(client, path, body):
    return client.post(path, content=json.dumps(body, ensure_ascii=True, allow_nan=True).encode(),
                       headers={"content-type": "application/json"})


@pytest.fixture(scope="module")
def index_client(bm25_retriever):
    app = create_app(index_service(bm25_retriever, pages=CorpusPages(PageLookup.open(JsonlCorpus(MINI_CORPUS), cache=False))))
    with ThreadServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def web_client(tmp_path_factory):
    fake = FakeWeb()
    with ThreadServer(fake.app()) as upstream, pytest.MonkeyPatch.context() as patch:
        patch.setenv("SERPER_API_KEY", SEARCH_KEY)
        options = WebOptions(search_url=f"{upstream.url}/search", reader_url=f"{upstream.url}/reader/",
                             web_cache_dir=str(tmp_path_factory.mktemp("web-cache")), request_deadline=5)
        with ThreadServer(create_app(WebService(build_backend(options)))) as server, \
                httpx.Client(base_url=server.url, timeout=30) as client:
            yield client


@FUZZ
@given(body=JSON_VALUES | ACCESS_BODIES)
@example(body={"titles": ["\ud800"]})
@example(body={"ids": ["\udfff", "a\x00b", "١٢"]})
@example(body={"titles": ["x" * 1_000_000]})
def test_access_on_an_index_server_is_never_a_5xx(index_client, body):
    check(post(index_client, "/access", body))


@FUZZ
@given(path=st.sampled_from(["/retrieve", "/access"]), body=JSON_VALUES | BODIES | ACCESS_BODIES)
@example(path="/retrieve", body={"queries": ["\ud800 lone", "a\x00b"], "topk": 2})
@example(path="/access", body={"urls": ["https://x.org/\ud800"]})
@example(path="/access", body={"ids": ["https://x.org/a b\x00c"]})
def test_the_web_backend_is_never_a_5xx(web_client, path, body):
    check(post(web_client, path, body))
    assert post(web_client, "/retrieve", {"queries": ["still alive"]}).status_code == 200
