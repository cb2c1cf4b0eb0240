"""Sentence encoder for dense retrieval, on sentence-transformers.

Any sentence-transformers folder or plain Hugging Face encoder folder works. A plain HF folder
gets sentence-transformers' default head: mean pooling over the last hidden state, which is what
e5 needs. Prefixes follow the model family: e5 (`intfloat/e5-*`, used by Search-R1 with wiki-18)
expects `"query: "` before queries and `"passage: "` before passages; models without prefixes
(MiniLM, ...) get none. `default_prefixes` picks them from the folder name; pass them explicitly
to override.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

#: the encoder backends' names, the choices of `--encoder-backend` (`index build` and `serve`); `BACKENDS` has one
#: entry per name (a test checks it)
EncoderBackend = Literal["torch", "onnx", "openvino", "openvino-int8"]
#: OpenVINO with int8 weights and activations, quantised on the corpus (`retrieval.quantize`)
INT8_BACKEND = "openvino-int8"
#: encoder backends (sentence-transformers' `backend=`, and `INT8_BACKEND`) and the modules each needs beyond torch
BACKENDS: dict[str, tuple[str, ...]] = {
    "torch": (),
    "onnx": ("onnxruntime", "optimum"),
    "openvino": ("openvino", "optimum.intel"),
    INT8_BACKEND: ("openvino", "optimum.intel", "nncf", "datasets"),
}


def length_groups(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Split texts of `lengths` tokens into sub-batches of at most `batch_size` texts of similar length.

    Each sub-batch is padded to its longest text, so grouping by token count wastes fewer padded
    positions than sentence-transformers' own order (by characters): about 8% of the tokens of a
    sub-batch of 16 real questions instead of 27% (`mini_wiki/qa.jsonl`, MiniLM's tokenizer),
    which makes encoding about 14% faster on a CPU.

    Returns:
        arrays of row indices into `lengths`, shortest texts first; together a permutation of
        `range(len(lengths))`.

    >>> [group.tolist() for group in length_groups([5, 9, 3, 9, 4], 2)]
    [[2, 4], [0, 1], [3]]
    """
    order = np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


E5_QUERY_PREFIX = "query: "
E5_PASSAGE_PREFIX = "passage: "


def default_prefixes(encoder_path: str | os.PathLike) -> tuple[str, str]:
    """`("query: ", "passage: ")` for an e5 folder (name contains `e5`), else `("", "")`.

    >>> default_prefixes("/models/e5-base-v2")
    ('query: ', 'passage: ')
    >>> default_prefixes("/models/all-MiniLM-L6-v2")
    ('', '')
    """
    name = Path(encoder_path).name.lower()
    if "e5" in name.replace("_", "-").split("-"):
        return E5_QUERY_PREFIX, E5_PASSAGE_PREFIX
    return "", ""


@dataclass(frozen=True)
class EncoderSettings:
    """How to run an encoder, in one place (the index manifest records the same fields).

    Attributes:
        path: the local model folder.
        query_prefix, passage_prefix: `None` = `default_prefixes(path)`.
        normalize: L2-normalise vectors (default True).
        max_length: input limit in tokens (`None`: the model's own).
        backend: `"torch"` (default), `"onnx"`, `"openvino"` or `"openvino-int8"` (CPU runtimes;
            see `BACKENDS`).
    """

    path: str
    query_prefix: str | None = None
    passage_prefix: str | None = None
    normalize: bool = True
    max_length: int | None = None
    backend: str = "torch"


