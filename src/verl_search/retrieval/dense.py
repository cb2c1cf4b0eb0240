"""Dense retrieval: a sentence encoder plus a faiss inner-product index.

On a machine where faiss sees GPUs (`faiss-gpu`), the index is copied to *all* visible GPUs,
sharded (each GPU holds `1/num_gpus` of the vectors) and in fp16: a flat e5 index over wiki-18
(21M x 768) is about 64 GB in fp32 and does not fit on one GPU, but 32 GB in fp16 split across
GPUs does. Elsewhere the index stays on the CPU.

Not thread safe: faiss GPU search must not run from two threads at once. The server calls
`search` from a single worker thread (see `verl_search.server.batcher`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import numpy as np

from verl_search.retrieval.base import Hit, ScoredRows, hits_of_rows
from verl_search.retrieval.corpus import JsonlCorpus
from verl_search.retrieval.encoder import SentenceEncoder
from verl_search.retrieval.manifest import IndexMismatchError

logger = logging.getLogger(__name__)


def require_faiss():
    """Import faiss or raise an ImportError that says which package to install."""
    try:
        import faiss
    except ImportError as exc:
        from verl_search.runtime.extras import install_line

        raise ImportError(f"dense retrieval needs faiss: {install_line('dense')} (CPU) or faiss-gpu-cu12 (GPU)") from exc
    return faiss


def num_faiss_gpus() -> int:
    """GPUs faiss can use (0 with faiss-cpu)."""
    faiss = require_faiss()
    get_num_gpus = getattr(faiss, "get_num_gpus", None)
    return int(get_num_gpus()) if get_num_gpus else 0


#: faiss index classes faiss's GPU cloner copies to GPUs (`faiss/gpu/GpuCloner.cpp`, `ToGpuCloner::clone_Index`);
#: an `IndexPreTransform` (e.g. `OPQ16,IVF4096,PQ16`) moves when the index it wraps does
GPU_INDEX_TYPES = frozenset({"IndexFlat", "IndexFlatIP", "IndexFlatL2", "IndexIVFFlat", "IndexIVFPQ",
                             "IndexIVFScalarQuantizer"})


def check_gpu_compatible(index, path: str | os.PathLike = "the index") -> None:
    """Raise before anything is copied if faiss cannot put `index` on GPUs (HNSW, PQ or SQ without IVF, ...).

    Raises:
        ValueError: naming the index type, the types that move, and the two ways out (serve `--cpu`, or
            rebuild with a GPU-capable `--faiss-factory`: `Flat`, `IVF4096,Flat`, `IVF4096,PQ64`).
    """
    faiss = require_faiss()
    inner = faiss.downcast_index(index)
    while type(inner).__name__ == "IndexPreTransform":
        inner = faiss.downcast_index(inner.index)
    name = type(inner).__name__
    if name not in GPU_INDEX_TYPES:
        raise ValueError(f"faiss index {path} is of type {name}, which faiss cannot copy to GPUs (it can: "
                         f"{', '.join(sorted(GPU_INDEX_TYPES))}); serve it with --cpu, or rebuild it with a GPU "
                         "index type: index build --faiss-factory Flat | IVF4096,Flat | IVF4096,PQ64")


def load_faiss_index(path: str | os.PathLike, use_gpu: bool | None = None, before_move: Callable | None = None):
    """Read a faiss index file; move it to all GPUs (sharded, fp16) when there are any.

    Args:
        path: the index file (`faiss.write_index` output, e.g. Search-R1's `e5_Flat.index`).
        use_gpu: `None` (default) uses GPUs when faiss sees some; `False` keeps it on the CPU;
            `True` requires GPUs.
        before_move: called with the index as read, on the CPU, before it moves (e.g. `verify_encoder`,
            which reads stored vectors back: faiss's sharded GPU index cannot).

    Raises:
        ValueError: if the file cannot be read (truncated, corrupt, not a faiss index), or GPUs are to be
            used and its type cannot move to them (`check_gpu_compatible`: HNSW, ...).
        RuntimeError: if `use_gpu=True` and faiss sees no GPU.
    """
    faiss = require_faiss()
    try:
        index = faiss.read_index(str(path))
    except RuntimeError as exc:  # faiss's C++ error: a long message naming its own source file
        reason = str(exc).rsplit("failed: ", 1)[-1].strip()
        raise ValueError(f"faiss index {path} cannot be read (truncated or corrupt: {reason}); "
                         "rebuild it with `verl-search index build`") from exc
    if before_move is not None:
        before_move(index)
    gpus = num_faiss_gpus()
    if use_gpu and gpus == 0:
        raise RuntimeError("use_gpu=True but faiss sees no GPU; install faiss-gpu-cu12 or pass use_gpu=False")
    if gpus and use_gpu is not False:
        check_gpu_compatible(index, path)
        options = faiss.GpuMultipleClonerOptions()
        options.shard = True
        options.useFloat16 = True
        logger.info("moving faiss index (%d vectors) to %d GPUs, sharded, fp16", index.ntotal, gpus)
        index = faiss.index_cpu_to_all_gpus(index, co=options)
    return index


class DenseRetriever:
    """Batch dense search: encode all queries in one pass, one faiss search for the batch.

    Args:
        index: a faiss index (inner product; row `i` is corpus line `i`).
        encoder: the query encoder; its `dim` must equal `index.d`.
        corpus: passage lookup by row.

    Raises:
        ValueError: if `encoder.dim != index.d` or the index and corpus sizes differ.
    """

    kind = "dense"

    def __init__(self, index, encoder: SentenceEncoder, corpus: JsonlCorpus):
        if encoder.dim != index.d:
            raise ValueError(
                f"encoder {encoder.path} gives {encoder.dim}-d vectors but the faiss index holds {index.d}-d "
                "vectors; use the encoder the index was built with"
            )
        if index.ntotal != len(corpus):
            raise ValueError(
                f"faiss index has {index.ntotal} vectors but corpus {corpus.path} has {len(corpus)} passages; "
                "use the corpus the index was built from"
            )
        self.index = index
        self.encoder = encoder
        self.corpus = corpus
        self.num_passages = int(index.ntotal)

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """Top-`topk` passages for each query (see `Retriever.search`); inner-product scores."""
        return [hits_of_rows(self.corpus, rows) for rows in self.search_rows(queries, topk)]

    def search_rows(self, queries: list[str], topk: int) -> list[ScoredRows]:
        """Like `search`, but `(corpus row, inner product)` pairs, no passage looked up (`search_encoded_rows`)."""
        return search_encoded_rows(queries, topk, self.encoder.encode_queries,
                                   lambda vectors, k: search_faiss(self.index, vectors, k))


def search_faiss(index, vectors: np.ndarray, topk: int, first_row: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One faiss search of already-encoded query vectors.

    Args:
        index: a faiss index (inner product) holding corpus rows `first_row .. first_row + ntotal - 1`.
        vectors: float32 array of shape `(n, d)`.
        topk: hits wanted per query (>= 1); at most `index.ntotal` come back.
        first_row: the corpus row of the index's row 0 (an index shard, see `retrieval.shards`).

    Returns:
        `(scores, rows)`, both of shape `(n, min(topk, ntotal))`: float32 inner products, best first,
        and int64 corpus rows (`-1` where faiss found fewer hits).
    """
    scores, rows = index.search(np.ascontiguousarray(vectors, dtype=np.float32), max(1, min(topk, int(index.ntotal))))
    rows = np.where(rows >= 0, rows + first_row, -1)
    return scores, rows


def search_encoded(
    queries: list[str],
    topk: int,
    encode: Callable[[list[str]], np.ndarray],
    search_vectors: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]],
    corpus: JsonlCorpus,
) -> list[list[Hit]]:
    """Dense search of a batch: encode the non-blank queries once, search, look the rows up.

    Args:
        queries: the batch; a blank query gets `[]` and is not encoded.
        topk: passages per query (>= 1).
        encode: queries -> float32 vectors of shape `(n, d)` (`SentenceEncoder.encode_queries`).
        search_vectors: `(vectors, topk) -> (scores, rows)` as `search_faiss` returns them (one
            index, or several shards merged).
        corpus: passage lookup by row.

    Returns:
        `len(queries)` lists of at most `topk` hits, best first.

    Raises:
        ValueError: if `topk < 1`.
    """
    return [hits_of_rows(corpus, rows) for rows in search_encoded_rows(queries, topk, encode, search_vectors)]


