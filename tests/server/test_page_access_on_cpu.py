"""`POST /access` (page access by id or title) on a real uvicorn server over the real mini corpus."""

import json
from collections import defaultdict

import httpx
import pytest

from tests.conftest import MINI_CORPUS
from verl_search.retrieval.base import split_contents
from verl_search.retrieval.corpus import JsonlCorpus
from verl_search.retrieval.pages import PageLookup, normalise_title
from verl_search.server.local import SubprocessServer


def corpus_rows() -> list[dict]:
    return [json.loads(line) for line in MINI_CORPUS.open(encoding="utf-8")]


def access(server, body):
    return httpx.post(f"{server.url}/access", json=body, timeout=30)


def test_a_passage_by_id_is_the_corpus_line(pages_server):
    rows = corpus_rows()
    response = access(pages_server, {"ids": ["12", "9992"]})
    assert response.status_code == 200
    pages = response.json()["result"]
    for page, row in zip(pages, (rows[12], rows[9992])):
        assert page["id"] == row["id"] and page["passage_ids"] == [row["id"]]
        assert page["contents"] == row["contents"]  # the whole passage, title line included
        assert page["title"] == split_contents(row["contents"])[0] and page["url"] is None


def test_a_page_by_title_is_every_passage_of_the_title_in_corpus_order(pages_server):
    by_title = defaultdict(list)
    for row in corpus_rows():
        by_title[split_contents(row["contents"])[0]].append(row)
    title, rows = max(by_title.items(), key=lambda item: len(item[1]))  # the longest page (18 passages)
    assert len(rows) > 5
    for asked in (title, f'"{title}"', f"  {title.upper()} "):  # quotes, case and spacing do not matter
        page = access(pages_server, {"titles": [asked]}).json()["result"][0]
        assert page["passage_ids"] == [row["id"] for row in rows]
        assert page["contents"] == "\n".join([f'"{title}"', *(split_contents(r["contents"])[1] for r in rows)])


def test_page_access_after_a_search(pages_server):
    # what an agent does: search, then read the page of the top hit by the title it saw
    hit = httpx.post(f"{pages_server.url}/retrieve", json={"queries": ["Al-Qaeda leader"], "topk": 1}).json()["result"][0][0]
    title = split_contents(hit["document"]["contents"])[0]
    page = access(pages_server, {"titles": [title]}).json()["result"][0]
    assert hit["document"]["id"] in page["passage_ids"]
    assert split_contents(hit["document"]["contents"])[1] in page["contents"]


def test_unknown_values_are_a_404_naming_each(pages_server):
    response = access(pages_server, {"ids": ["3", "99999", "007"]})
    assert response.status_code == 404
    detail = response.json()["detail"]
    assert [d["loc"] for d in detail] == [["body", "ids", 1], ["body", "ids", 2]]  # "007" is not id "7"
    assert "'99999'" in detail[0]["msg"] and detail[0]["type"] == "not_found"
    response = access(pages_server, {"titles": ["No Such Page Title"]})
    assert response.status_code == 404 and "No Such Page Title" in response.json()["detail"][0]["msg"]


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"ids": ["1"], "titles": ["x"]}, "exactly one of"),  # two fields
        ({}, "exactly one of"),  # none
        ({"ids": []}, "at least 1 item"),  # empty list
        ({"ids": [1]}, "valid string"),  # not strings
        ({"ids": ["  "]}, "is blank"),  # a blank value
        ({"urls": ["https://en.wikipedia.org/wiki/Paris"]}, "reads pages by ids or titles"),  # the web backend's field
        ({"ids": ["1"] * 4097}, "max_queries=4096"),  # too many values
        ({"titles": ["x" * 4097]}, "max_query_chars=4096"),  # too long
        ({"id": ["1"]}, "Extra inputs are not permitted"),  # a typo of "ids"
    ],
)
def test_bad_input_is_a_422_naming_the_problem(pages_server, body, fragment):
    response = access(pages_server, body)
    assert response.status_code == 422, response.text
    assert fragment in response.text


def test_bad_json_is_a_422_not_a_500(pages_server):
    response = httpx.post(f"{pages_server.url}/access", content=b'{"ids": [NaN', timeout=30,
                          headers={"content-type": "application/json"})
    assert response.status_code == 422


def test_the_lookup_with_ids_that_are_not_row_numbers(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    rows = [{"id": "doc-b", "contents": '"B"\none'}, {"id": "doc-a", "contents": '"A"\ntwo'},
            {"id": "doc-c", "contents": '"B"\nthree'}]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lookup = PageLookup.open(JsonlCorpus(corpus), cache=False)
    assert lookup.by_id("doc-a").contents == '"A"\ntwo' and lookup.by_id("1") is None
    assert [p.id for p in lookup.by_title("b").passages] == ["doc-b", "doc-c"]
    assert normalise_title(' "B" ') == "b"


def test_serve_offers_access_and_the_title_table_is_cached(bm25_index, tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_SEARCH_CACHE", str(tmp_path))  # the child server inherits it
    with SubprocessServer(["--index", str(bm25_index)], ready_timeout=300) as server:
        page = access(server, {"titles": ["Al-Qaeda"]}).json()["result"][0]
        assert len(page["passage_ids"]) == 18
    assert list(tmp_path.glob("pages-*.npz"))  # the next start reads the table instead of the corpus
    with SubprocessServer(["--index", str(bm25_index), "--no-page-access"], ready_timeout=300) as server:
        assert access(server, {"ids": ["1"]}).status_code == 404  # no route
