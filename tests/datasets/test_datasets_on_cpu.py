"""The shipped mini-wiki dataset: its fixed train/test split, the gzip corpus read in place, the
named dataset on the command line, and the default train and test questions kept disjoint."""

from __future__ import annotations

import collections
import gzip
import hashlib
import json
import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import MINI_CORPUS, SHARED
from verl_search.datasets.preprocess import Source, build_rows
from verl_search.datasets import (
    DATASETS,
    DEFAULT_EVAL_DATA,
    DEFAULT_TRAIN_EXCLUDE,
    normalize_question,
    read_questions,
    resolve_corpus,
    split_of,
)
from verl_search.retrieval import corpus as corpus_module
from verl_search.retrieval.corpus import JsonlCorpus, corpus_bytes, file_sha256, scan_corpus

MINI = DATASETS["mini-wiki"]


def _cli(*argv, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verl_search.cli", *argv], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_the_shipped_files_are_the_documented_data():
    """Unpacked, the files are byte-identical to the offline bundle's data/mini_wiki/ (SHA-256 pinned)."""
    assert hashlib.sha256(gzip.decompress(MINI.corpus.read_bytes())).hexdigest() == (
        "77d3c5699426e779601c35dc81ef1c7cf35546a09d399ecbcb150b2f2e2505da")
    assert hashlib.sha256(gzip.decompress(MINI.questions.read_bytes())).hexdigest() == (
        "88d541b57f72f7a5487842f302641bd951139ba5f9df4c8d30f37f305be042f8")
    assert "## Licences" in (MINI.corpus.parent / "README.md").read_text()  # the attribution travels with the data


def test_split_is_fixed_stratified_and_disjoint():
    rows = read_questions("mini-wiki")
    train, test = read_questions("mini-wiki:train"), read_questions("mini-wiki:test")
    assert len(rows) == 1558 and len(train) + len(test) == len(rows)
    assert collections.Counter(r["source"] for r in test) == {"hotpotqa": 40, "musique": 40, "2wiki": 240}
    assert collections.Counter(r["source"] for r in train) == {"hotpotqa": 40, "musique": 40, "2wiki": 1158}
    assert not {r["id"] for r in train} & {r["id"] for r in test}
    assert not {normalize_question(r["question"]) for r in train} & {normalize_question(r["question"]) for r in test}
    # pinned: a change of the rule or the data changes which questions are held out
    digest = hashlib.sha256("\n".join(sorted(r["id"] for r in test)).encode()).hexdigest()
    assert digest[:16] == PINNED_TEST_IDS, digest
    assert set(split_of("mini-wiki").values()) == {"train", "test"}


PINNED_TEST_IDS = "acafa52f33be3ac0"  # sha256 of the sorted test ids


def test_unknown_split_names_the_choices():
    with pytest.raises(ValueError, match="unknown split 'dev'.*mini-wiki:train or mini-wiki:test"):
        Source.parse("mini-wiki:dev")
    with pytest.raises(ValueError, match="a corpus has no splits"):
        resolve_corpus("mini-wiki:test")


def test_gzip_corpus_reads_as_the_unpacked_file(tmp_path, monkeypatch):
    offsets, sha = scan_corpus(MINI.corpus)
    plain_offsets, plain_sha = scan_corpus(MINI_CORPUS)
    assert (offsets == plain_offsets).all() and sha == plain_sha == file_sha256(MINI.corpus)
    assert corpus_bytes(MINI.corpus) == MINI_CORPUS.stat().st_size
    in_memory, plain = JsonlCorpus(MINI.corpus, offsets), JsonlCorpus(MINI_CORPUS, plain_offsets)
    assert [in_memory.get(i) for i in (0, 4321, 9992)] == [plain.get(i) for i in (0, 4321, 9992)]
    # above the in-memory limit, the gzip corpus is unpacked once into the cache folder and memory-mapped
    monkeypatch.setattr(corpus_module, "GZIP_IN_MEMORY_BYTES", 1000)
    monkeypatch.setenv("VERL_SEARCH_CACHE", str(tmp_path))
    unpacked = JsonlCorpus(MINI.corpus, offsets)
    assert unpacked.get(4321) == plain.get(4321)
    assert [p.read_bytes() for p in (tmp_path / "corpora").iterdir()] == [MINI_CORPUS.read_bytes()]
    for each in (in_memory, plain, unpacked):
        each.close()


def test_index_built_by_name_from_any_folder_serves_like_the_unpacked_corpus(tmp_path, bm25_retriever):
    from verl_search.retrieval.loader import resolve_index
    from verl_search.retrieval.manifest import Manifest

    done = _cli("index", "build", "--corpus", "mini-wiki", "--out", "idx", "--retriever", "bm25", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    manifest = Manifest.read(tmp_path / "idx")
    assert manifest.corpus.path == str(MINI.corpus) and manifest.corpus.bytes == MINI_CORPUS.stat().st_size
    questions = [r["question"] for r in read_questions("mini-wiki:test")[:8]]
    expected = bm25_retriever.search(questions, 3)
    for corpus in (None, "mini-wiki", str(MINI_CORPUS)):  # the manifest's .gz, the name, the unpacked file
        retriever = resolve_index(tmp_path / "idx", corpus=corpus, verify_corpus=True).load()
        assert retriever.search(questions, 3) == expected


def test_eval_defaults_to_the_test_split():
    from verl_search.eval.rows import select_rows

    assert DEFAULT_EVAL_DATA == "mini-wiki:test"
    rows = select_rows([DEFAULT_EVAL_DATA], "search_r1", max_per_source=40, seed=0)
    assert collections.Counter(r["data_source"] for r in rows) == {"hotpotqa": 40, "musique": 40, "2wiki": 40}


def test_default_train_and_test_questions_are_disjoint(tmp_path):
    """The training sets the docs build (mini-wiki:train on the CPU, MuSiQue train on GPUs, whose file
    holds mini-wiki's 80 musique questions) share no question with the default eval set."""
    eval_texts = {normalize_question(r["question"]) for r in read_questions(DEFAULT_EVAL_DATA)}
    musique_train = SHARED / "data" / "qa" / "musique" / "train.jsonl"
    raw = {normalize_question(r["question"]) for r in read_questions(musique_train)}
    assert len(raw & eval_texts) == 40  # the leak the default exclusion removes
    assert DEFAULT_TRAIN_EXCLUDE == (DEFAULT_EVAL_DATA,)
    for name, inputs in (("cpu", ["mini-wiki:train"]), ("gpu", [str(musique_train)])):
        out = tmp_path / f"{name}.parquet"
        done = _cli("preprocess", "--split", "train", "--input", *inputs, "--out", str(out))
        assert done.returncode == 0, done.stderr
        texts = {normalize_question(info["question"]) for info in pd.read_parquet(out)["extra_info"]}
        assert texts and not texts & eval_texts, name
    assert "left out 40 questions" in done.stderr
    kept = tmp_path / "kept.parquet"
    assert _cli("preprocess", "--split", "train", "--input", str(musique_train), "--exclude", "none",
                "--out", str(kept)).returncode == 0
    assert len(pd.read_parquet(kept)) == len(raw)  # --exclude none keeps every row


@pytest.mark.parametrize("line, what", [
    ('{"id": "2", question: "x"}', "not valid JSON"),
    ('["a list"]', "not a JSON object"),
    ('{"id": "2", "question": "Who?", "golden_answers": []}', '"golden_answers" must be a non-empty list'),
    ('{"id": "2", "golden_answers": ["a"]}', '"question" must be a non-empty string'),
])
def test_preprocess_errors_name_file_line_and_what_is_wrong(tmp_path, line, what):
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"id": "1", "question": "Who?", "golden_answers": ["a"]}) + "\n" + line + "\n")
    done = _cli("preprocess", "--split", "test", "--input", str(path), "--out", str(tmp_path / "x.parquet"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{path}:2: " in done.stderr and what in done.stderr
    assert not (tmp_path / "x.parquet").exists()


def test_preprocess_reads_gzip_and_the_script_is_the_same_command(tmp_path):
    from tests.conftest import REPO

    path = tmp_path / "nq" / "test.jsonl.gz"
    path.parent.mkdir()
    path.write_bytes(gzip.compress(b'{"id": "1", "question": "who wrote hamlet", "golden_answers": ["Shakespeare"]}\n'))
    rows = build_rows([Source.parse(str(path))], "test", "tool")
    assert len(rows) == 1 and rows[0]["data_source"] == "nq"
    out = tmp_path / "test.parquet"
    done = subprocess.run([sys.executable, str(REPO / "data_preprocess" / "preprocess_search_r1.py"), "--split", "test",
                           "--input", str(path), "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert list(pd.read_parquet(out)["data_source"]) == ["nq"]
