"""Broken files on the real CLI (`python -m verl_search.server`, i.e.
`verl-search serve`, and `verl-search index build`): a truncated faiss file, a corpus shorter than
the index, a missing offset table, a manifest from another encoder, and a full disk during a build
(`RLIMIT_FSIZE` in the child, SIGXFSZ ignored, so writes fail with EFBIG). Each gives one clear
error line and a non-zero exit, and a build never leaves a half-written index."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MINI_CORPUS
from verl_search.server.local import free_port


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " ERROR " in line or line.startswith("Traceback")]


def serve(index: Path, *extra: str, cache: Path | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "verl_search.server", "--index", str(index), "--port", str(free_port()),
               "--log-level", "warning", *extra]
    env = {**os.environ, **({"VERL_SEARCH_CACHE": str(cache)} if cache else {})}
    return subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)


def copy_index(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / source.name
    shutil.copytree(source, target)
    return target


def assert_one_clear_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode != 0, result.stderr[-2000:]
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    for word in words:
        assert word in errors[0], errors[0]


def test_truncated_faiss_file(tmp_path, dense_index):
    index = copy_index(dense_index, tmp_path)
    faiss_file = index / "faiss.index"
    faiss_file.write_bytes(faiss_file.read_bytes()[: faiss_file.stat().st_size // 2])
    assert_one_clear_error(serve(index), "faiss.index", "truncated")


def test_corpus_shorter_than_the_index(tmp_path, bm25_index):
    shorter = tmp_path / "corpus.jsonl"
    lines = MINI_CORPUS.read_text(encoding="utf-8").splitlines(keepends=True)
    shorter.write_text("".join(lines[: len(lines) // 2]), encoding="utf-8")
    assert_one_clear_error(serve(bm25_index, "--corpus", str(shorter)), "bytes", "rebuild")


def test_corpus_shorter_than_a_search_r1_faiss_file(tmp_path, dense_index, minilm_path):
    shorter = tmp_path / "corpus.jsonl"
    lines = MINI_CORPUS.read_text(encoding="utf-8").splitlines(keepends=True)
    shorter.write_text("".join(lines[:100]), encoding="utf-8")
    result = serve(dense_index / "faiss.index", "--corpus", str(shorter), "--encoder", minilm_path,
                   cache=tmp_path / "cache")
    assert_one_clear_error(result, "100")


def test_missing_offset_table(tmp_path, bm25_index):
    index = copy_index(bm25_index, tmp_path)
    (index / "corpus.offsets.npy").unlink()
    assert_one_clear_error(serve(index), "corpus.offsets.npy")


def test_manifest_from_another_encoder(tmp_path, dense_index, minilm_path):
    index = copy_index(dense_index, tmp_path)
    other = tmp_path / "other_encoder"
    shutil.copytree(minilm_path, other)
    config = json.loads((other / "config.json").read_text())
    config["hidden_dropout_prob"] = 0.2  # another model folder as far as the fingerprint goes
    (other / "config.json").write_text(json.dumps(config))
    manifest = json.loads((index / "manifest.json").read_text())
    manifest["encoder"].update(path=str(other))  # the manifest names the other encoder; the index is MiniLM's
    (index / "manifest.json").write_text(json.dumps(manifest))
    assert_one_clear_error(serve(index), "not the one the index was built with")
    assert_one_clear_error(serve(dense_index, "--encoder", str(other)), "not the one the index was built with")


FULL_DISK = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
from verl_search.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("limit", [64 * 1024, 1024 * 1024])  # fails on the offset table / on the bm25 arrays
def test_full_disk_during_index_build(tmp_path, limit):
    out = tmp_path / "index"
    result = subprocess.run([sys.executable, "-c", FULL_DISK.format(limit=limit), "index", "build", "--corpus",
                             str(MINI_CORPUS), "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert_one_clear_error(result, "disk", str(tmp_path))
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no half-written index, no partial folder
