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
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from tqdm.auto import tqdm

from verl_search.retrieval.encoder_threads import FreeCores, length_groups, set_encoder_threads, single_threaded_workers
from verl_search.runtime.extras import install_line

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


#: the query encoder's numeric precisions (torch dtype names)
PRECISIONS = ("float32", "float16", "bfloat16")
#: queries per forward pass on a CPU: sub-batches of similar length (see `SentenceEncoder`, `query_batch_size`)
CPU_QUERY_BATCH_SIZE = 16
#: queries per forward pass on a GPU: at least a whole micro-batch of the server (`max_batch_size`, default 256) in
#: one forward; one forward of 256 queries costs about what one of 16 does there
GPU_QUERY_BATCH_SIZE = 512


@dataclass(frozen=True)
class DeviceRuntime:
    """How the torch encoder runs on a device: `precision` (a `PRECISIONS` name) and `query_batch_size`
    (most queries per forward pass)."""

    precision: str
    query_batch_size: int


def device_runtime(device: str) -> DeviceRuntime:
    """The torch encoder's defaults for `device`: fp16 and whole micro-batches (`GPU_QUERY_BATCH_SIZE`) on CUDA,
    fp32 and `CPU_QUERY_BATCH_SIZE`-query sub-batches elsewhere.

    >>> device_runtime("cuda:0")
    DeviceRuntime(precision='float16', query_batch_size=512)
    >>> device_runtime("cpu")
    DeviceRuntime(precision='float32', query_batch_size=16)
    """
    if device.startswith("cuda"):
        return DeviceRuntime("float16", GPU_QUERY_BATCH_SIZE)
    return DeviceRuntime("float32", CPU_QUERY_BATCH_SIZE)


