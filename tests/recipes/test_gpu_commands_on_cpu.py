"""The GPU path's commands, checked on the CPU where they can be (docs/training.md):

* examples/retrieval_server_wiki18.sh returns once /health says ready, the server still running (a tiny
  index in wiki-18's layout stands in for the 64 GB one; the real MiniLM encoder for e5);
* `verl-search download e5-index` joins the parts in order and removes them (small fake parts stand in
  for the 64 GB download);
* an index type faiss cannot copy to GPUs (HNSW, ...) stops the server at start with the way out, when
  GPUs would be used (faiss-cpu sees no GPU: the GPU count is faked, nothing is copied).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import FLASHRAG_SAMPLE, REPO
from verl_search.datasets.download import join_parts
from verl_search.server.local import free_port

SCRIPT = REPO / "examples" / "retrieval_server_wiki18.sh"


@pytest.fixture(scope="module")
def wiki18_layout(tmp_path_factory, minilm_path) -> Path:
    """`e5_Flat.index` + `wiki-18.jsonl` + `e5-base-v2/` as `verl-search download` leaves them, 12 passages."""
    import faiss
    from sentence_transformers import SentenceTransformer

    folder = tmp_path_factory.mktemp("wiki18")
    lines = FLASHRAG_SAMPLE.joinpath("sample_data.jsonl").read_text().splitlines()[:12]
    (folder / "wiki-18.jsonl").write_text("\n".join(lines) + "\n")
    model = SentenceTransformer(minilm_path, device="cpu")
    vectors = model.encode([json.loads(line)["contents"] for line in lines], normalize_embeddings=True)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.asarray(vectors, dtype="float32"))
    faiss.write_index(index, str(folder / "e5_Flat.index"))
    shutil.copytree(minilm_path, folder / "e5-base-v2")
    return folder


def _run_script(folder: Path, tmp_path: Path, port: int, timeout_s: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "WIKI18": str(folder), "PORT": str(port), "LOG": str(tmp_path / "server.log"),
           "PIDFILE": str(tmp_path / "server.pid"), "TIMEOUT": str(timeout_s - 30),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(["bash", str(SCRIPT), "--cpu"], capture_output=True, text=True, timeout=timeout_s,
                          env=env, cwd=tmp_path)


def test_serve_script_returns_once_ready_and_leaves_the_server_running(wiki18_layout, tmp_path):
    port = free_port()
    done = _run_script(wiki18_layout, tmp_path, port)
    pid = int((tmp_path / "server.pid").read_text())
    try:
        assert done.returncode == 0, done.stderr + (tmp_path / "server.log").read_text()[-2000:]
        assert f"ready at http://127.0.0.1:{port}/retrieve (pid {pid}" in done.stdout
        # the script has returned; the server it started answers at once, no waiting
        reply = httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": ["Evan Morris lobbyist"], "topk": 2},
                           timeout=30)
        assert reply.status_code == 200 and len(reply.json()["result"][0]) == 2
    finally:
        os.kill(pid, signal.SIGTERM)


def test_serve_script_fails_when_the_server_cannot_start(tmp_path):
    done = _run_script(tmp_path / "missing", tmp_path, free_port(), timeout_s=180)
    assert done.returncode == 1
    assert "retrieval server exited before it was ready; see" in done.stderr


def test_download_joins_the_index_parts_in_order_and_removes_them(tmp_path):
    chunks = {name: os.urandom(size) for name, size in (("part_aa", 1000), ("part_ab", 4097), ("part_ac", 3))}
    for name, data in chunks.items():
        (tmp_path / name).write_bytes(data)
    target = join_parts(sorted(tmp_path.glob("part_*")), tmp_path / "e5_Flat.index")
    assert target.read_bytes() == b"".join(chunks[name] for name in sorted(chunks))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e5_Flat.index"]  # parts and .partial gone
    with pytest.raises(FileNotFoundError, match="no index parts to join"):
        join_parts([], tmp_path / "other.index")


def _faiss_file(tmp_path: Path, factory: str) -> Path:
    import faiss

    vectors = np.random.default_rng(0).standard_normal((64, 8)).astype("float32")
    index = faiss.index_factory(8, factory, faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    path = tmp_path / f"{factory.replace(',', '_')}.index"
    faiss.write_index(index, str(path))
    return path


@pytest.mark.parametrize("factory, moves", [("Flat", True), ("IVF2,Flat", True), ("IVF2,PQ2x4", True),
                                             ("HNSW8", False), ("PQ2x4", False)])
def test_gpu_incompatible_index_types_are_named(factory, moves, tmp_path):
    import faiss

    from verl_search.retrieval.dense import check_gpu_compatible

    index = faiss.read_index(str(_faiss_file(tmp_path, factory)))
    if moves:
        check_gpu_compatible(index)
    else:
        with pytest.raises(ValueError, match=r"which faiss cannot copy to GPUs .*serve it with --cpu"):
            check_gpu_compatible(index)


def test_an_hnsw_index_stops_at_load_when_gpus_would_be_used(tmp_path, monkeypatch):
    from verl_search.retrieval import dense

    path = _faiss_file(tmp_path, "HNSW8")
    monkeypatch.setattr(dense, "num_faiss_gpus", lambda: 2)  # faiss-cpu sees none; what a GPU machine reports
    with pytest.raises(ValueError, match=r"is of type IndexHNSWFlat, which faiss cannot copy to GPUs"):
        dense.load_faiss_index(path)
    assert dense.load_faiss_index(path, use_gpu=False).ntotal == 64  # --cpu keeps it on the CPU


def test_download_e5_index_joins_once_and_is_not_fetched_again(tmp_path, monkeypatch):
    # the hub cannot be reached from here: a stand-in snapshot_download writes the parts as the hub's would
    import huggingface_hub

    from verl_search.datasets import download as module

    calls = []

    def fake_snapshot_download(repo_id, repo_type, local_dir, allow_patterns):
        calls.append(repo_id)
        for name in ("part_ab", "part_aa"):
            Path(local_dir, name).write_bytes(name.encode() * 3)

    monkeypatch.setattr(module, "check_reachable", lambda: None)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert module.download(["e5-index"], tmp_path) == [tmp_path / "e5_Flat.index"]
    assert (tmp_path / "e5_Flat.index").read_bytes() == b"part_aa" * 3 + b"part_ab" * 3
    assert not list(tmp_path.glob("part_*"))
    assert module.download(["e5-index"], tmp_path) == [tmp_path / "e5_Flat.index"]
    assert calls == ["PeterJinGo/wiki-18-e5-index"]  # the joined index is there: its parts are not fetched again
