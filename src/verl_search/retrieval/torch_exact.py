"""Exact search in torch: a faiss Flat index searched by matrix products, on GPUs or the CPU, without faiss-gpu.

`TorchExactIndex` holds the passage vectors as torch tensors: fp16 on CUDA, its rows split evenly across the
devices it is given (default: every visible GPU), fp32 (or bf16) on a CPU. A search multiplies a chunk of
queries with a block of rows at a time (so the score matrix stays bounded, `block_elements`), keeps each block's
best rows, merges them per device and then across devices. With half-precision vectors the best `topk + 16`
candidates of each device are scored again in fp32 from their stored vectors (fp16 rounds a score of 0.8 to
steps of 0.0005), so near ties are ordered as faiss's fp32 search orders them. A 21M x 768 index (wiki-18 with
e5-base) holds 32 GB in fp16 instead of about 62 GB in a faiss Flat index, and needs no faiss-gpu, whose CUDA
build fights the trainer's.

It answers as a faiss index does (`d`, `ntotal`, `search`, `reconstruct`, `reconstruct_n`), so
`dense.DenseRetriever`, `dense.search_faiss`, `shards.ShardIndex` and `dense.verify_backend` take it unchanged.
`verl-search serve --search-backend torch` loads a Flat index folder's `faiss.index` (or a Search-R1
`e5_Flat.index`) into it; `read_flat_vectors` maps the file's vectors from disk without reading them into
memory through faiss. Not thread safe: the server searches from one worker thread (`server.batcher`).
"""

from __future__ import annotations

import logging
import os
import struct
from typing import Literal

import numpy as np

from verl_search.runtime.extras import install_line

logger = logging.getLogger(__name__)

Metric = Literal["ip", "l2"]
#: faiss Flat files' four-character codes (`faiss/impl/index_write.cpp`, `write_index` for `IndexFlat`)
FLAT_FOURCC: dict[bytes, Metric] = {b"IxFI": "ip", b"IxF2": "l2"}
#: faiss's header after the fourcc: d (int32), ntotal (int64), two int64 placeholders, is_trained (uint8),
#: metric_type (int32); then the vector count in floats (uint64) and the floats
_HEADER = struct.Struct("<iqqqBiQ")
#: most score elements of one (queries x rows) block: 2 GiB of fp16 scores on a GPU, 64 MiB of fp32 on a CPU
GPU_BLOCK_ELEMENTS = 1 << 30
CPU_BLOCK_ELEMENTS = 1 << 24
#: most queries multiplied at once (a larger search runs in chunks of this many)
QUERY_CHUNK = 1024
#: candidates beyond `topk` scored again in fp32 when the vectors are held in half precision
HALF_EXTRA_CANDIDATES = 16
#: rows converted and copied to a device at a time while loading (256K x 768 fp32 = 768 MiB)
LOAD_ROWS = 1 << 18


def require_torch():
    """Import torch or raise an ImportError naming the extra that installs it."""
    try:
        import torch
    except ImportError as exc:
        raise ImportError(f"--search-backend torch needs torch: {install_line('dense')}") from exc
    return torch


def torch_devices(device: str | None = None) -> list[str]:
    """The devices an index is spread over.

    Args:
        device: `None` (default): every visible GPU, else `["cpu"]`; `"cuda"`: every visible GPU; `"cuda:1"`:
            that GPU alone; `"cpu"`: the CPU.

    Raises:
        RuntimeError: `device` names CUDA but torch sees no GPU (a CPU build of torch, or no driver).
    """
    torch = require_torch()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device is None:
        return [f"cuda:{i}" for i in range(gpus)] or ["cpu"]
    if device.startswith("cuda"):
        if gpus == 0:
            raise RuntimeError(f"device {device!r}: torch sees no GPU; serve with --cpu, or install a CUDA build "
                               "of torch")
        return [f"cuda:{i}" for i in range(gpus)] if device == "cuda" else [device]
    return [device]


def default_dtype(devices: list[str]):
    """fp16 when the index lives on GPUs, fp32 on a CPU (half-precision matrix products are slow there)."""
    torch = require_torch()
    return torch.float16 if devices[0].startswith("cuda") else torch.float32


