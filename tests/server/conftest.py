"""Fixtures shared by the server tests (the repository-wide ones are in tests/conftest.py)."""

import pytest

from tests.conftest import MINI_CORPUS


@pytest.fixture(scope="session")
def sharded_hybrid_index(dense_corpus, dense_index, minilm_path):
    """`hybrid_index` with its dense half split into 2 Flat shards (`index build --retriever hybrid --shards 2`)."""
    from verl_search.retrieval.index_builder import BuildOptions, build_index

    out = dense_corpus.parent / "hybrid_minilm_2shards"
    if not (out / "manifest.json").is_file():
        build_index(dense_corpus, out, BuildOptions(retriever="hybrid", encoder=minilm_path, shards=2,
                                                    from_faiss=str(dense_index), overwrite=True))
    return out


@pytest.fixture(scope="module")
def pages_server(bm25_retriever):
    """A plain uvicorn server (in a thread) over the BM25 mini index with `POST /access` on the mini corpus."""
    from verl_search.retrieval.corpus import JsonlCorpus
    from verl_search.retrieval.pages import PageLookup
    from verl_search.server.access import CorpusPages
    from verl_search.server.app import create_app, index_service
    from verl_search.server.local import ThreadServer

    pages = CorpusPages(PageLookup.open(JsonlCorpus(MINI_CORPUS), cache=False))
    with ThreadServer(create_app(index_service(bm25_retriever, pages=pages))) as server:
        yield server