def default_device() -> str:
    """`"cuda"` when torch sees a GPU, else `"cpu"`."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _require_backend(backend: str) -> None:
    """Raise ValueError for an unknown backend, ImportError naming the extra for a missing runtime."""
    if backend not in BACKENDS:
        raise ValueError(f"encoder backend must be one of {sorted(BACKENDS)}, got {backend!r}")
    import importlib.util

    def missing(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except ModuleNotFoundError:  # the parent package (optimum) is missing
            return True

    absent = [name for name in BACKENDS[backend] if missing(name)]
    if absent:
        raise ImportError(f"encoder backend {backend!r} needs {', '.join(absent)}: pip install \"verl-search[{backend}]\"")


def set_encoder_threads(threads: int) -> None:
    """Run torch's CPU operators (the encoder's forward pass) on `threads` threads, process-wide.

    `threads` >= 1 (torch's default is one per core). On a small machine the server's event loop
    shares the cores with the encoder; see `benchmarks/bench_retrieval_server.py --serve-arg`.

    Raises:
        ValueError: `threads` < 1.
    """
    if threads < 1:
        raise ValueError(f"encoder threads must be >= 1, got {threads}")
    import torch

    torch.set_num_threads(threads)


class SentenceEncoder:
    """Encode queries and passages into float32 vectors, shape `(n, dim)`.

    Args:
        path: a local model folder (nothing is fetched from a hub).
        query_prefix, passage_prefix: strings put before each query / passage; `None` picks
            `default_prefixes(path)`.
        normalize: L2-normalise vectors (cosine similarity as inner product). Default True.
        max_length: truncate inputs to this many tokens (default: the model's own limit).
        device: `"cpu"`, `"cuda"`, ...; default `default_device()`.
        batch_size: passages per forward pass (index building).
        backend: `"torch"` (default), `"onnx"` (onnxruntime) or `"openvino"`, sentence-transformers'
            `backend=`; the model is exported to that runtime on load (seconds to a minute), on
            the CPU. Embeddings differ from torch's by rounding only (cosine > 0.9999 for MiniLM);
            `verify_backend` checks that against an index. `"openvino-int8"`: OpenVINO with int8
            weights and activations, quantised once on `calibration` passages and cached
            (`retrieval.quantize`); cosine about 0.996 against torch's for MiniLM.
        threads: CPU threads of the forward pass (default: the runtime's own, one per core):
            torch's intra-op threads (process-wide, `set_encoder_threads`) or OpenVINO's
            `INFERENCE_NUM_THREADS`; ignored by ONNX Runtime. Raises ValueError if < 1.
        query_batch_size: queries per forward pass (default 16). Queries are sorted by length in
            tokens and encoded in sub-batches of this size (`length_groups`): on a CPU, one
            256-query pass is about 3x slower per query than 16-query passes (padding and cache
            misses), see `benchmarks/bench_retrieval_server.py`.
        calibration: passage texts that calibrate the `"openvino-int8"` quantiser (required there,
            ignored by the other backends), e.g. `quantize.calibration_passages(corpus)`; the
            passage prefix is put before them.

    Raises:
        FileNotFoundError: if `path` is not a folder.
        ImportError: if sentence-transformers (or the backend's runtime) is missing, with the
            install command.
        ValueError: an unknown `backend`, or `"openvino-int8"` without `calibration`.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
        normalize: bool = True,
        max_length: int | None = None,
        device: str | None = None,
        batch_size: int = 64,
        query_batch_size: int = 16,
        backend: str = "torch",
        threads: int | None = None,
        calibration: Sequence[str] | None = None,
    ):
        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"encoder folder {folder} does not exist; pass a local model folder with --encoder")
        _require_backend(backend)
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ImportError('dense retrieval needs sentence-transformers: pip install "verl-search[dense]"') from exc
        default_query, default_passage = default_prefixes(folder)
        self.path = str(folder)
        self.query_prefix = default_query if query_prefix is None else query_prefix
        self.passage_prefix = default_passage if passage_prefix is None else passage_prefix
        self.normalize = normalize
        self.batch_size = batch_size
        self.query_batch_size = query_batch_size
        self.backend = backend
        if threads is not None and (backend == "torch" or threads < 1):
            set_encoder_threads(threads)
        if backend == "torch":
            self._model = SentenceTransformer(self.path, device=device or default_device(), local_files_only=True)
        else:
            load_from, runtime, model_kwargs = self.path, backend, {}
            if backend == INT8_BACKEND:
                from verl_search.retrieval.quantize import INT8_FILE, int8_openvino_model

                if not calibration:
                    raise ValueError(f"encoder backend {INT8_BACKEND!r} needs calibration passages (IndexSpec.load "
                                     "and the index builder pass the corpus's)")
                load_from, runtime = str(int8_openvino_model(folder, [self.passage_prefix + t for t in calibration])), "openvino"
                model_kwargs["file_name"] = INT8_FILE
            if threads and runtime == "openvino":
                model_kwargs["ov_config"] = {"INFERENCE_NUM_THREADS": str(threads)}
            self._model = SentenceTransformer(load_from, device="cpu", local_files_only=True, backend=runtime,
                                              model_kwargs=model_kwargs or None)
        if max_length is not None:
            self._model.max_seq_length = max_length
        self.max_length = self._model.max_seq_length
        self.dim = int(self._model.get_embedding_dimension())

    @classmethod
    def from_settings(cls, settings: EncoderSettings, **kwargs) -> "SentenceEncoder":
        """An encoder for `settings`; `kwargs` are the other constructor arguments (device, batch sizes)."""
        return cls(settings.path, query_prefix=settings.query_prefix, passage_prefix=settings.passage_prefix,
                   normalize=settings.normalize, max_length=settings.max_length, backend=settings.backend, **kwargs)

    def settings(self) -> EncoderSettings:
        """The resolved settings of this encoder (prefixes and `max_length` filled in)."""
        return EncoderSettings(self.path, self.query_prefix, self.passage_prefix, self.normalize, self.max_length,
                               self.backend)

    def _encode(self, texts: list[str], prefix: str, batch_size: int, show_progress: bool = False) -> np.ndarray:
        """Vectors of `prefix + text`, shape `(len(texts), dim)`, float32, in sub-batches of `batch_size`
        texts of similar length in *tokens* (`length_groups`)."""
        if len(texts) <= batch_size:
            groups = [np.arange(len(texts))] if texts else []
        else:
            prompted = [prefix + text for text in texts] if prefix else texts
            token_ids = self._model.tokenizer(prompted, truncation=True, max_length=self.max_length,
                                              return_attention_mask=False, return_token_type_ids=False)["input_ids"]
            groups = length_groups([len(ids) for ids in token_ids], batch_size)
        vectors = np.empty((len(texts), self.dim), dtype=np.float32)
        for rows in tqdm(groups, unit="batch", desc="encoding", disable=not show_progress):
            vectors[rows] = self._model.encode(
                [texts[i] for i in rows],
                prompt=prefix or None,
                batch_size=batch_size,
                normalize_embeddings=self.normalize,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return vectors

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """Vectors for `queries` (with `query_prefix`), shape `(len(queries), dim)`, float32."""
        return self._encode(queries, self.query_prefix, self.query_batch_size)

    def encode_passages(self, passages: list[str], show_progress: bool = False) -> np.ndarray:
        """Vectors for passage `contents` (with `passage_prefix`), shape `(len(passages), dim)`."""
        return self._encode(passages, self.passage_prefix, self.batch_size, show_progress)