def read_flat_vectors(path: str | os.PathLike) -> tuple[np.ndarray, Metric]:
    """The vectors of a faiss Flat index file (`IndexFlatIP` or `IndexFlatL2`), memory-mapped, not read.

    Returns:
        `(vectors, metric)`: a read-only float32 array of shape `(ntotal, d)` over the file, and `"ip"` or `"l2"`.

    Raises:
        ValueError: the file is not a Flat IP/L2 index file as faiss writes it (another index type, a truncated
            file), naming what it holds and the fix (`--search-backend faiss`, or rebuild with `--faiss-factory Flat`).
    """
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        head = handle.read(4 + _HEADER.size)
    fourcc = head[:4]
    if fourcc not in FLAT_FOURCC or len(head) < 4 + _HEADER.size:
        raise ValueError(f"faiss index {path} is not a Flat inner-product or L2 index (its type code is {fourcc!r}); "
                         "serve it with --search-backend faiss, or rebuild it with --faiss-factory Flat")
    d, ntotal, _, _, _, metric_type, floats = _HEADER.unpack(head[4:])
    offset = 4 + _HEADER.size
    if floats != d * ntotal or size != offset + 4 * floats or metric_type not in (0, 1):
        raise ValueError(f"faiss index {path} has a Flat header ({ntotal} x {d}) that does not match its size of "
                         f"{size} bytes (truncated or corrupt); rebuild it with `verl-search index build`")
    vectors = np.memmap(path, dtype=np.float32, mode="r", offset=offset, shape=(ntotal, d))
    return vectors, FLAT_FOURCC[fourcc]


