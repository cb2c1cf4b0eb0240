"""`verl-search index build`: build a BM25 or dense index folder from a JSONL corpus.

The folder appears only when complete: everything is written into a hidden sibling
`.NAME.partial-PID/` and renamed to `NAME` at the end (a rename within one file system is
atomic), with `manifest.json` written last. A killed build leaves only the partial folder, which
never loads (it has no manifest under the requested name).

Dense builds encode the corpus in chunks of `chunk_size` passages and write each chunk's vectors
straight to a memory-mapped `.npy` file on disk, so the encoder's peak memory is one chunk, not
the corpus; faiss then trains (for IVF/PQ factories, on a random sample) and adds the vectors
chunk by chunk. The on-disk embeddings are deleted when the index is written.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from tqdm.auto import tqdm

from verl_search.datasets import resolve_corpus
from verl_search.runtime.exits import DiskWriteError

from verl_search.retrieval.bm25 import DEFAULT_BM25_PARAMS, build_bm25
from verl_search.retrieval.corpus import JsonlCorpus, iter_passages, scan_corpus
from verl_search.retrieval.dense import require_faiss
from verl_search.retrieval.encoder import INT8_BACKEND, EncoderBackend, EncoderSettings, SentenceEncoder
from verl_search.retrieval.manifest import (
    BM25_DIR,
    FAISS_NAME,
    OFFSETS_NAME,
    CorpusInfo,
    EncoderInfo,
    Manifest,
    encoder_fingerprint,
)
from verl_search.retrieval.quantize import calibration_passages
from verl_search.retrieval.shards import flat_vectors_of, shard_bounds, write_dense_index

logger = logging.getLogger(__name__)

EMBEDDINGS_NAME = "embeddings.f32.npy"


@dataclass
class BuildOptions:
    """Options of `build_index`.

    Attributes:
        retriever: `"bm25"`, `"dense"` or `"hybrid"` (both in one folder, one manifest; `retrieval.hybrid`).
        encoder: encoder folder (dense and hybrid).
        faiss_factory: faiss factory string, e.g. `"Flat"` (exact, default), `"HNSW64"`,
            `"IVF4096,PQ64"`; always inner-product metric.
        batch_size: passages per encoder forward pass.
        chunk_size: passages encoded and written to disk at a time (bounds peak memory).
        train_size: vectors sampled to train IVF/PQ indexes (ignored for Flat/HNSW).
        query_prefix, passage_prefix: encoder prefixes; `None` = the model family's default.
        max_length: encoder input limit in tokens (default: the model's own).
        encoder_backend: `"torch"` (default), `"onnx"`, `"openvino"` or `"openvino-int8"` (quantised
            on passages of this corpus, `retrieval.quantize`); see `SentenceEncoder`.
        overwrite: replace an existing output folder.
        seed: random seed for the training sample.
        shards: dense only: number of index parts (default 1: one `faiss.index`), see `retrieval.shards`.
        from_faiss: dense only: a flat faiss file (or an index folder holding `faiss.index`) whose
            vectors are split into `shards` parts instead of encoding the corpus again.
    """

    retriever: Literal["bm25", "dense", "hybrid"] = field(default="bm25", metadata={
        "help": "index kind (hybrid: BM25 and dense over one corpus, one folder, fused at serve time)"})
    encoder: str | None = field(default=None, metadata={
        "help": "dense: sentence-transformers / Hugging Face encoder folder"})
    faiss_factory: str = field(default="Flat", metadata={
        "help": "dense: faiss factory string (Flat, HNSW64, IVF4096,PQ64)"})
    batch_size: int = field(default=64, metadata={"help": "dense: passages per encoder pass"})
    chunk_size: int = field(default=8192, metadata={"help": "dense: passages encoded per chunk written to disk"})
    train_size: int = field(default=262_144, metadata={"help": "dense: vectors sampled to train IVF/PQ indexes"})
    query_prefix: str | None = field(default=None, metadata={
        "help": 'dense: query prefix (default: "query: " for e5, else none)'})
    passage_prefix: str | None = field(default=None, metadata={
        "help": 'dense: passage prefix (default: "passage: " for e5, else none)'})
    max_length: int | None = field(default=None, metadata={"help": "dense: encoder input limit in tokens"})
    encoder_backend: EncoderBackend = field(default="torch", metadata={
        "help": "dense: runtime of the encoder (onnx/openvino: CPU, extras [onnx]/[openvino]; openvino-int8: "
                "quantised on this corpus); recorded in the manifest"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing output folder"})
    seed: int = field(default=0, metadata={"help": "dense: seed of the IVF/PQ training sample"})
    shards: int = field(default=1, metadata={
        "help": "dense: split the rows evenly into this many faiss files (one manifest); serve --ray runs one deployment each"})
    from_faiss: str | None = field(default=None, metadata={
        "help": "dense: shard this existing flat faiss file (or index folder) instead of encoding the corpus"})


    def encoder_settings(self) -> EncoderSettings:
        """The encoder part of these options (dense builds)."""
        return EncoderSettings(self.encoder, self.query_prefix, self.passage_prefix, max_length=self.max_length,
                               backend=self.encoder_backend)


def build_index(corpus_path: str | os.PathLike, out_dir: str | os.PathLike, options: BuildOptions) -> Manifest:
    """Build an index folder over `corpus_path` (a JSONL file, gzip-compressed or not, or a shipped
    corpus by name: `mini-wiki`) at `out_dir` and return its manifest.

    Raises:
        FileExistsError: if `out_dir` exists and `options.overwrite` is false.
        FileNotFoundError: if the corpus or the encoder folder does not exist.
        ValueError: on a bad option (unknown retriever, dense without encoder) or a malformed
            corpus line (the error names file and line).
    """
    corpus_path = resolve_corpus(corpus_path).resolve()
    out_dir = Path(out_dir).resolve()
    if options.retriever not in ("bm25", "dense", "hybrid"):
        raise ValueError(f"retriever must be 'bm25', 'dense' or 'hybrid', got {options.retriever!r}")
    if options.retriever != "bm25" and not options.encoder:
        raise ValueError(f"a {options.retriever} index needs --encoder PATH (a sentence-transformers or Hugging Face folder)")
    if options.retriever == "bm25" and (options.shards != 1 or options.from_faiss):
        raise ValueError("--shards and --from-faiss apply to dense indexes only (and hybrid ones): pass --retriever dense or hybrid")
    if not corpus_path.is_file():
        raise FileNotFoundError(f"corpus {corpus_path} does not exist")
    if out_dir.exists() and not options.overwrite:
        raise FileExistsError(f"{out_dir} already exists; pass --overwrite to replace it")

    partial = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    try:
        logger.info("scanning corpus %s", corpus_path)
        offsets, sha256 = scan_corpus(corpus_path)
        np.save(partial / OFFSETS_NAME, offsets)
        corpus = CorpusInfo(
            path=str(corpus_path), bytes=int(offsets[-1]), sha256=sha256, num_passages=len(offsets) - 1
        )
        if options.retriever == "bm25":
            params = build_bm25((p.contents for p in iter_passages(corpus_path)), partial / BM25_DIR, DEFAULT_BM25_PARAMS)
            manifest = Manifest(retriever="bm25", corpus=corpus, bm25=params)
        else:
            manifest = _build_dense(corpus_path, corpus, offsets, partial, options)
            if options.retriever == "hybrid":  # the BM25 half beside the dense one, over the same rows
                manifest.retriever = "hybrid"
                manifest.bm25 = build_bm25((p.contents for p in iter_passages(corpus_path)), partial / BM25_DIR,
                                           DEFAULT_BM25_PARAMS)
        manifest.write(partial)
        _publish(partial, out_dir)
    except BaseException as exc:
        shutil.rmtree(partial, ignore_errors=True)
        if _out_of_room(exc):
            raise DiskWriteError(
                f"writing the index under {out_dir.parent} failed: {exc} (disk full, quota or file size limit?); "
                f"nothing was written to {out_dir}: free space or pass another --out"
            ) from exc
        raise
    logger.info("index written to %s", out_dir)
    return manifest


def _out_of_room(exc: BaseException) -> bool:
    """Whether `exc` is a write that ran out of room (ENOSPC, EFBIG, EDQUOT, or numpy's short write)."""
    if not isinstance(exc, OSError):
        return False
    return exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) or (exc.errno is None and "written" in str(exc))


def _build_dense(corpus_path: Path, corpus: CorpusInfo, offsets: np.ndarray, folder: Path, options: BuildOptions) -> Manifest:
    """Write `folder`'s faiss index (or shards); return the finished manifest (not yet written). `offsets`: the
    corpus's offset table, already scanned (int8 calibration reads its rows without a second pass)."""
    settings = options.encoder_settings()
    calibration = None
    if settings.backend == INT8_BACKEND:
        calibration = calibration_passages(JsonlCorpus(corpus_path, offsets))
    encoder = SentenceEncoder.from_settings(settings, batch_size=options.batch_size, calibration=calibration)
    if options.from_faiss:
        source = Path(options.from_faiss)
        empty, vectors_of = flat_vectors_of(source / FAISS_NAME if source.is_dir() else source,
                                            corpus.num_passages, encoder.dim)
        shards = write_dense_index(empty, vectors_of, corpus.num_passages, options.shards, folder, options.chunk_size)
        factory = "Flat"
    else:
        shards = _encode_and_index(corpus_path, corpus.num_passages, encoder, folder, options)
        factory = options.faiss_factory
    return Manifest(
        retriever="dense",
        corpus=corpus,
        encoder=EncoderInfo(**{**asdict(encoder.settings()), "path": str(Path(options.encoder).resolve())},
                            fingerprint=encoder_fingerprint(options.encoder), dim=encoder.dim),
        faiss_factory=factory,
        shards=shards,
    )


def _encode_and_index(corpus_path: Path, num_passages: int, encoder: SentenceEncoder, folder: Path,
                      options: BuildOptions):
    """Encode the corpus chunk by chunk to disk, train faiss, write the index or its shards."""
    faiss = require_faiss()
    shard_bounds(num_passages, options.shards)  # a bad --shards fails before the encoding
    embeddings_path = folder / EMBEDDINGS_NAME
    embeddings = np.lib.format.open_memmap(embeddings_path, mode="w+", dtype=np.float32, shape=(num_passages, encoder.dim))
    chunk: list[str] = []
    written = 0
    with tqdm(total=num_passages, unit="passage", desc="encoding") as progress:
        for passage in iter_passages(corpus_path):
            chunk.append(passage.contents)
            if len(chunk) == options.chunk_size:
                written = _write_chunk(embeddings, written, encoder.encode_passages(chunk), progress)
                chunk = []
        if chunk:
            written = _write_chunk(embeddings, written, encoder.encode_passages(chunk), progress)
    embeddings.flush()

    index = faiss.index_factory(encoder.dim, options.faiss_factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        rng = np.random.default_rng(options.seed)
        sample_rows = np.sort(rng.choice(num_passages, size=min(num_passages, options.train_size), replace=False))
        logger.info("training faiss %s on %d vectors", options.faiss_factory, len(sample_rows))
        index.train(np.ascontiguousarray(embeddings[sample_rows]))
    shards = write_dense_index(index, lambda start, stop: embeddings[start:stop], num_passages, options.shards,
                               folder, options.chunk_size)
    del embeddings
    embeddings_path.unlink()
    return shards


def _write_chunk(embeddings: np.ndarray, start: int, vectors: np.ndarray, progress: tqdm) -> int:
    embeddings[start : start + len(vectors)] = vectors
    progress.update(len(vectors))
    return start + len(vectors)


def _publish(partial: Path, out_dir: Path) -> None:
    """Move the finished folder into place; an existing one is replaced only after that."""
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
        os.rename(out_dir, old)
        os.rename(partial, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(partial, out_dir)
