"""Sharded dense indexes: N faiss parts over consecutive corpus rows, searched apart, merged by score.

`verl-search index build --shards N` splits the corpus rows evenly (`shard_bounds`) and writes one
faiss file per part (`faiss-00000-of-00004.index` ...) beside one `manifest.json` that lists them
(`Manifest.shards`: file, first row, rows) and one corpus offset table. IVF/PQ factories are
trained once, on a sample of the whole corpus, and every shard starts from that trained empty
index, so the shards share one coarse quantizer. `--from-faiss FILE` shards an existing flat index
(e.g. Search-R1's `e5_Flat.index`) without encoding the corpus again.

A query is encoded once; each shard returns its own top-k with *corpus* rows (`search_faiss` adds
the shard's first row) and `merge_topk` keeps the best `topk` by score. With `Flat` shards the
merged hits equal the unsharded index's hits (each shard's top-k holds every global top-k row that
lives in it). `ShardedDenseRetriever` does this in one process; `server.ray_serve` runs one Ray
Serve deployment per shard (a 21M x 768 flat index over 4 GPUs: 8 GB each in fp16) and a front
deployment that encodes and merges.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np

from verl_search.retrieval.base import Hit, ScoredRows
from verl_search.retrieval.corpus import JsonlCorpus
from verl_search.retrieval.dense import require_faiss, search_encoded, search_encoded_rows, search_faiss
from verl_search.retrieval.encoder import SentenceEncoder
from verl_search.retrieval.manifest import FAISS_NAME, ShardInfo

logger = logging.getLogger(__name__)

#: `(vectors (n, d) float32, topk) -> one (scores, rows) pair per shard`, rows in corpus numbering
SearchShards = Callable[[np.ndarray, int], list[tuple[np.ndarray, np.ndarray]]]


def shard_bounds(num_rows: int, shards: int) -> list[tuple[int, int]]:
    """Split rows `0..num_rows-1` into `shards` consecutive parts whose sizes differ by at most one.

    >>> shard_bounds(10, 3)
    [(0, 4), (4, 3), (7, 3)]

    Returns:
        `(first_row, rows)` per shard.

    Raises:
        ValueError: if `shards < 1` or `shards > num_rows`.
    """
    if shards < 1 or shards > num_rows:
        raise ValueError(f"--shards must be between 1 and the number of passages ({num_rows}), got {shards}")
    base, extra = divmod(num_rows, shards)
    bounds, first = [], 0
    for shard in range(shards):
        rows = base + (1 if shard < extra else 0)
        bounds.append((first, rows))
        first += rows
    return bounds


def shard_file_name(shard: int, shards: int) -> str:
    """`faiss-00001-of-00004.index` for shard 1 of 4."""
    return f"faiss-{shard:05d}-of-{shards:05d}.index"


def write_dense_index(empty_index, vectors_of: Callable[[int, int], np.ndarray], num_rows: int, shards: int,
                      folder: Path, chunk_size: int) -> list[ShardInfo] | None:
    """Fill copies of a trained, empty faiss index with the rows and write them into `folder`.

    Args:
        empty_index: a trained faiss index holding no vectors (cloned for each shard).
        vectors_of: `(start, stop) -> float32 array (stop - start, d)` of corpus rows.
        num_rows: rows in the corpus.
        shards: 1 writes `faiss.index`; N > 1 writes N shard files.
        folder: the (partial) index folder.
        chunk_size: rows added to faiss at a time.

    Returns:
        the shards for the manifest, or `None` for a single `faiss.index`.

    Raises:
        ValueError: see `shard_bounds`.
    """
    faiss = require_faiss()
    bounds = shard_bounds(num_rows, shards)
    infos = []
    for shard, (first, rows) in enumerate(bounds):
        index = faiss.clone_index(empty_index)
        for start in range(first, first + rows, chunk_size):
            index.add(np.ascontiguousarray(vectors_of(start, min(start + chunk_size, first + rows)), dtype=np.float32))
        name = FAISS_NAME if shards == 1 else shard_file_name(shard, shards)
        faiss.write_index(index, str(folder / name))
        infos.append(ShardInfo(file=name, first_row=first, rows=rows))
        logger.info("wrote %s: rows %d..%d", name, first, first + rows - 1)
    return None if shards == 1 else infos


def flat_vectors_of(faiss_path: Path, num_passages: int, dim: int):
    """Open an existing flat faiss index to be sharded (`index build --from-faiss`).

    Returns:
        `(empty_index, vectors_of)` for `write_dense_index`: an empty `IndexFlatIP` of the same
        dimension and a reader of the file's rows (`reconstruct_n`).

    Raises:
        ValueError: the file is not a flat index, or its size or dimension differs from the corpus
            and the encoder (`num_passages`, `dim`).
    """
    from verl_search.retrieval.dense import load_faiss_index

    faiss = require_faiss()
    source = load_faiss_index(faiss_path, use_gpu=False)  # owns the C++ index: keep it referenced
    kind = type(faiss.downcast_index(source))
    if not issubclass(kind, faiss.IndexFlat):
        raise ValueError(f"--from-faiss {faiss_path} is a {kind.__name__}; only flat indexes can be split "
                         "without re-encoding: rebuild from the corpus with --shards N instead")
    if source.ntotal != num_passages or source.d != dim:
        raise ValueError(f"--from-faiss {faiss_path} holds {source.ntotal} x {source.d} vectors but the corpus has "
                         f"{num_passages} passages and the encoder gives {dim}-d vectors")
    return faiss.IndexFlatIP(source.d), lambda start, stop: source.reconstruct_n(start, stop - start)


def merge_topk(parts: list[tuple[np.ndarray, np.ndarray]], topk: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-shard results into the best `topk` by score.

    Args:
        parts: per shard, `(scores, rows)` of shape `(n, k_i)` (`search_faiss` output, corpus rows).
        topk: hits to keep per query.

    Returns:
        `(scores, rows)` of shape `(n, min(topk, sum k_i))`, best first; equal scores keep shard order
        (lower rows first).
    """
    scores = np.concatenate([part[0] for part in parts], axis=1)
    rows = np.concatenate([part[1] for part in parts], axis=1)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :topk]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(rows, order, axis=1)


