"""Run Search-R1's own retrieval server (`search_r1/search/retrieval_server.py` of a Search-R1 clone) on a CPU, its
code unchanged, for side-by-side benchmarks (`bench_one_client_peer.py`; not part of the package):

    python benchmarks/search_r1_cpu.py /path/to/Search-R1/search_r1/search/retrieval_server.py --port 8123 -- \
        --index_path INDEX/faiss.index --corpus_path CORPUS.jsonl --retriever_name minilm --retriever_model MODEL

Their server moves the encoder and every batch to CUDA (`model.cuda()`, `tensor.cuda()`), casts the encoder to fp16
(`retrieval_use_fp16=True` is fixed in its `__main__`), calls `torch.cuda.empty_cache()` after each batch and serves
on port 8000 with uvicorn's default logging. Here `.cuda()`, `.half()` and `empty_cache` do nothing (the encoder
runs in fp32 on the CPU, as ours does) and `uvicorn.run` gets `--port` and uvicorn's `warning` log level (as
`verl-search serve --log-level warning` in the benchmark: no access-log line per request on either side).
Everything else runs as they ship it, as `__main__` (`runpy`).

With `--gpu` (the device check, `gpu_check.sh`) their CUDA code runs as shipped (fp16 encoder on the GPU, their
`empty_cache` calls); only the port and the log level change. Where the `datasets` package cannot be imported (the
GPU image has no pyarrow), a stand-in `datasets.load_dataset("json", data_files=F)` reads the corpus into a list
of dicts, which answers their `corpus[int(idx)]` at least as fast as an Arrow table: it can only favour their server.
"""

from __future__ import annotations

import argparse
import json
import logging
import runpy
import sys
import types

logger = logging.getLogger(__name__)


def _datasets_stand_in() -> None:
    """Register a list-backed `datasets` module (only `load_dataset("json", data_files=F)`) if the real one fails."""
    try:
        import datasets  # noqa: F401
    except Exception as exc:  # ImportError, or pyarrow's own import errors
        logger.warning("datasets unavailable (%s): their corpus is read by a list-backed stand-in", exc)
        module = types.ModuleType("datasets")

        def load_dataset(kind, data_files=None, split=None, **_):
            with open(data_files, encoding="utf-8") as handle:
                return [json.loads(line) for line in handle if line.strip()]

        module.load_dataset = load_dataset
        sys.modules["datasets"] = module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", help="Search-R1's search_r1/search/retrieval_server.py")
    parser.add_argument("--port", type=int, required=True, help="port to serve on (theirs is fixed at 8000)")
    parser.add_argument("--gpu", action="store_true", help="keep their CUDA and fp16 code as shipped")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])  # after `--`: the script's own flags
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    import torch
    import uvicorn

    _datasets_stand_in()
    if not args.gpu:
        torch.nn.Module.cuda = lambda self, *a, **k: self
        torch.Tensor.cuda = lambda self, *a, **k: self
        torch.nn.Module.half = lambda self: self
        torch.cuda.empty_cache = lambda: None
    serve = uvicorn.run
    uvicorn.run = lambda app, **kw: serve(app, **{**kw, "port": args.port, "log_level": "warning"})
    sys.argv = [args.script, *argv[split + 1:]]
    runpy.run_path(args.script, run_name="__main__")


if __name__ == "__main__":
    main()
