"""Passage lookup by row without holding the corpus as Python objects.

A corpus is a JSONL file of `{"id": str, "contents": "\\"Title\\"\\ntext", ...}` rows (the
Search-R1 / FlashRAG wiki-18 format). Row `i` of the faiss index or BM25 matrix is line `i` of
the file. `JsonlCorpus` keeps a table of byte offsets (`numpy.int64`, `num_passages + 1` entries,
8 bytes per passage: 168 MB for wiki-18's 21M passages) and reads a row straight from a memory
map of the file, so looking a passage up never loads the 14 GB corpus into memory.

A gzip-compressed corpus (`corpus.jsonl.gz`, recognised by its magic bytes; the shipped `mini-wiki`
corpus is one) is read without unpacking it to disk: offsets, sizes and the SHA-256 are those of
the decompressed lines, so an index built over the `.gz` also serves the unpacked file and back.
`JsonlCorpus` holds a gzip corpus decompressed in memory up to `GZIP_IN_MEMORY_BYTES` (5.4 MB for
`mini-wiki`); a larger one is unpacked once into `$VERL_SEARCH_CACHE/corpora/` and memory-mapped.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from verl_search.retrieval.base import Passage
from verl_search.runtime.env import read_env

logger = logging.getLogger(__name__)

_READ_CHUNK = 1 << 24  # bytes per read while scanning (16 MiB)
_GZIP_MAGIC = b"\x1f\x8b"
#: a gzip corpus up to this many bytes (decompressed) is held in memory; above it, unpacked to the cache
GZIP_IN_MEMORY_BYTES = 1 << 30


def is_gzip(path: str | os.PathLike) -> bool:
    """Whether the file starts with gzip's magic bytes.

    Raises:
        FileNotFoundError: if `path` does not exist.
    """
    with open(path, "rb") as handle:
        return handle.read(2) == _GZIP_MAGIC


def open_corpus(path: str | os.PathLike):
    """Open a corpus for binary reading: through gzip when it is gzip-compressed, else the file.

    Raises:
        FileNotFoundError: if `path` does not exist.
    """
    return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")


def corpus_bytes(path: str | os.PathLike) -> int:
    """The corpus's size in bytes as its offset table counts them: the file's size, or for gzip the
    decompressed size (read through once: about 35 ms per compressed MB on one core).

    Raises:
        FileNotFoundError: if `path` does not exist.
    """
    if not is_gzip(path):
        return Path(path).stat().st_size
    size = 0
    with gzip.open(path, "rb") as handle:
        while chunk := handle.read(_READ_CHUNK):
            size += len(chunk)
    return size


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
    with open_corpus(path) as handle:
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
    """SHA-256 (hex) of a corpus's bytes (decompressed for gzip, as `scan_corpus` hashes them), read
    in 16 MiB chunks."""
    digest = hashlib.sha256()
    with open_corpus(path) as handle:
        while chunk := handle.read(_READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def iter_passages(path: str | os.PathLike) -> Iterator[Passage]:
    """Stream the passages of a JSONL corpus in file order (constant memory).

    Raises:
        CorpusFormatError: on a malformed line, naming file and line.
    """
    with open_corpus(path) as handle:
        for lineno, line in enumerate(handle, start=1):
            yield parse_passage_line(line, path, lineno)


class JsonlCorpus:
    """Random access to the passages of a JSONL corpus by row number.

    Args:
        path: the corpus file.
        offsets: its offset table from `scan_corpus` (loaded with `np.load(..., mmap_mode="r")`
            is fine); computed by a full scan when omitted.

    A gzip corpus is decompressed into memory (up to `GZIP_IN_MEMORY_BYTES`), or unpacked once into
    the cache folder and memory-mapped; see the module docstring.

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
        self._file = None
        readable = self.path
        if is_gzip(self.path) and int(offsets[-1]) <= GZIP_IN_MEMORY_BYTES:
            with gzip.open(self.path, "rb") as handle:
                self._map = handle.read()
        else:
            if is_gzip(self.path):
                readable = _unpacked(self.path)
            self._file = open(readable, "rb")
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        size = len(self._map)
        if int(offsets[-1]) != size:
            self.close()
            raise ValueError(
                f"corpus {self.path} is {size} bytes but its offset table ends at {int(offsets[-1])}: "
                "the corpus changed since the index was built; rebuild the index or pass the original corpus"
            )

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
        """Release the memory map and the file handle (or the decompressed bytes)."""
        if self._file is not None:
            self._map.close()
            self._file.close()
        self._map = b""


def _unpacked(path: Path) -> Path:
    """A large gzip corpus unpacked once into `$VERL_SEARCH_CACHE/corpora/` (keyed by its path,
    size and modification time; written to a temporary name, then renamed)."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    target = read_env().cache_dir / "corpora" / f"{key}.jsonl"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        logger.info("unpacking %s into %s (too large to hold in memory)", path, target)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        try:
            with gzip.open(path, "rb") as source, open(tmp, "wb") as sink:
                while chunk := source.read(_READ_CHUNK):
                    sink.write(chunk)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    return target
