"""Steps of `benchmarks/gpu_check.sh`, the device check of the retrieval service on a lent H100/H200 (prints JSON
lines; not a test). Standard library, numpy and torch only beside `verl_search` (on `PYTHONPATH`), since the GPU
image has no network: each step is one sub-command.

    prep OUT --model DIR [--passages N]   random-weight MiniLM (DIR's config and tokenizer, seeded weights of the
                                          same architecture: the same speed), the mini corpus, request bodies
    wait URL PID [--timeout S] [--probe]  until GET URL/health says ready (--probe: until a one-query POST
                                          URL/retrieve answers, for Search-R1's server, which has no health route);
                                          exit 1 at once if PID is gone or failed
    load URL --bodies F --clients C ...   one wrk run: queries/s, p50/p99 ms, errors (JSON)
    same URL_A URL_B --questions F        top-5 ids of both servers for the same questions
    encoder DIR [--device D]              the query encoder's precision, forward size and queries/s per batch
    exact --rows N --dim D                TorchExactIndex over N x D random vectors: ms per search per batch size,
                                          beside one plain `topk(q @ X.T)` (the roofline) on the same tensor
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

#: wrk script: POST one body a request, cycling through the lines of the file named after `--`, each thread from
#: its own offset; done() prints one RESULT line (threads' requests summed by wrk)
LUA = r"""
local bodies, pos = {}, 1
function init(args)
  for line in io.lines(args[1]) do bodies[#bodies + 1] = line end
  pos = math.random(#bodies)
end
function request()
  pos = pos % #bodies + 1
  return wrk.format("POST", "/retrieve", {["Content-Type"] = "application/json"}, bodies[pos])
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('RESULT {"requests": %d, "duration_us": %d, "errors": %d, "timeouts": %d, ' ..
    '"p50_ms": %.1f, "p99_ms": %.1f, "max_ms": %.1f}\n', summary.requests, summary.duration,
    e.connect + e.read + e.write + e.status + e.timeout, e.timeout, latency:percentile(50) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000))
end
"""


def emit(record: dict) -> None:
    """One JSON line on stdout (the shell script tees it into `$OUT/gpu_check.jsonl`)."""
    print(json.dumps(record), flush=True)


def prep(args) -> None:
    """Random-weight MiniLM in OUT/minilm, the mini corpus (first `--passages` lines) in OUT/corpus.jsonl, 4,000
    one-question bodies in OUT/bodies_1.jsonl, 256 questions in OUT/questions.json, the wrk script OUT/bodies.lua."""
    import torch
    from transformers import BertConfig, BertModel

    import verl_search.datasets.mini_wiki as mini_wiki

    out = Path(args.out)
    model = out / "minilm"
    shutil.copytree(args.model, model, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.safetensors", "*.bin",
                                                                                         "onnx", "openvino"))
    torch.manual_seed(0)
    BertModel(BertConfig.from_pretrained(model)).save_pretrained(model, safe_serialization=True)
    shipped = Path(mini_wiki.__file__).parent
    lines = 0
    with gzip.open(shipped / "corpus.jsonl.gz", "rt", encoding="utf-8") as source, \
            open(out / "corpus.jsonl", "w", encoding="utf-8") as target:
        for line in source:
            if args.passages and lines >= args.passages:
                break
            target.write(line)
            lines += 1
    with gzip.open(shipped / "qa.jsonl.gz", "rt", encoding="utf-8") as source:
        questions = [json.loads(line)["question"] for line in source if line.strip()]
    random.Random(0).shuffle(questions)
    with open(out / "bodies_1.jsonl", "w", encoding="utf-8") as handle:
        for n in range(4000):
            handle.write(json.dumps({"queries": [questions[n % len(questions)]], "topk": 3, "return_scores": True}) + "\n")
    (out / "questions.json").write_text(json.dumps(questions[:256]))
    (out / "bodies.lua").write_text(LUA)
    emit({"step": "prep", "passages": lines, "questions": len(questions), "model": str(model)})


def wait(args) -> None:
    """Poll `URL/health` every 0.5 s (`--probe`: POST one query to `URL/retrieve`); exit 1 at once if `PID` has
    exited or the server reports `failed`, and after `--timeout` seconds if it is still not ready."""
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        try:
            os.kill(args.pid, 0)
        except ProcessLookupError:
            sys.exit(f"server {args.url} (pid {args.pid}) exited before it was ready")
        status = _probe(args.url) if args.probe else _health(args.url)
        if status == "ready":
            emit({"step": "ready", "url": args.url, "after_s": round(args.timeout - (deadline - time.monotonic()), 1)})
            return
        if status == "failed":
            sys.exit(f"server {args.url} failed to load its index (see its log)")
        time.sleep(0.5)
    sys.exit(f"server {args.url} not ready after {args.timeout:.0f} s")


def _health(url: str) -> str | None:
    """`status` of GET URL/health, or None before the server binds."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return json.loads(response.read()).get("status")
    except OSError as exc:  # 503 while loading (HTTPError), connection refused before it binds
        body = getattr(exc, "read", lambda: b"")()
        return json.loads(body).get("status") if body else None


def _probe(url: str) -> str | None:
    """Return "ready" once a one-query POST URL/retrieve answers, else None."""
    try:
        _post(url, {"queries": ["probe"], "topk": 1, "return_scores": True}, timeout=5)
        return "ready"
    except OSError:  # not listening yet, or an error status while loading
        return None


def load(args) -> None:
    """One wrk run (`$WRK`, default `wrk`) of `--clients` connections on `--threads` threads for `--seconds`."""
    command = [os.environ.get("WRK", "wrk"), f"-t{min(args.threads, args.clients)}", f"-c{args.clients}",
               f"-d{args.seconds}s", "--timeout", "30s", "-s", args.lua, f"{args.url}/retrieve", "--", args.bodies]
    output = subprocess.run(command, capture_output=True, text=True, timeout=args.seconds + 60).stdout
    line = next((line for line in output.splitlines() if line.startswith("RESULT ")), None)
    if line is None:
        sys.exit(f"wrk printed no result: {output[-2000:]}")
    result = json.loads(line[len("RESULT "):])
    result["queries_per_s"] = round((result["requests"] - result["errors"]) / (result["duration_us"] / 1e6), 1)
    emit({"step": "load", "label": args.label, "clients": args.clients, **result})


def _post(url: str, body: dict, timeout: float = 120.0) -> dict:
    request = urllib.request.Request(f"{url}/retrieve", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def same(args) -> None:
    """Top-5 passage ids of both servers for the same questions, 32 a request; how many questions agree."""
    questions = json.loads(Path(args.questions).read_text())

    def ids(url):
        found = []
        for start in range(0, len(questions), 32):
            answer = _post(url, {"queries": questions[start:start + 32], "topk": 5, "return_scores": True})
            found += [[hit["document"]["id"] for hit in hits] for hits in answer["result"]]
        return found

    first, second = ids(args.url_a), ids(args.url_b)
    emit({"step": "same_ids", "questions": len(first), "same_top5": sum(a == b for a, b in zip(first, second)),
          "same_top1": sum(a[:1] == b[:1] for a, b in zip(first, second))})


def _timed(run, reps: int, sync) -> float:
    """Seconds per call of `run`, after one warm-up call, averaged over `reps` calls."""
    run()
    sync()
    start = time.perf_counter()
    for _ in range(reps):
        run()
    sync()
    return (time.perf_counter() - start) / reps


def encoder(args) -> None:
    """The query encoder as `serve` builds it on `--device`: its precision, forward size, queries/s per batch size
    (`encode`, and `encode_eager` without CUDA graphs), its graphs' warm-up (count, seconds, GPU memory reserved),
    whether its CUDA graphs stayed on, how many were captured and their vectors' lowest cosine to the eager
    encoder's over all questions, and where a batch's milliseconds go: sentence-transformers' tokenization
    (`tokenize`), the Rust tokenizer's own `encode_batch` (`rust_tokenize`; parallel unless TOKENIZERS_PARALLELISM
    is false), the forward pass over tensors already on the device (`forward`), the same forward replayed as a CUDA
    graph (`forward_graph`, on CUDA; the error where capture fails), and the whole `encode_queries` (`encode`)."""
    import numpy as np
    import sentence_transformers
    import torch
    import transformers

    from verl_search.retrieval.encoder import SentenceEncoder

    model = SentenceEncoder(args.model, device=args.device)
    eager = SentenceEncoder(args.model, device=args.device, cuda_graphs=False)
    st = model._model
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    questions = json.loads(Path(args.questions).read_text())
    record = {"step": "encoder", "device": str(st.device), "precision": model.precision,
              "query_batch_size": model.query_batch_size,
              "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", ""),
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "sentence_transformers": sentence_transformers.__version__}}
    cuda = st.device.type == "cuda"
    started, reserved = time.perf_counter(), torch.cuda.memory_reserved() if cuda else 0
    held = model.warm_up()
    record["warm_up"] = {"graphs": held, "seconds": round(time.perf_counter() - started, 2),
                         "reserved_mb": round(((torch.cuda.memory_reserved() if cuda else 0) - reserved) / 2**20)}
    forwards = {}
    for batch in args.batches:
        texts = (questions * (batch // len(questions) + 1))[:batch]
        seconds = _timed(lambda: model.encode_queries(texts), args.reps, sync)
        eager_seconds = _timed(lambda: eager.encode_queries(texts), args.reps, sync)
        record[f"b{batch}_qps"] = round(batch / seconds)
        features = {name: value.to(st.device) if isinstance(value, torch.Tensor) else value
                    for name, value in st.preprocess(texts).items()}

        def forward(features=features):
            with torch.inference_mode():
                return st(dict(features))["sentence_embedding"]

        record[f"b{batch}_ms"] = {
            "encode": round(1e3 * seconds, 2),
            "encode_eager": round(1e3 * eager_seconds, 2),
            "tokenize": round(1e3 * _timed(lambda: st.preprocess(texts), args.reps, sync), 2),
            "rust_tokenize": round(1e3 * _timed(lambda: st.tokenizer.backend_tokenizer.encode_batch(texts), args.reps,
                                                sync), 2),
            "forward": round(1e3 * _timed(forward, args.reps, sync), 2),
            "tokens": int(features["input_ids"].shape[1])}
        forwards[batch] = forward
    graphs = model._graphs
    record["cuda_graphs"] = None if graphs is None else {"enabled": graphs.enabled, "captured": len(graphs._graphs)}
    if graphs is not None:
        same = np.concatenate([model.encode_queries(questions[i:i + 7]) for i in range(0, len(questions), 7)])
        lowest = float((same * eager.encode_queries(questions)).sum(1).min())
        record["cuda_graphs"]["lowest_cosine_to_eager"] = round(lowest, 5)
    for batch, forward in forwards.items() if cuda else ():  # last: a failed capture can
        record[f"b{batch}_ms"]["forward_graph"] = _graph_ms(forward, args.reps, sync)  # leave CUDA unusable
    emit(record)


def _graph_ms(forward, reps: int, sync):
    """ms per replay of `forward` captured as a CUDA graph (after 3 warm-up calls on a side stream), or the
    capture's error; `graph_cosine`: the lowest cosine of its output against an eager call's."""
    import torch

    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                forward()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = forward()
        graph.replay()
        sync()
        cosine = torch.nn.functional.cosine_similarity(captured.float(), forward().float(), dim=1).min().item()
        return {"ms": round(1e3 * _timed(graph.replay, reps, sync), 2), "graph_cosine": round(cosine, 5)}
    except Exception as exc:  # a measurement: the capture's error is the result
        return f"{type(exc).__name__}: {exc}"[:300]


def exact(args) -> None:
    """`TorchExactIndex` over `--rows` x `--dim` random vectors (made on the device, no host copy): ms per search of
    each batch size of `--batches` queries, top `--topk`; beside it one plain `torch.topk(q @ X.T)` per batch size
    (the roofline, where its score matrix fits)."""
    import torch

    from verl_search.retrieval.torch_exact import TorchExactIndex, default_dtype, torch_devices

    devices = torch_devices(args.device)
    dtype = default_dtype(devices)
    device = devices[0]
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    started = time.perf_counter()
    vectors = torch.empty((args.rows, args.dim), dtype=dtype, device=device)
    for start in range(0, args.rows, 1 << 20):
        chunk = vectors[start:start + (1 << 20)]
        chunk.normal_()
        chunk /= chunk.float().norm(dim=1, keepdim=True).to(dtype)
    index = TorchExactIndex(vectors, device=device, dtype=dtype)
    sync()
    record = {"step": "exact", "rows": args.rows, "dim": args.dim, "dtype": str(dtype).removeprefix("torch."),
              "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu",
              "gb": round(vectors.numel() * vectors.element_size() / 1e9, 2), "build_s": round(time.perf_counter() - started, 1)}
    generator = torch.Generator().manual_seed(0)
    for batch in args.batches:
        queries = torch.randn((batch, args.dim), generator=generator).numpy()
        record[f"b{batch}_ms"] = round(1e3 * _timed(lambda: index.search(queries, args.topk), args.reps, sync), 2)
        if args.roofline and batch * args.rows * vectors.element_size() < args.roofline_bytes:
            q = torch.from_numpy(queries).to(device=device, dtype=dtype)
            record[f"roofline_b{batch}_ms"] = round(1e3 * _timed(lambda: torch.topk(q @ vectors.T, args.topk, dim=1),
                                                                  args.reps, sync), 2)
    emit(record)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    steps = parser.add_subparsers(dest="step", required=True)
    p = steps.add_parser("prep")
    p.add_argument("out")
    p.add_argument("--model", required=True, help="a MiniLM folder (config and tokenizer; weights are not read)")
    p.add_argument("--passages", type=int, default=0, help="first N passages of the mini corpus (0: all)")
    p.set_defaults(run=prep)
    p = steps.add_parser("wait")
    p.add_argument("url")
    p.add_argument("pid", type=int)
    p.add_argument("--timeout", type=float, default=180.0)
    p.add_argument("--probe", action="store_true", help="POST one query to /retrieve instead of GET /health")
    p.set_defaults(run=wait)
    p = steps.add_parser("load")
    p.add_argument("url")
    p.add_argument("--bodies", required=True)
    p.add_argument("--lua", required=True)
    p.add_argument("--clients", type=int, required=True)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--label", default="")
    p.set_defaults(run=load)
    p = steps.add_parser("same")
    p.add_argument("url_a")
    p.add_argument("url_b")
    p.add_argument("--questions", required=True)
    p.set_defaults(run=same)
    p = steps.add_parser("encoder")
    p.add_argument("model")
    p.add_argument("--questions", required=True)
    p.add_argument("--device", default=None)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256, 512])
    p.add_argument("--reps", type=int, default=10)
    p.set_defaults(run=encoder)
    p = steps.add_parser("exact")
    p.add_argument("--rows", type=int, default=21_015_324, help="default: wiki-18's passages")
    p.add_argument("--dim", type=int, default=768, help="default: e5-base's")
    p.add_argument("--device", default=None, help="default: every visible GPU's first, else the CPU")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256, 512])
    p.add_argument("--topk", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--roofline", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--roofline-bytes", type=float, default=24e9, help="largest score matrix of the roofline")
    p.set_defaults(run=exact)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