class ShardIndex:
    """One loaded shard: `search(vectors, topk) -> (scores, rows)` in corpus row numbering.

    Args:
        index: the shard's faiss index; info: its `ShardInfo` (first row, rows).
    """

    def __init__(self, index, info: ShardInfo):
        if index.ntotal != info.rows:
            raise ValueError(f"shard {info.file} holds {index.ntotal} vectors, the manifest says {info.rows}; rebuild")
        self.index, self.info = index, info

    def search(self, vectors: np.ndarray, topk: int) -> tuple[np.ndarray, np.ndarray]:
        """`search_faiss` on this shard: arrays of shape `(len(vectors), min(topk, rows))`."""
        return search_faiss(self.index, vectors, topk, self.info.first_row)


class ShardedDenseRetriever:
    """Dense search over index shards: encode the batch once, search every shard, merge by score.

    Args:
        encoder: the query encoder.
        corpus: passage lookup by (corpus) row.
        search_shards: the fan-out (`SearchShards`): in-process shards (`in_process`) or remote ones
            (Ray Serve handles, `server.ray_serve`).
        shards: the manifest's shards; together they must hold every corpus row once.

    Raises:
        ValueError: the shards do not cover the corpus rows `0..len(corpus)-1` in order.
    """

    kind = "dense"

    def __init__(self, encoder: SentenceEncoder, corpus: JsonlCorpus, search_shards: SearchShards,
                 shards: list[ShardInfo]):
        num_passages = sum(info.rows for info in shards)
        if num_passages != len(corpus) or any(a.first_row + a.rows != b.first_row for a, b in zip(shards, shards[1:])):
            raise ValueError(f"the shards hold {num_passages} vectors but corpus {corpus.path} has {len(corpus)} "
                             "passages, or they are not consecutive; use the corpus the index was built from")
        self.encoder, self.corpus, self.search_shards = encoder, corpus, search_shards
        self.num_passages = num_passages

    @staticmethod
    def in_process(shards: list[ShardIndex]) -> SearchShards:
        """The fan-out over shards loaded in this process (one after the other)."""
        return lambda vectors, topk: [shard.search(vectors, topk) for shard in shards]

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Top-`topk` passages for each query over all shards (see `Retriever.search`)."""
        return search_encoded(queries, topk, self.encoder.encode_queries,
                              lambda vectors, k: merge_topk(self.search_shards(vectors, k), k), self.corpus)

    def search_rows(self, queries: list[str], topk: int) -> list[ScoredRows]:
        """Like `search`, but `(corpus row, score)` pairs, no passage looked up (hybrid fusion)."""
        return search_encoded_rows(queries, topk, self.encoder.encode_queries,
                                   lambda vectors, k: merge_topk(self.search_shards(vectors, k), k))
