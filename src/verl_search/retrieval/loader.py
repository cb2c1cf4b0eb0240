"""Open an index for serving: our index folders, or Search-R1's published layout as it is.

Two layouts are accepted:

* an index folder written by `verl-search index build` (`manifest.json` inside); the corpus and
  encoder default to the ones recorded in the manifest and are checked against it;
* Search-R1's published files, unchanged: a faiss file (`e5_Flat.index`) plus the JSONL corpus
  (`wiki-18.jsonl`) and an encoder folder (`intfloat/e5-base-v2`), given explicitly. Its corpus
  offset table is computed once and cached under `$VERL_SEARCH_CACHE`
  (default `~/.cache/verl_search`).

`resolve_index` does every cheap check (files exist, corpus size, encoder fingerprint) so a
mistake fails before a server binds its port; `IndexSpec.load` then does the slow part.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verl_search.datasets import resolve_corpus
from verl_search.runtime.env import read_env
from verl_search.retrieval.base import Retriever
from verl_search.retrieval.corpus import JsonlCorpus, corpus_bytes, file_sha256, scan_corpus
from verl_search.retrieval.encoder import EncoderSettings, query_backend
from verl_search.retrieval.hybrid import HybridOptions
from verl_search.retrieval.rerank import RerankOptions
from verl_search.retrieval.manifest import (
    BM25_DIR,
    FAISS_NAME,
    MANIFEST_NAME,
    OFFSETS_NAME,
    IndexMismatchError,
    Manifest,
    ShardInfo,
    check_encoder_matches,
    encoder_fingerprint,
)

logger = logging.getLogger(__name__)


@dataclass
class IndexSpec:
    """Everything needed to load a retriever, already checked.

    Attributes:
        kind: `"bm25"`, `"dense"` or `"hybrid"`: what `load` builds (`select` serves one half of a
            hybrid index).
        index_path: the index folder, or the faiss file for the Search-R1 layout.
        corpus_path: the JSONL corpus.
        offsets_path: its offset table (`.npy`), or `None` to compute it.
        encoder: dense only: the encoder's settings.
        manifest: the index's manifest (`None` for the Search-R1 layout).
        use_gpu: `None` = GPUs when faiss sees some (see `load_faiss_index`).
        encoder_threads: CPU threads of the query encoder (`SentenceEncoder(threads=...)`;
            default the runtime's own).
        cuda_graphs: the query encoder's CUDA graphs on CUDA (`SentenceEncoder(cuda_graphs=...)`; default True).
        hybrid: how a hybrid index fuses (default `HybridOptions()`).
        rerank: the rerank stage (`None`, or no `rerank.reranker`: none).
        search_backend: dense: `"faiss"` (default: `load_faiss_index`, on faiss's GPUs when it sees some) or
            `"torch"` (a Flat index searched exactly by torch, `torch_exact.TorchExactIndex`: fp16 on every visible
            GPU, fp32 on the CPU where `use_gpu` is False or torch sees no GPU).
    """

    kind: str
    index_path: Path
    corpus_path: Path
    offsets_path: Path | None = None
    encoder: EncoderSettings | None = None
    manifest: Manifest | None = None
    use_gpu: bool | None = None
    encoder_threads: int | None = None
    cuda_graphs: bool = True
    hybrid: HybridOptions | None = None
    rerank: RerankOptions | None = None
    search_backend: str = "faiss"

    def select(self, retriever: str | None) -> None:
        """Serve `retriever` (`"bm25"`, `"dense"` or `"hybrid"`) of this index; `None` keeps the manifest's.
        A hybrid index serves either half alone.

        Raises:
            IndexMismatchError: the index does not hold that retriever, naming what it holds.
        """
        if retriever is None or retriever == self.kind:
            return
        if self.kind != "hybrid" or retriever not in ("bm25", "dense"):
            holding = "a hybrid index" if retriever == "hybrid" else f"a {retriever} or hybrid index"
            raise IndexMismatchError(f"--retriever {retriever}: index {self.index_path} is a {self.kind} index; "
                                     f"build {holding} with `verl-search index build --retriever`")
        self.kind = retriever

    def fingerprint(self) -> str:
        """A SHA-256 hex digest naming what this index answers with (the query cache's key part).

        For an index folder: the manifest as written (corpus SHA-256, retriever, encoder
        fingerprint and settings, faiss factory, BM25 parameters). For Search-R1's layout (no
        manifest): the faiss file's path, size and mtime, the corpus's, and the encoder's
        settings and config fingerprint.
        """
        if self.manifest is not None:
            raw = (self.index_path / MANIFEST_NAME).read_bytes() + repr(self.encoder).encode()
        else:
            parts = [self.index_path, self.corpus_path]
            raw = "|".join(f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in parts).encode()
            raw += repr(self.encoder).encode() + encoder_fingerprint(self.encoder.path).encode()
        raw += f"|{self.kind}|{self.hybrid!r}|{self.rerank!r}".encode()  # the half served, fusion, rerank stage
        if self.rerank is not None and self.rerank.reranker:
            raw += encoder_fingerprint(self.rerank.reranker).encode()
        return hashlib.sha256(raw).hexdigest()

    @property
    def shards(self) -> list[ShardInfo]:
        """The index's shards (`[]` unless built with `index build --shards N`)."""
        return list(self.manifest.shards or []) if self.manifest else []

    def load_corpus(self) -> JsonlCorpus:
        """The corpus with its offset table (memory-mapped)."""
        offsets = np.load(self.offsets_path, mmap_mode="r") if self.offsets_path else _cached_offsets(self.corpus_path)
        return JsonlCorpus(self.corpus_path, offsets)

    def load_encoder(self, corpus: JsonlCorpus | None = None):
        """The dense query encoder (`SentenceEncoder`; slow: loads the model). The `openvino-int8`
        backend is calibrated on passages of `corpus` (default: `load_corpus()`)."""
        from verl_search.retrieval.encoder import INT8_BACKEND, SentenceEncoder

        calibration = None
        if self.encoder.backend == INT8_BACKEND:
            from verl_search.retrieval.quantize import calibration_passages

            calibration = calibration_passages(corpus if corpus is not None else self.load_corpus())
        return SentenceEncoder.from_settings(self.encoder, threads=self.encoder_threads, calibration=calibration,
                                             cuda_graphs=self.cuda_graphs)

    def load_shard(self, shard: int):
        """Shard `shard` of a sharded dense index, as a `retrieval.shards.ShardIndex` (faiss on the GPUs
        when there are some, see `load_faiss_index`).

        Raises:
            IndexError: the index has no such shard.
        """
        from verl_search.retrieval.shards import ShardIndex

        info = self.shards[shard]
        return ShardIndex(self.open_vectors(self.index_path / info.file), info)

    def open_vectors(self, path: Path, before_move=None):
        """The dense index file `path` as `search_backend` searches it: a faiss index (`load_faiss_index`; `before_move`
        sees it on the CPU first), or a `torch_exact.TorchExactIndex` (`before_move` sees it loaded).

        Raises:
            ValueError: `search_backend` is neither `faiss` nor `torch`, or `torch` and the file is no Flat index.
        """
        if self.search_backend == "faiss":
            from verl_search.retrieval.dense import load_faiss_index

            return load_faiss_index(path, use_gpu=self.use_gpu, before_move=before_move)
        if self.search_backend != "torch":
            raise ValueError(f"search backend must be 'faiss' or 'torch', got {self.search_backend!r}")
        from verl_search.retrieval.torch_exact import TorchExactIndex

        device = "cpu" if self.use_gpu is False else "cuda" if self.use_gpu else None
        index = TorchExactIndex.from_faiss_file(path, device=device)
        if before_move is not None:
            before_move(index)
        return index

    def load(self, search_shards=None) -> Retriever:
        """Load the retriever (slow: reads the index, loads the encoder); a sharded index loads
        every shard into this process (`ShardedDenseRetriever`); a hybrid index both halves
        (`HybridRetriever`); with `rerank.reranker` set, the cross-encoder around it (`RerankingRetriever`).

        Args:
            search_shards: a sharded index: the fan-out over shards served elsewhere
                (`retrieval.shards.SearchShards`, e.g. Ray Serve's shard deployments,
                `server.ray_serve.remote_shards`) instead of loading them here; None: load them here.

        Raises:
            ValueError: if the index, encoder and corpus disagree (dimension, number of rows), or
                (IndexMismatchError) the encoder backend is not the one that built the index and
                its passage embeddings differ from the index's (`dense.verify_encoder`; a half-precision
                encoder that fails its check is put back to fp32 instead).
            FileNotFoundError: the reranker folder is not a model folder.
        """
        corpus = self.load_corpus()
        if self.kind == "bm25":
            retriever = self._load_bm25(corpus)
        elif self.kind == "hybrid":
            from verl_search.retrieval.hybrid import HybridRetriever

            retriever = HybridRetriever(self._load_bm25(corpus), self._load_dense(corpus, search_shards), self.hybrid)
        else:
            retriever = self._load_dense(corpus, search_shards)
        if self.rerank is not None and self.rerank.reranker:
            from verl_search.retrieval.rerank import CrossEncoderReranker, RerankingRetriever

            reranker = CrossEncoderReranker(self.rerank.reranker, batch_size=self.rerank.rerank_batch_size,
                                            max_length=self.rerank.rerank_max_length)
            retriever = RerankingRetriever(retriever, reranker, self.rerank.rerank_candidates)
        return retriever

    def _load_bm25(self, corpus: JsonlCorpus):
        from verl_search.retrieval.bm25 import BM25Retriever

        params = self.manifest.bm25 if self.manifest else None
        return BM25Retriever(self.index_path / BM25_DIR, corpus, params)

    def _load_dense(self, corpus: JsonlCorpus, search_shards=None):
        from verl_search.retrieval.dense import DenseRetriever, verify_encoder

        encoder = self.load_encoder(corpus)
        built_with = self.manifest.encoder.backend if self.manifest else "torch"
        if self.shards:
            from verl_search.retrieval.shards import ShardedDenseRetriever

            local = None
            if search_shards is None:
                local = [self.load_shard(i) for i in range(len(self.shards))]
                search_shards = ShardedDenseRetriever.in_process(local)
            if encoder.backend != built_with or encoder.precision != "float32":  # shard 0 holds the first rows
                verify_encoder((local[0] if local else self.load_shard(0)).index, encoder, corpus, built_with)
            encoder.warm_up()
            return ShardedDenseRetriever(encoder, corpus, search_shards, self.shards)
        faiss_file = self.index_path / FAISS_NAME if self.index_path.is_dir() else self.index_path
        index = self.open_vectors(faiss_file, before_move=lambda loaded: verify_encoder(loaded, encoder, corpus, built_with))
        encoder.warm_up()  # CUDA graphs for the usual query shapes, after the check that may change the precision
        return DenseRetriever(index, encoder, corpus)


def resolve_index(
    index: str | os.PathLike,
    corpus: str | os.PathLike | None = None,
    encoder: str | os.PathLike | None = None,
    verify_corpus: bool = False,
    use_gpu: bool | None = None,
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
    encoder_backend: str | None = None,
    search_backend: str = "faiss",
) -> IndexSpec:
    """Check an index and what it will be served with; return an `IndexSpec` to load it.

    Args:
        index: an index folder (with `manifest.json`) or a faiss file (Search-R1 layout).
        corpus: the JSONL corpus (or a shipped one by name: `mini-wiki`); default: the manifest's.
            Required for a faiss file.
        encoder: the encoder folder; default: the manifest's. Required for a faiss file.
        verify_corpus: also compare the corpus SHA-256 with the manifest (reads the whole file).
        use_gpu: see `load_faiss_index`.
        query_prefix, passage_prefix: override the encoder prefixes (Search-R1 layout only;
            default: e5 prefixes for an e5 folder).
        encoder_backend: run the query encoder on this backend (`torch`, `onnx`, `openvino`, `openvino-int8`);
            default: `encoder.query_backend` of the manifest's (OpenVINO on a CPU machine with the `[openvino]`
            extra for a Flat or HNSW index built with torch, else the manifest's; `torch` for the Search-R1 layout).
            Another backend than the index's is checked against its stored vectors when it loads
            (`verify_backend`).
        search_backend: `faiss` (default) or `torch` (see `IndexSpec`); `torch` needs a Flat index.

    Raises:
        FileNotFoundError: a path does not exist, or the folder is not a finished index.
        IndexMismatchError: the corpus or encoder is not the one the index was built with, or `search_backend`
            is `torch` and the manifest records another faiss factory than `Flat`.
        ValueError: an unknown `search_backend`, or `torch` and a faiss file that is no Flat index.
    """
    if search_backend not in ("faiss", "torch"):
        raise ValueError(f"--search-backend must be faiss or torch, got {search_backend!r}")
    index_path = Path(index).resolve()
    if not index_path.exists():
        raise FileNotFoundError(f"index {index_path} does not exist; build one with `verl-search index build`")
    if index_path.is_file():
        spec = _resolve_faiss_file(index_path, corpus, encoder, use_gpu, query_prefix, passage_prefix,
                                   encoder_backend or "torch")
        spec.search_backend = search_backend
        if search_backend == "torch":
            from verl_search.retrieval.torch_exact import read_flat_vectors

            read_flat_vectors(index_path)  # its header only: ValueError now for a file that is no Flat index
        return spec

    manifest = Manifest.read(index_path)
    corpus_path = (resolve_corpus(corpus) if corpus else Path(manifest.corpus.path)).resolve()
    if not corpus_path.is_file():
        raise FileNotFoundError(
            f"corpus {corpus_path} (recorded in {index_path / MANIFEST_NAME}) does not exist; pass --corpus PATH"
        )
    size = corpus_bytes(corpus_path)
    if size != manifest.corpus.bytes:
        raise IndexMismatchError(
            f"corpus {corpus_path} is {size} bytes but the index was built over {manifest.corpus.bytes} bytes "
            f"({manifest.corpus.path}); pass the original corpus or rebuild the index"
        )
    if verify_corpus and file_sha256(corpus_path) != manifest.corpus.sha256:
        raise IndexMismatchError(f"corpus {corpus_path} has another SHA-256 than the index's corpus; rebuild the index")
    faiss_files = [s.file for s in manifest.shards or []] or [FAISS_NAME]
    index_files = {"bm25": [BM25_DIR], "dense": faiss_files}.get(manifest.retriever, [BM25_DIR, *faiss_files])
    for name in [OFFSETS_NAME, *index_files]:
        if not (index_path / name).exists():
            raise FileNotFoundError(
                f"index {index_path} has no {name} (a damaged or incomplete index); rebuild it with `verl-search index build`"
            )
    spec = IndexSpec(
        kind=manifest.retriever,
        index_path=index_path,
        corpus_path=corpus_path,
        offsets_path=index_path / OFFSETS_NAME,
        manifest=manifest,
        use_gpu=use_gpu,
        search_backend=search_backend,
    )
    if search_backend == "torch" and manifest.retriever != "bm25" and (manifest.faiss_factory or "Flat").upper() != "FLAT":
        raise IndexMismatchError(f"--search-backend torch searches Flat indexes exactly; {index_path} was built with "
                                 f"--faiss-factory {manifest.faiss_factory}: serve it with --search-backend faiss")
    if manifest.retriever in ("dense", "hybrid"):
        built = manifest.encoder
        encoder_path = Path(encoder or built.path)
        if not encoder_path.is_dir():
            raise FileNotFoundError(
                f"encoder folder {encoder_path} (recorded in the manifest) does not exist; pass --encoder PATH"
            )
        check_encoder_matches(manifest, encoder_path, built.dim)
        spec.encoder = EncoderSettings(**{**built.settings_fields(), "path": str(encoder_path),
                                          "backend": encoder_backend or query_backend(built.backend, manifest.faiss_factory)})
    return spec


def _resolve_faiss_file(index_path, corpus, encoder, use_gpu, query_prefix, passage_prefix, backend) -> IndexSpec:
    if corpus is None or encoder is None:
        raise ValueError(
            f"{index_path} is a bare faiss file (Search-R1 layout): pass --corpus wiki-18.jsonl and "
            "--encoder PATH (the encoder the index was built with, e.g. e5-base-v2)"
        )
    corpus_path = resolve_corpus(corpus).resolve()
    if not corpus_path.is_file():
        raise FileNotFoundError(f"corpus {corpus_path} does not exist")
    encoder_fingerprint(encoder)  # a folder with config.json, or FileNotFoundError now
    return IndexSpec(
        kind="dense",
        index_path=index_path,
        corpus_path=corpus_path,
        encoder=EncoderSettings(str(encoder), query_prefix, passage_prefix, backend=backend),
        use_gpu=use_gpu,
    )


def _cached_offsets(corpus_path: Path) -> np.ndarray:
    """The corpus offset table, from the cache or by one scan (then cached)."""
    stat = corpus_path.stat()
    key = hashlib.sha256(f"{corpus_path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    cache_dir = read_env().cache_dir
    cached = cache_dir / f"offsets-{key}.npy"
    if cached.is_file():
        return np.load(cached, mmap_mode="r")
    logger.info("scanning %s once to build its offset table (cached in %s)", corpus_path, cache_dir)
    offsets, _ = scan_corpus(corpus_path)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".tmp-{os.getpid()}.npy")
        np.save(tmp, offsets)
        os.replace(tmp, cached)
    except OSError as exc:
        logger.warning("could not cache the offset table in %s: %s", cache_dir, exc)
    return offsets
