"""Corpus parsing and offset-table lookup, on the real mini corpus and on hand-written files."""

import json

import numpy as np
import pytest

from tests.conftest import MINI_CORPUS
from verl_search.retrieval.base import Passage, split_contents
from verl_search.retrieval.corpus import CorpusFormatError, JsonlCorpus, scan_corpus


@pytest.mark.parametrize(
    "contents, expected",
    [
        ('"Paris"\nParis is the capital.', ("Paris", "Paris is the capital.")),  # Search-R1 layout
        ('"A "quoted" name"\ntext', ('A "quoted" name', "text")),  # inner quotes survive
        ("no title line", ("", "no title line")),  # no newline: all text
        ('"T"\nline one\nline two', ("T", "line one\nline two")),  # only the first newline splits
    ],
)
def test_split_contents(contents, expected):
    assert split_contents(contents) == expected


def test_offsets_give_every_row_of_the_real_corpus():
    offsets, sha = scan_corpus(MINI_CORPUS)
    corpus = JsonlCorpus(MINI_CORPUS, offsets)
    lines = MINI_CORPUS.read_text(encoding="utf-8").splitlines()
    assert len(corpus) == len(lines) == 9993
    assert len(sha) == 64
    for row in (0, 1, 4321, 9992):
        expected = json.loads(lines[row])
        assert corpus.get(row) == Passage(id=expected["id"], contents=expected["contents"])
    with pytest.raises(IndexError, match="row 9993 outside"):
        corpus.get(9993)


def test_malformed_line_is_reported_with_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "0", "contents": "\\"A\\"\\ntext"}\n{"id": "1", "text": "no contents"}\n')
    with pytest.raises(CorpusFormatError, match=r"bad.jsonl:2: expected an object with a string \"contents\""):
        scan_corpus(path)
    path.write_text('{"id": "0", "contents": "x"}\n\n')
    with pytest.raises(CorpusFormatError, match="bad.jsonl:2: blank line"):
        scan_corpus(path)


def test_changed_corpus_is_refused(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "0", "contents": "\\"A\\"\\ntext"}\n')
    offsets, _ = scan_corpus(path)
    path.write_text('{"id": "0", "contents": "\\"A\\"\\nlonger text"}\n')
    with pytest.raises(ValueError, match="the corpus changed since the index was built"):
        JsonlCorpus(path, np.asarray(offsets))