def search_encoded_rows(
    queries: list[str],
    topk: int,
    encode: Callable[[list[str]], np.ndarray],
    search_vectors: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]],
) -> list[ScoredRows]:
    """`search_encoded` without the passage lookup: per query, at most `topk` `(corpus row, score)`
    pairs, best first (`[]` for a blank query). Raises ValueError if `topk < 1`."""
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    results: list[ScoredRows] = [[] for _ in queries]
    live = [i for i, query in enumerate(queries) if query.strip()]
    if not live:
        return results
    scores, rows = search_vectors(encode([queries[i] for i in live]), topk)
    for position, query_index in enumerate(live):
        results[query_index] = [
            (int(row), float(score))
            for row, score in zip(rows[position].tolist(), scores[position].tolist())
            if row >= 0
        ]
    return results


def verify_backend(index, encoder: SentenceEncoder, corpus: JsonlCorpus, rows: int = 16, min_cosine: float = 0.99) -> float:
    """Check that `encoder` (e.g. another backend than the index was built with) embeds passages as
    the index holds them: encode the first `rows` passages and compare with the stored vectors.

    Args:
        index: a faiss index that stores its vectors (`Flat`, `HNSW`: `reconstruct` works).
        encoder, corpus: the serving encoder and the index's corpus.
        rows: passages compared (default 16); min_cosine: lowest accepted cosine (default 0.99).

    Returns:
        the lowest cosine found.

    Raises:
        IndexMismatchError: a cosine below `min_cosine`, or an index whose vectors cannot be read
            back (IVF/PQ compress them): serve with the backend recorded in the manifest.
    """
    count = min(rows, int(index.ntotal))
    try:
        stored = np.stack([index.reconstruct(i) for i in range(count)])
    except RuntimeError as exc:
        raise IndexMismatchError(
            f"encoder backend {encoder.backend!r} cannot be checked against this index (it does not store "
            "its vectors); serve it with the backend recorded in its manifest or rebuild it with this one") from exc
    fresh = encoder.encode_passages([corpus.get(i).contents for i in range(count)])
    norms = np.linalg.norm(stored, axis=1) * np.linalg.norm(fresh, axis=1)
    worst = float(np.min(np.sum(stored * fresh, axis=1) / np.maximum(norms, 1e-12)))
    if worst < min_cosine:
        raise IndexMismatchError(
            f"encoder backend {encoder.backend!r} embeds passages unlike the index (lowest cosine {worst:.4f} over "
            f"{count} passages, need >= {min_cosine}); serve with the manifest's backend or rebuild the index")
    logger.info("encoder backend %s matches the index (lowest cosine %.5f over %d passages)", encoder.backend, worst, count)
    return worst


