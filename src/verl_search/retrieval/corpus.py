"""Passage lookup by row without holding the corpus as Python objects.

A corpus is a JSONL file of `{"id": str, "contents": "\\"Title\\"\\ntext", ...}` rows (the
Search-R1 / FlashRAG wiki-18 format). Row `i` of the faiss index or BM25 matrix is line `i` of
the file. `JsonlCorpus` keeps a table of byte offsets (`numpy.int64`, `num_passages + 1` entries,
8 bytes per passage: 168 MB for wiki-18's 21M passages) and reads a row straight from a memory
map of the file, so looking a passage up never loads the 14 GB corpus into memory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from verl_search.retrieval.base import Passage

logger = logging.getLogger(__name__)

_READ_CHUNK = 1 << 24  # bytes per read while scanning (16 MiB)


class CorpusFormatError(ValueError):
    """A corpus line is not a JSON object with a string `contents` (names file and line)."""


def parse_passage_line(line: bytes | str, path: str | os.PathLike, lineno: int) -> Passage:
    """Parse one corpus line into a `Passage`.

    Args:
        line: the raw line (bytes or str), with or without its newline.
        path, lineno: where it came from (1-based line number), for the error message.

    Raises:
        CorpusFormatError: if the line is not JSON, is not an object, or lacks a string `contents`.
    """
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CorpusFormatError(f"{path}:{lineno}: not valid JSON ({exc.msg}); each line must be one JSON object") from exc
    if not isinstance(row, dict) or not isinstance(row.get("contents"), str):
        raise CorpusFormatError(
            f'{path}:{lineno}: expected an object with a string "contents" field '
            '(format: {"id": "0", "contents": "\\"Title\\"\\ntext"})'
        )
    pid = row.get("id", lineno - 1)
    return Passage(id=str(pid), contents=row["contents"])


def scan_corpus(path: str | os.PathLike, validate: bool = True) -> tuple[np.ndarray, str]:
    """Read a JSONL corpus once: return its line offset table and its SHA-256.

    With `validate` (the default, used by the index builder) every line is parsed, so a malformed
    line fails here, with its line number, not at serving time. Blank lines are never allowed:
    row numbers must match line numbers.

    Returns:
        `(offsets, sha256_hex)` where `offsets` is an int64 array of `num_passages + 1` byte
        offsets (`offsets[i]:offsets[i+1]` is line `i`, newline included).

    Raises:
        FileNotFoundError: if `path` does not exist.
        CorpusFormatError: on the first malformed line.
    """
    path = Path(path)
    digest = hashlib.sha256()
    offsets = [0]
    position = 0
    lineno = 0
    with open(path, "rb") as handle:
        for line in handle:
            lineno += 1
            digest.update(line)
            if not line.strip():
                raise CorpusFormatError(f"{path}:{lineno}: blank line; remove it (row numbers must match lines)")
            if validate:
                parse_passage_line(line, path, lineno)
            position += len(line)
            offsets.append(position)
    if lineno == 0:
        raise CorpusFormatError(f"{path}: the corpus is empty")
    return np.asarray(offsets, dtype=np.int64), digest.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of a file, read in 16 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def iter_passages(path: str | os.PathLike) -> Iterator[Passage]:
    """Stream the passages of a JSONL corpus in file order (constant memory).

    Raises:
        CorpusFormatError: on a malformed line, naming file and line.
    """
    with open(path, "rb") as handle:
        for lineno, line in enumerate(handle, start=1):
            yield parse_passage_line(line, path, lineno)


class JsonlCorpus:
    """Random access to the passages of a JSONL corpus by row number.

    Args:
        path: the corpus file.
        offsets: its offset table from `scan_corpus` (loaded with `np.load(..., mmap_mode="r")`
            is fine); computed by a full scan when omitted.

    Thread safety: `get` only reads the memory map, so concurrent readers are safe.

    Raises:
        ValueError: if the offset table does not end at the file's size (the corpus changed
            since the index was built).
    """

    def __init__(self, path: str | os.PathLike, offsets: np.ndarray | None = None):
        self.path = Path(path)
        if offsets is None:
            logger.info("scanning %s to build its offset table", self.path)
            offsets, _ = scan_corpus(self.path)
        self._offsets = offsets
        size = self.path.stat().st_size
        if int(offsets[-1]) != size:
            raise ValueError(
                f"corpus {self.path} is {size} bytes but its offset table ends at {int(offsets[-1])}: "
                "the corpus changed since the index was built; rebuild the index or pass the original corpus"
            )
        self._file = open(self.path, "rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def get(self, row: int) -> Passage:
        """The passage on line `row` (0-based).

        Raises:
            IndexError: if `row` is outside `0..len(self)-1`.
        """
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} outside the corpus (0..{len(self) - 1})")
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        return parse_passage_line(self._map[start:end], self.path, row + 1)

    def close(self) -> None:
        """Release the memory map and the file handle."""
        self._map.close()
        self._file.close()