def _missing_modules(backend: str) -> list[str]:
    """The modules `backend` needs (`BACKENDS`) that are not installed here."""
    import importlib.util

    def missing(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except ModuleNotFoundError:  # the parent package (optimum) is missing
            return True

    return [name for name in BACKENDS[backend] if missing(name)]


def query_backend(built_with: str, faiss_factory: str | None) -> str:
    """The query encoder's runtime when `serve` names none: `openvino` where the index was built with `torch`,
    its faiss index stores its vectors (`faiss_factory` `Flat` or `HNSW...`, not IVF/PQ/SQ: the check below
    reads them), the `[openvino]` extra is installed and torch sees no GPU; else `built_with` (the manifest's).

    OpenVINO answered one client with 2.7 times the queries/s of torch on MiniLM on 2 CPU cores, with the same
    gold-title hit@5 on 500 questions (docs/benchmarks/one-client-peer.md); its passage vectors are checked
    against the index's stored vectors when the index loads (`dense.verify_backend`: cosine >= 0.99).
    `--encoder-backend torch` keeps the index's runtime.
    """
    factory = (faiss_factory or "").upper()
    stores_vectors = bool(factory) and not any(kind in factory for kind in ("IVF", "PQ", "SQ", "LSH"))
    if built_with != "torch" or not stores_vectors or _missing_modules("openvino") or default_device() != "cpu":
        return built_with
    logger.info("query encoder: openvino (the [openvino] extra is installed; --encoder-backend torch keeps the "
                "index's torch)")
    return "openvino"


def _require_backend(backend: str) -> None:
    """Raise ValueError for an unknown backend, ImportError naming the extra for a missing runtime."""
    if backend not in BACKENDS:
        raise ValueError(f"encoder backend must be one of {sorted(BACKENDS)}, got {backend!r}")
    absent = _missing_modules(backend)
    if absent:
        extra = "openvino" if backend == INT8_BACKEND else backend  # the [openvino] extra carries int8's nncf too
        raise ImportError(f"encoder backend {backend!r} needs {', '.join(absent)}: {install_line(extra)}")


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
        threads: CPU threads of the forward pass (default: the runtime's own, one per core).
            torch on the CPU: a batch of several sub-batches is encoded by `threads`
            single-threaded workers side by side (`single_threaded_workers`), a lone sub-batch
            by torch's intra-op threads (process-wide, `set_encoder_threads`); by default a lone
            sub-batch takes as many as other processes leave cores free (`FreeCores`, Linux). OpenVINO: its
            `INFERENCE_NUM_THREADS`. Ignored by ONNX Runtime. Raises ValueError if < 1.
        query_batch_size: most queries per forward pass (default `device_runtime(device)`: 16 on a CPU,
            512 on CUDA, so that a server micro-batch is one forward there). Queries are sorted by
            length in tokens and encoded in sub-batches of this size (`length_groups`), or
            smaller so that every worker gets one: on a CPU, one 256-query pass is about 3x
            slower per query than 16-query passes (padding and cache misses), see
            `benchmarks/bench_retrieval_server.py`.
        precision: torch backend: `"float32"`, `"float16"` or `"bfloat16"` weights and activations (default
            `device_runtime(device)`: fp16 on CUDA, fp32 elsewhere); the other backends run in float32 only.
            The loader checks a half-precision encoder against the index (`dense.verify_encoder`).
        cuda_graphs: torch on CUDA: replay the queries' forward pass as CUDA graphs, one per padded shape, each
            checked against the eager pass when captured (`retrieval.cuda_graphs`; default True). Ignored elsewhere.
        calibration: passage texts that calibrate the `"openvino-int8"` quantiser (required there,
            ignored by the other backends), e.g. `quantize.calibration_passages(corpus)`; the
            passage prefix is put before them.

    Raises:
        FileNotFoundError: if `path` is not a folder.
        ImportError: if sentence-transformers (or the backend's runtime) is missing, with the
            install command.
        ValueError: an unknown `backend` or `precision`, a half `precision` with another backend than torch,
            or `"openvino-int8"` without `calibration`.
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
        query_batch_size: int | None = None,
        backend: str = "torch",
        threads: int | None = None,
        calibration: Sequence[str] | None = None,
        precision: str | None = None,
        cuda_graphs: bool = True,
    ):
        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"encoder folder {folder} does not exist; pass a local model folder with --encoder")
        _require_backend(backend)
        if precision is not None and (precision not in PRECISIONS or (backend != "torch" and precision != "float32")):
            raise ValueError(f"encoder precision must be one of {PRECISIONS} (torch) or float32 (other backends), "
                             f"got {precision!r} with backend {backend!r}")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ImportError(f"dense retrieval needs sentence-transformers: {install_line('dense')}") from exc
        default_query, default_passage = default_prefixes(folder)
        self.path = str(folder)
        self.query_prefix = default_query if query_prefix is None else query_prefix
        self.passage_prefix = default_passage if passage_prefix is None else passage_prefix
        self.normalize = normalize
        self.batch_size = batch_size
        self.backend = backend
        runtime = device_runtime((device or default_device()) if backend == "torch" else "cpu")
        self.query_batch_size = query_batch_size or runtime.query_batch_size
        self.precision = "float32"
        if threads is not None and (backend == "torch" or threads < 1):
            set_encoder_threads(threads)
        self._workers: ThreadPoolExecutor | None = None  # torch on the CPU with more than one thread
        self._worker_count = 0
        self._free_cores: FreeCores | None = None  # torch on the CPU, `threads` not given
        self._graphs = None  # torch on CUDA: the query forward as CUDA graphs (`cuda_graphs.GraphedForward`)
        if backend == "torch":
            device = device or default_device()
            self._model = SentenceTransformer(self.path, device=device, local_files_only=True)
            import torch

            count = threads or torch.get_num_threads()
            if device == "cpu" and count > 1:
                self._workers, self._worker_count = single_threaded_workers(count), count
                if threads is None:  # a lone sub-batch takes the cores other processes leave free
                    self._free_cores = FreeCores(count)
            self.set_precision(precision or runtime.precision)
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
        self._rust = None  # torch: the Rust tokenizer called directly where it gives preprocess's exact features
        if backend == "torch":
            from verl_search.retrieval.query_features import RustFeatures

            self._rust = RustFeatures.for_model(self._model, self.max_length,
                                                list(dict.fromkeys([self.query_prefix, self.passage_prefix])))
            if self._model.device.type == "cuda" and cuda_graphs:
                from verl_search.retrieval.cuda_graphs import GraphedForward

                pad_id = self._model.tokenizer.pad_token_id or 0
                self._graphs = GraphedForward(self._device_forward, self._model.device, pad_id, self.max_length)

    def set_precision(self, precision: str) -> None:
        """Run the torch model in `precision` (a `PRECISIONS` name) from now on (`dense.verify_encoder` puts a
        half-precision encoder that fails its check back to `"float32"`).

        Raises:
            ValueError: an unknown name, or a half precision on another backend than torch.
        """
        if precision not in PRECISIONS or (self.backend != "torch" and precision != "float32"):
            raise ValueError(f"encoder precision must be one of {PRECISIONS} (torch) or float32, got {precision!r}")
        if precision != self.precision:
            import torch

            if self._graphs is not None:  # the graphs read the old weights
                self._graphs.clear()
            self._model.to(getattr(torch, precision))
            logger.info("query encoder on %s in %s", self._model.device, precision)
        self.precision = precision

    @classmethod
    def from_settings(cls, settings: EncoderSettings, **kwargs) -> "SentenceEncoder":
        """An encoder for `settings`; `kwargs` are the other constructor arguments (device, batch sizes)."""
        return cls(settings.path, query_prefix=settings.query_prefix, passage_prefix=settings.passage_prefix,
                   normalize=settings.normalize, max_length=settings.max_length, backend=settings.backend, **kwargs)

    def settings(self) -> EncoderSettings:
        """The resolved settings of this encoder (prefixes and `max_length` filled in)."""
        return EncoderSettings(self.path, self.query_prefix, self.passage_prefix, self.normalize, self.max_length,
                               self.backend)

    def _encode(self, texts: list[str], prefix: str, batch_size: int, show_progress: bool = False,
                graphs=None) -> np.ndarray:
        """Vectors of `prefix + text`, shape `(len(texts), dim)`, float32, in sub-batches of at most `batch_size`
        texts of similar length in *tokens* (`length_groups`), spread over the workers if there are any; `graphs`:
        see `_forward`."""
        if self._workers is not None:  # one sub-batch per worker at least
            batch_size = max(1, min(batch_size, -(-len(texts) // self._worker_count)))
        if len(texts) <= batch_size:
            groups = [np.arange(len(texts))] if texts else []
        else:
            prompted = [prefix + text for text in texts] if prefix else texts
            token_ids = self._model.tokenizer(prompted, truncation=True, max_length=self.max_length,
                                              return_attention_mask=False, return_token_type_ids=False)["input_ids"]
            groups = length_groups([len(ids) for ids in token_ids], batch_size)
        vectors = np.empty((len(texts), self.dim), dtype=np.float32)
        progress = tqdm(total=len(groups), unit="batch", desc="encoding", disable=not show_progress)
        if self._workers is None or len(groups) < 2:
            if self._free_cores is not None and groups:
                self._set_lone_threads(self._free_cores.threads())
            for rows in groups:
                chunk = [texts[i] for i in rows]
                if self.backend == "torch":
                    vectors[rows] = self._forward(self._features(chunk, prefix), graphs)
                else:
                    vectors[rows] = self._model.encode(chunk, prompt=prefix or None, batch_size=batch_size,
                                                       normalize_embeddings=self.normalize, convert_to_numpy=True,
                                                       show_progress_bar=False)
                progress.update()
        else:
            # this thread tokenizes (the tokenizer is not thread safe) while the workers run the forward passes,
            # longest sub-batches first so that they finish together; at most two sub-batches per worker queued
            in_flight: deque = deque()
            for rows in reversed(groups):
                features = self._features([texts[i] for i in rows], prefix)
                in_flight.append((rows, self._workers.submit(self._forward, features)))
                while len(in_flight) > 2 * self._worker_count or (in_flight and in_flight[0][1].done()):
                    done, future = in_flight.popleft()
                    vectors[done] = future.result()
                    progress.update()
            for done, future in in_flight:
                vectors[done] = future.result()
                progress.update()
        progress.close()
        return vectors

    def _set_lone_threads(self, threads: int) -> None:
        """torch's intra-op threads for this thread's next lone sub-batch (`FreeCores`), set only when they change."""
        import torch

        if threads != torch.get_num_threads():
            set_encoder_threads(threads)

    def _features(self, texts: list[str], prefix: str) -> dict:
        """`SentenceTransformer.preprocess(texts, prompt=prefix)`'s features, from the Rust tokenizer where it gives
        the same (`query_features.RustFeatures`: about 7x faster on a GPU node's batches) at the model's current
        `max_seq_length`."""
        if self._rust is not None and self._rust.max_length == self._model.max_seq_length:
            return self._rust(texts, prefix)
        return self._model.preprocess(texts, prompt=prefix or None)

    def _forward(self, features: dict, graphs=None) -> np.ndarray:
        """One forward pass over tokenized `features` (`_features`), as sentence-transformers' `encode` runs it (its
        tensors moved to the model's device), replayed from `graphs` (a `cuda_graphs.GraphedForward`) where given and
        it takes the shape: shape `(batch, dim)`, float32, L2-normalised if `normalize`."""
        import torch

        with torch.inference_mode():
            vectors = graphs(features) if graphs is not None else None
            if vectors is None:
                device = self._model.device
                vectors = self._device_forward({name: value.to(device) if isinstance(value, torch.Tensor) else value
                                                for name, value in features.items()})
            return vectors.float().cpu().numpy()

    def _device_forward(self, features: dict):
        """The model and the normalisation over features already on its device: a `(batch, dim)` tensor there."""
        import torch

        vectors = self._model(features)["sentence_embedding"]
        return torch.nn.functional.normalize(vectors, p=2, dim=1) if self.normalize else vectors

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """Vectors for `queries` (with `query_prefix`), shape `(len(queries), dim)`, float32."""
        return self._encode(queries, self.query_prefix, self.query_batch_size, graphs=self._graphs)

    def warm_up(self) -> int:
        """Capture the queries' CUDA graphs of the usual shapes now (`cuda_graphs.GraphedForward.warm_up`), so that no
        request waits for a capture; returns the number held (0 without graphs: off, or not on CUDA)."""
        if self._graphs is None:
            return 0
        return self._graphs.warm_up(lambda texts: self._features(texts, self.query_prefix), self.query_batch_size)

    def encode_passages(self, passages: list[str], show_progress: bool = False) -> np.ndarray:
        """Vectors for passage `contents` (with `passage_prefix`), shape `(len(passages), dim)`."""
        return self._encode(passages, self.passage_prefix, self.batch_size, show_progress)