#: lowest cosine accepted between the index's stored vectors and passages embedded by the same runtime in half
#: precision (a CUDA encoder in fp16, `encoder.device_runtime`)
HALF_PRECISION_MIN_COSINE = 0.999


def verify_encoder(index, encoder: SentenceEncoder, corpus: JsonlCorpus, built_with: str) -> float | None:
    """Check the serving encoder against the index's stored vectors where it may embed differently from the
    encoder that built it: another backend (`verify_backend`, cosine >= 0.99), or the same backend in half
    precision (`encoder.precision` fp16/bf16, cosine >= `HALF_PRECISION_MIN_COSINE`). A half-precision encoder
    that fails its check is put back to fp32 (`SentenceEncoder.set_precision`, with a warning), not refused.

    Args:
        index: the index as loaded (faiss on the CPU, or `torch_exact.TorchExactIndex`).
        encoder, corpus: the serving encoder and the index's corpus.
        built_with: the backend that encoded the index (the manifest's; `torch` for the Search-R1 layout).

    Returns:
        the lowest cosine found, or None where nothing was checked (same backend in fp32; half precision over an
        index that does not store its vectors, or put back to fp32: both logged as warnings).

    Raises:
        IndexMismatchError: another backend than `built_with` fails `verify_backend`.
    """
    if encoder.backend != built_with:
        return verify_backend(index, encoder, corpus)
    if encoder.precision == "float32":
        return None
    try:
        return verify_backend(index, encoder, corpus, min_cosine=HALF_PRECISION_MIN_COSINE)
    except IndexMismatchError as exc:
        if "does not store" in str(exc):
            logger.warning("the %s query encoder cannot be checked against this index (it does not store its "
                           "vectors); serving it unchecked", encoder.precision)
        else:
            logger.warning("the query encoder in %s embeds passages unlike the index (%s); encoding in float32",
                           encoder.precision, str(exc).split("(", 1)[-1].split(")")[0])
            encoder.set_precision("float32")
        return None
