"""Query encoder backends on the CPU: retrieval quality and speed (prints numbers; not a test).

For each backend (`torch`, `onnx`, `openvino`, `openvino-int8`; those whose runtime is not importable are skipped
with a line saying so), it serves the torch-built MiniLM index of the mini corpus with that
backend's query encoder (`resolve_index(..., encoder_backend=...)`, which checks the backend's
passage embeddings against the index's stored vectors on load) and prints:

* the lowest passage-embedding cosine against the index (`verify_backend`, 16 passages);
* gold-title hit@5 over `mini_wiki/qa.jsonl` (all 1,558 questions);
* queries/s at the batch limit: the encoder alone on `--batch`-query batches of real questions
  for `--seconds`, the number that caps the server under load.

    PYTHONPATH=/path/to/side-packages:src python benchmarks/bench_encoder_backends.py --seconds 10

The machine's other load shows up in every number: compare rows of one run.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import tempfile
import time
from pathlib import Path

from verl_search.eval.retrieval_quality import gold_title_recall, load_qa_with_titles
from verl_search.retrieval.dense import verify_backend
from verl_search.retrieval.encoder import BACKENDS
from verl_search.retrieval.encoder_threads import set_encoder_threads
from verl_search.retrieval.loader import resolve_index


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def encoder_qps(encoder, questions: list[str], batch: int, seconds: float) -> float:
    """Queries/s of `encoder.encode_queries` on `batch`-query batches of `questions`."""
    rng = random.Random(0)
    encoder.encode_queries(rng.sample(questions, batch))  # warm-up
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        encoder.encode_queries(rng.sample(questions, batch))
        done += batch
    return done / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", default=str(Path(os.environ.get("VERL_SEARCH_TEST_CACHE", tempfile.gettempdir()))
                                               / "mini_dense_minilm"), help="a dense index folder built with torch")
    parser.add_argument("--qa", default="mini-wiki", help="questions: JSONL file or DATASET[:SPLIT]")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--batch", type=int, default=256, help="queries per encoder call (the server's max_batch_size)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's); OpenVINO/ONNX keep their own")
    args = parser.parse_args()
    if args.threads is not None:
        set_encoder_threads(args.threads)

    rows = load_qa_with_titles(args.qa)
    questions = [row["question"] for row in rows]
    print(f"# query encoder backends: {args.index}, {len(rows)} questions, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'backend':>13} {'min cosine':>10} {'hit@5':>6} {'hit@1':>6} {f'q/s at {args.batch}':>11} {'load s':>7}")
    for backend in args.backends.split(","):
        missing = [m for m in BACKENDS[backend] if not importable(m)]
        if missing:
            print(f"{backend:>13} skipped: {', '.join(missing)} not importable")
            continue
        started = time.perf_counter()
        retriever = resolve_index(args.index, encoder_backend=backend).load()
        load_s = time.perf_counter() - started
        cosine = verify_backend(retriever.index, retriever.encoder, retriever.corpus)
        quality = gold_title_recall(retriever, rows, ks=(1, 5))["all"]
        qps = encoder_qps(retriever.encoder, questions, args.batch, args.seconds)
        print(f"{backend:>13} {cosine:>10.5f} {100 * quality['hit@5']:>6.1f} {100 * quality['hit@1']:>6.1f} "
              f"{qps:>11.1f} {load_s:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
