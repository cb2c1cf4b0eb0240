"""`server.local.serve_for_run`: the one home of "serve this index for the run" (train and eval `--index`)."""

import httpx
import pytest

from verl_search.server.local import serve_for_run


def test_a_given_url_is_used_as_is_and_none_stays_none():
    with serve_for_run("http://127.0.0.1:9/retrieve", None) as url:
        assert url == "http://127.0.0.1:9/retrieve"
    with serve_for_run(None, None) as url:
        assert url is None  # the caller's default ($VERL_SEARCH_URL for train)


def test_url_and_index_together_are_refused():
    with pytest.raises(ValueError, match="not both"):
        with serve_for_run("http://127.0.0.1:9/retrieve", "some/index"):
            pass


def test_an_index_is_served_for_the_block_and_stopped_after(bm25_index, tmp_path):
    log = tmp_path / "server.log"
    with serve_for_run(None, str(bm25_index), str(log)) as url:
        answer = httpx.post(url, json={"queries": ["Lilu mythology"], "topk": 2}, timeout=30)
        assert answer.status_code == 200 and len(answer.json()["result"][0]) == 2
    with pytest.raises(httpx.TransportError):  # the server is gone with the block
        httpx.post(url, json={"queries": ["Lilu mythology"]}, timeout=5)
    assert log.is_file()
