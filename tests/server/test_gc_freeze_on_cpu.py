"""A serving process takes what it loaded out of the garbage collector's passes
(`server.serve.freeze_loaded`): a full collection would otherwise walk half a million long-lived
objects while holding the GIL and stall the batch worker. The real `python -m verl_search.server`."""

import gc
import re

from verl_search.server.serve import freeze_loaded
from verl_search.server.local import SubprocessServer


def test_freeze_loaded_returns_the_retriever_and_freezes_what_is_alive():
    retriever = {"index": list(range(10))}
    try:
        before = gc.get_freeze_count()
        assert freeze_loaded(retriever) is retriever
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()  # this test process goes on: give its objects back to the collector
    assert gc.get_freeze_count() == 0


def test_the_server_freezes_once_its_index_is_loaded(tmp_path, bm25_index):
    log = tmp_path / "server.log"
    server = SubprocessServer(["--index", str(bm25_index)], ready_timeout=120, log_path=str(log)).start()
    server.stop()
    text = log.read_text()
    frozen = re.search(r"(\d+) objects frozen out of the garbage collector", text)
    assert frozen and int(frozen.group(1)) > 10_000, text[-2000:]
    assert text.index("objects frozen") < text.index("index ready")  # before the first request is taken
