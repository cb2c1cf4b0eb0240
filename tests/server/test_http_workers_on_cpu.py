"""`serve --http-workers N`: N HTTP processes in front of one search process answer as one process does, and drain."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from verl_search.server.local import SubprocessServer


def _children(pid: int) -> list[int]:
    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()]


def test_two_http_workers_answer_as_one_process_and_drain(bm25_index, bm25_retriever, tmp_path):
    questions = ["Lilu mythology", "who wrote hamlet", "capital of france", "   ", "Cherry Creek hamlet"] * 4
    expected = [[hit.passage.id for hit in hits] for hits in bm25_retriever.search(questions, 3)]
    server = SubprocessServer(["--index", str(bm25_index), "--http-workers", "2"], ready_timeout=120,
                              log_path=str(tmp_path / "server.log")).start()
    try:
        workers = [pid for pid in _children(server.process.pid)
                   if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(workers) == 2

        def ask(i):  # one question a request, 8 clients at once: both workers, one batcher
            answer = httpx.post(f"{server.url}/retrieve", json={"queries": [questions[i]], "topk": 3}, timeout=60)
            answer.raise_for_status()
            return [hit["document"]["id"] for hit in answer.json()["result"][0]]

        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(ask, range(len(questions)))) == expected
        too_many = httpx.post(f"{server.url}/retrieve", json={"queries": ["x"], "topk": 10_000}, timeout=30)
        assert too_many.status_code == 422  # the same limits and errors as one process
        assert httpx.get(f"{server.url}/health", timeout=30).json()["retriever"] == "bm25"
    finally:
        server.process.terminate()  # SIGTERM: passed on to the workers, which drain
        code = server.process.wait(60)
    assert code == 0
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()
                and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"]


def test_http_workers_below_one_and_with_ray_are_refused(bm25_index):
    from verl_search import cli

    for flags in (["--http-workers", "0"], ["--http-workers", "2", "--ray"]):
        assert cli.main(["serve", "--index", str(bm25_index), *flags]) == 2


def test_the_search_process_errors_reach_the_worker(tmp_path):
    import threading
    from multiprocessing.connection import Listener

    from verl_search.retrieval.base import RetrieverUnavailableError
    from verl_search.server.settings import ServerSettings
    from verl_search.server.workers import RemoteRetriever, SearchProcess

    class Unpicklable(Exception):
        def __init__(self, message):
            super().__init__(message)
            self.lock = threading.Lock()  # pickle cannot carry it: a RuntimeError naming it comes instead

    class Scripted:
        kind, num_passages = "bm25", 3

        def search(self, queries, topk):
            if queries[0] == "bad":
                raise ValueError("bad query")
            if queries[0] == "odd":
                raise Unpicklable("odd query")
            return [[] for _ in queries]

    search = SearchProcess(Scripted(), ServerSettings())
    listener = Listener(str(tmp_path / "search.sock"), authkey=b"key")
    threading.Thread(target=search.listen, args=(listener,), daemon=True).start()
    remote = RemoteRetriever(str(tmp_path / "search.sock"), b"key", timeout=10)
    assert (remote.kind, remote.num_passages, remote.search(["a", "b"], 2)) == ("bm25", 3, [[], []])
    with pytest.raises(ValueError, match="bad query"):
        remote.search(["bad"], 1)
    with pytest.raises(RuntimeError, match="Unpicklable: odd query"):
        remote.search(["odd"], 1)
    assert remote.search(["c"], 1) == [[]]  # the connection still answers
    listener.close()
    search.close()
    remote._conn.close()
    with pytest.raises(RetrieverUnavailableError, match="search process has gone"):
        remote.search(["c"], 1)
