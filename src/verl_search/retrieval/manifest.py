"""`manifest.json`: what an index folder holds and what it was built from.

An index folder written by `verl-search index build` holds `manifest.json` plus the retriever's
files (`bm25/` for BM25, `faiss.index` for dense, both for hybrid) and `corpus.offsets.npy` (the corpus offset
table). The manifest records the corpus (path, size in bytes, SHA-256, number of passages) and,
for dense indexes, the encoder, its embedding dimension, prefixes and the faiss factory string,
so that `serve` can refuse an index served with the wrong encoder or the wrong corpus.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

MANIFEST_NAME = "manifest.json"
OFFSETS_NAME = "corpus.offsets.npy"
FAISS_NAME = "faiss.index"
BM25_DIR = "bm25"
FORMAT_VERSION = 1


class IndexMismatchError(ValueError):
    """The index cannot be served as asked (wrong encoder, dimension or corpus). Names the fix."""


@dataclass
class CorpusInfo:
    """The corpus an index was built over: path, size in bytes, SHA-256 hex, passages."""

    path: str
    bytes: int
    sha256: str
    num_passages: int


@dataclass
class EncoderInfo:
    """A dense encoder: its folder, a fingerprint of its config, its output dimension and prefixes.

    `fingerprint` is the SHA-256 of the folder's `config.json` (and `modules.json` when it is a
    sentence-transformers folder), so the same model at another path still matches. `backend`:
    the runtime that encoded the passages (`torch`, `onnx`, `openvino`; manifests written before it
    existed read as `torch`).
    """

    path: str
    fingerprint: str
    dim: int
    query_prefix: str = ""
    passage_prefix: str = ""
    normalize: bool = True
    max_length: int | None = None
    backend: str = "torch"

    def settings_fields(self) -> dict:
        """The fields an `EncoderSettings` takes (`path`, prefixes, `normalize`, `max_length`, `backend`)."""
        return {"path": self.path, "query_prefix": self.query_prefix, "passage_prefix": self.passage_prefix,
                "normalize": self.normalize, "max_length": self.max_length, "backend": self.backend}


@dataclass
class ShardInfo:
    """One part of a sharded dense index: its faiss `file` (in the index folder) holds corpus rows
    `first_row .. first_row + rows - 1`."""

    file: str
    first_row: int
    rows: int


@dataclass
class Manifest:
    """Contents of `manifest.json`. `retriever` is `"bm25"`, `"dense"` or `"hybrid"` (both over one
    corpus: `bm25/` and the faiss file(s), `encoder` and `bm25` both set; `retrieval.hybrid`); `shards`
    lists the parts of a sharded dense index (`index build --shards N`), `None` for one `faiss.index`."""

    retriever: Literal["bm25", "dense", "hybrid"]
    corpus: CorpusInfo
    encoder: EncoderInfo | None = None
    faiss_factory: str | None = None
    bm25: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    shards: list[ShardInfo] | None = None

    def write(self, folder: str | os.PathLike) -> None:
        """Write `manifest.json` into `folder` (flushed and fsynced)."""
        target = Path(folder) / MANIFEST_NAME
        with open(target, "w", encoding="utf-8") as handle:
            json.dump(asdict(self), handle, indent=2)
            handle.flush()
            os.fsync(handle.fileno())

    @classmethod
    def read(cls, folder: str | os.PathLike) -> "Manifest":
        """Read `manifest.json` from an index folder.

        Raises:
            FileNotFoundError: if the folder has no manifest (not an index, or a build that did
                not finish).
            ValueError: if the manifest is from a newer format or is malformed.
        """
        target = Path(folder) / MANIFEST_NAME
        if not target.is_file():
            raise FileNotFoundError(
                f"{folder} has no {MANIFEST_NAME}: it is not a finished index folder; "
                "build one with `verl-search index build`"
            )
        raw = json.loads(target.read_text(encoding="utf-8"))
        if raw.get("format_version", 0) > FORMAT_VERSION:
            raise ValueError(
                f"{target} has format_version {raw['format_version']}, newer than this verl-search "
                f"({FORMAT_VERSION}); upgrade verl-search"
            )
        try:
            encoder = EncoderInfo(**raw["encoder"]) if raw.get("encoder") else None
            return cls(
                retriever=raw["retriever"],
                corpus=CorpusInfo(**raw["corpus"]),
                encoder=encoder,
                faiss_factory=raw.get("faiss_factory"),
                bm25=raw.get("bm25", {}),
                format_version=raw.get("format_version", FORMAT_VERSION),
                shards=[ShardInfo(**shard) for shard in raw["shards"]] if raw.get("shards") else None,
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{target} is malformed ({exc}); rebuild the index") from exc


def encoder_fingerprint(encoder_path: str | os.PathLike) -> str:
    """SHA-256 of an encoder folder's `config.json` (+ `modules.json` if present).

    Raises:
        FileNotFoundError: if `encoder_path` has no `config.json`.
    """
    folder = Path(encoder_path)
    config = folder / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"encoder folder {folder} has no config.json; pass a Hugging Face model folder")
    digest = hashlib.sha256(config.read_bytes())
    modules = folder / "modules.json"
    if modules.is_file():
        digest.update(modules.read_bytes())
    return digest.hexdigest()


def check_encoder_matches(manifest: Manifest, encoder_path: str | os.PathLike, dim: int) -> None:
    """Refuse to serve a dense index with an encoder other than the one it was built with.

    Args:
        manifest: the index's manifest (`manifest.encoder` must be set).
        encoder_path: the encoder folder the server would use.
        dim: that encoder's embedding dimension.

    Raises:
        IndexMismatchError: on a different fingerprint or dimension, naming both.
    """
    built = manifest.encoder
    if built is None:
        raise IndexMismatchError("the manifest records no encoder; this is not a dense index")
    fingerprint = encoder_fingerprint(encoder_path)
    if fingerprint != built.fingerprint:
        raise IndexMismatchError(
            f"encoder {encoder_path} is not the one the index was built with ({built.path}, config "
            f"sha256 {built.fingerprint[:12]}, got {fingerprint[:12]}); pass --encoder {built.path} "
            "or rebuild the index with this encoder"
        )
    if dim != built.dim:
        raise IndexMismatchError(
            f"encoder {encoder_path} gives {dim}-d embeddings but the index holds {built.dim}-d vectors; "
            "use the encoder the index was built with"
        )