class TorchExactIndex:
    """Exact top-k search over vectors held as torch tensors, answering as a faiss Flat index does.

    Args:
        vectors: the passages' vectors, shape `(ntotal, d)`, row `i` = corpus row `i` (a numpy array, a
            memory map from `read_flat_vectors`, or a torch tensor); copied to the devices in chunks of
            `LOAD_ROWS` rows, so a memory map is never read whole into memory. A torch tensor already on the
            one device, in `dtype`, is used as it is (no copy).
        metric: `"ip"` (default): inner products, best = largest; `"l2"`: squared L2 distances, best = smallest
            (faiss `IndexFlatIP` / `IndexFlatL2`).
        device: see `torch_devices` (default: every visible GPU, else the CPU); the rows are split evenly across
            the devices.
        dtype: the vectors' torch dtype (default `default_dtype`: fp16 on GPUs, fp32 on a CPU; `torch.bfloat16`
            halves a CPU index's memory).
        block_elements: most score elements computed at once per device (default `GPU_BLOCK_ELEMENTS` on GPUs,
            `CPU_BLOCK_ELEMENTS` on a CPU).
        query_chunk: most queries multiplied at once (default `QUERY_CHUNK`).

    Raises:
        ValueError: `vectors` is not 2-d or holds no rows, an unknown `metric`, or a bound < 1.
        RuntimeError: see `torch_devices`.
    """

    def __init__(self, vectors, metric: Metric = "ip", device: str | None = None, dtype=None,
                 block_elements: int | None = None, query_chunk: int = QUERY_CHUNK):
        torch = require_torch()
        if metric not in ("ip", "l2"):
            raise ValueError(f"metric must be 'ip' or 'l2', got {metric!r}")
        if len(getattr(vectors, "shape", ())) != 2 or vectors.shape[0] < 1:
            raise ValueError(f"vectors must have shape (rows >= 1, d), got {getattr(vectors, 'shape', None)}")
        self.devices = torch_devices(device)
        self.dtype = dtype or default_dtype(self.devices)
        on_gpu = self.devices[0].startswith("cuda")
        self.block_elements = block_elements or (GPU_BLOCK_ELEMENTS if on_gpu else CPU_BLOCK_ELEMENTS)
        if self.block_elements < 1 or query_chunk < 1:
            raise ValueError(f"block_elements and query_chunk must be >= 1, got {self.block_elements}, {query_chunk}")
        self.query_chunk = query_chunk
        self.metric: Metric = metric
        self.ntotal, self.d = int(vectors.shape[0]), int(vectors.shape[1])
        self.half = self.dtype in (torch.float16, torch.bfloat16)
        used = self.devices[:min(len(self.devices), self.ntotal)]
        base, extra = divmod(self.ntotal, len(used))
        firsts = [i * base + min(i, extra) for i in range(len(used) + 1)]
        #: per device: (first row, vectors (rows, d) in `dtype`, squared norms (rows,) in fp32 for "l2", else None)
        self.shards = [self._load_part(vectors, firsts[i], firsts[i + 1] - firsts[i], dev) for i, dev in enumerate(used)]
        logger.info("torch exact index: %d x %d vectors (%s) on %s, %.2f GB", self.ntotal, self.d,
                    str(self.dtype).removeprefix("torch."), ", ".join(used),
                    self.ntotal * self.d * self.shards[0][1].element_size() / 1e9)

    def _load_part(self, vectors, first: int, rows: int, device: str):
        torch = require_torch()
        in_place = isinstance(vectors, torch.Tensor) and vectors.dtype == self.dtype and vectors.device == torch.device(device)
        part = vectors[first:first + rows] if in_place else torch.empty((rows, self.d), dtype=self.dtype, device=device)
        norms = torch.empty(rows, dtype=torch.float32, device=device) if self.metric == "l2" else None
        for start in range(0, rows if norms is not None or not in_place else 0, LOAD_ROWS):
            stop = min(start + LOAD_ROWS, rows)
            chunk = vectors[first + start:first + stop]
            chunk = chunk if isinstance(chunk, torch.Tensor) else torch.from_numpy(np.array(chunk, dtype=np.float32))
            chunk = chunk.to(device=device, dtype=torch.float32)
            if not in_place:
                part[start:stop] = chunk.to(self.dtype)
            if norms is not None:
                norms[start:stop] = (chunk * chunk).sum(dim=1)
        return first, part, norms

    @classmethod
    def from_faiss_file(cls, path: str | os.PathLike, **kwargs) -> "TorchExactIndex":
        """Load a faiss Flat index file (`faiss.index` of an index folder, Search-R1's `e5_Flat.index`) through a
        memory map (`read_flat_vectors`); `kwargs` as the constructor's. Raises ValueError as `read_flat_vectors`."""
        vectors, metric = read_flat_vectors(path)
        return cls(vectors, metric=metric, **kwargs)

    @classmethod
    def from_faiss(cls, index, **kwargs) -> "TorchExactIndex":
        """Copy the vectors of an in-memory faiss `IndexFlatIP` / `IndexFlatL2` (no copy on the host: a view of its
        storage); `kwargs` as the constructor's.

        Raises:
            ValueError: `index` is another index type, or has another metric.
        """
        from verl_search.retrieval.dense import require_faiss

        faiss = require_faiss()
        flat = faiss.downcast_index(index)
        if not isinstance(flat, faiss.IndexFlat) or flat.metric_type not in (faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2):
            raise ValueError(f"faiss index of type {type(flat).__name__} is not a Flat inner-product or L2 index; "
                             "exact torch search loads Flat indexes only (index build --faiss-factory Flat)")
        n, d = int(flat.ntotal), int(flat.d)
        vectors = faiss.rev_swig_ptr(flat.get_xb(), n * d).reshape(n, d)  # a view: `flat` must outlive the copy
        return cls(vectors, metric="ip" if flat.metric_type == faiss.METRIC_INNER_PRODUCT else "l2", **kwargs)

    @classmethod
    def from_corpus(cls, encoder, corpus, chunk_size: int = 4096, **kwargs) -> "TorchExactIndex":
        """Encode every passage of `corpus` with `encoder` (`SentenceEncoder.encode_passages`, in chunks of
        `chunk_size` passages) and index them by inner product; `kwargs` as the constructor's. The vectors are
        gathered in host memory first (`len(corpus) x dim` float32)."""
        vectors = np.empty((len(corpus), encoder.dim), dtype=np.float32)
        for start in range(0, len(corpus), chunk_size):
            stop = min(start + chunk_size, len(corpus))
            vectors[start:stop] = encoder.encode_passages([corpus.get(i).contents for i in range(start, stop)])
        return cls(vectors, metric="ip", **kwargs)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-`k` rows per query, as faiss `Index.search`.

        Args:
            queries: float32 array of shape `(n, d)`.
            k: hits per query (>= 1); past `ntotal` the extra columns hold row `-1` and score `-3.4e38` ("ip") or
                `3.4e38` ("l2"), as faiss fills them.

        Returns:
            `(scores, rows)`, shape `(n, k)`: float32 inner products (best = largest) or squared L2 distances (best
            = smallest), and int64 rows; best first, equal scores by lower row.

        Raises:
            ValueError: `queries` is not of shape `(n, d)`, or `k < 1`.
        """
        torch = require_torch()
        queries = np.asarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.d:
            raise ValueError(f"queries must have shape (n, {self.d}), got {queries.shape}")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        n, kept = queries.shape[0], min(k, self.ntotal)
        scores = np.full((n, k), np.finfo(np.float32).max * (1 if self.metric == "l2" else -1), dtype=np.float32)
        rows = np.full((n, k), -1, dtype=np.int64)
        with torch.inference_mode():
            for start in range(0, n, self.query_chunk):
                chunk = torch.from_numpy(queries[start:start + self.query_chunk])
                best, best_rows = self._search_chunk(chunk, kept)
                scores[start:start + len(chunk), :kept], rows[start:start + len(chunk), :kept] = best, best_rows
        if self.metric == "l2":  # back from "larger is better" to squared distances
            scores[:, :kept] = (queries * queries).sum(axis=1, keepdims=True) - scores[:, :kept]
        order = np.lexsort((rows, -scores if self.metric == "ip" else scores), axis=1)  # ties: lower row first
        return np.take_along_axis(scores, order, axis=1), np.take_along_axis(rows, order, axis=1)

    def _search_chunk(self, queries, k: int):
        """Best `k` of every device merged: numpy `(scores, rows)`, scores "larger is better" (`2 q.x - |x|^2` for L2)."""
        torch = require_torch()
        parts = [self._search_part(queries, k, *shard) for shard in self.shards]
        scores = torch.cat([part[0].to("cpu") for part in parts], dim=1)
        rows = torch.cat([part[1].to("cpu") for part in parts], dim=1)
        best, where = scores.topk(k, dim=1)
        return best.numpy(), torch.gather(rows, 1, where).numpy()

    def _search_part(self, queries, k: int, first: int, part, norms):
        """One device's best `min(k, rows)`: scores float32, corpus rows int64 (both on that device)."""
        torch = require_torch()
        exact = queries.to(part.device)  # fp32: re-scoring and the CPU's fp32 products
        wanted = min(part.shape[0], k + HALF_EXTRA_CANDIDATES if self.half else k)
        q = exact.to(self.dtype)
        block = max(1, self.block_elements // len(q))
        found, found_rows = [], []
        for start in range(0, part.shape[0], block):
            scores = q @ part[start:start + block].T
            if norms is not None:
                scores = 2 * scores - norms[start:start + block].to(scores.dtype)
            best, where = scores.topk(min(wanted, scores.shape[1]), dim=1)
            found.append(best)
            found_rows.append(where + start)
        scores, local = torch.cat(found, dim=1), torch.cat(found_rows, dim=1)
        if len(found) > 1:
            scores, where = scores.topk(wanted, dim=1)
            local = torch.gather(local, 1, where)
        if self.half:  # candidates scored again in fp32 from their stored vectors
            candidates = part[local].float()  # (n, wanted, d)
            scores = torch.einsum("nd,nkd->nk", exact, candidates)
            if norms is not None:
                scores = 2 * scores - norms[local]
        scores, where = scores.float().topk(min(k, wanted), dim=1)
        return scores, torch.gather(local, 1, where) + first

    def reconstruct_n(self, start: int, count: int) -> np.ndarray:
        """Rows `start .. start + count - 1` as stored (rounded to `dtype`), float32 array `(count, d)`.
        Raises ValueError outside `0 .. ntotal - 1`."""
        if start < 0 or count < 0 or start + count > self.ntotal:
            raise ValueError(f"rows {start}..{start + count - 1} are outside 0..{self.ntotal - 1}")
        out = np.empty((count, self.d), dtype=np.float32)
        for first, part, _ in self.shards:
            low, high = max(start, first), min(start + count, first + part.shape[0])
            if low < high:
                out[low - start:high - start] = part[low - first:high - first].float().cpu().numpy()
        return out

    def reconstruct(self, row: int) -> np.ndarray:
        """Row `row` as stored, float32 array `(d,)` (`dense.verify_backend` reads the first rows this way)."""
        return self.reconstruct_n(row, 1)[0]
