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
"""

from __future__ import annotations

import argparse
import runpy
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", help="Search-R1's search_r1/search/retrieval_server.py")
    parser.add_argument("--port", type=int, required=True, help="port to serve on (theirs is fixed at 8000)")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])  # after `--`: the script's own flags
    import torch
    import uvicorn

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
