"""Print the tables of docs/benchmarks/gpu-check.md from the JSON lines of `benchmarks/gpu_check.sh` kept here.

    python results/gpu_check/summarize.py results/gpu_check/run5_cuda_graphs_warm_up.jsonl [more files]

Per file: every wrk run (queries/s, p50 and p99 ms); the one-client ratio of each of our servers to Search-R1's
(the mean of each server's rounds, queries/s); the encoder's ms per call with and without CUDA graphs; the torch
backend's exact search at 21M x 768.
"""

import json
import statistics
import sys
from pathlib import Path


def summarize(path: Path) -> None:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print(f"## {path.name}")
    loads = [r for r in lines if r["step"] == "load"]
    for r in loads:
        print(f"{r['label']:<20} {r['queries_per_s']:>9,.1f} q/s  p50 {r['p50_ms']:>7.1f} ms  p99 {r['p99_ms']:>7.1f} ms"
              f"  errors {r['errors']}")
    one = {name: [r["queries_per_s"] for r in loads if r["clients"] == 1 and r["label"].startswith(name + " ")]
           for name in ("torch", "workers", "faiss", "peer")}
    for name in ("torch", "workers", "faiss"):
        if one[name] and one["peer"]:
            ours, theirs = statistics.mean(one[name]), statistics.mean(one["peer"])
            print(f"1 client, {name} / Search-R1's: {ours:.1f} / {theirs:.1f} q/s = {ours / theirs:.2f}x")
    for r in lines:
        if r["step"] == "encoder":
            warm = r.get("warm_up")
            if warm:
                print(f"encoder warm-up: {warm['graphs']} graphs, {warm['seconds']} s, {warm['reserved_mb']} MB reserved")
            for key, ms in r.items():
                if key.endswith("_ms") and isinstance(ms, dict):
                    graph = ms.get("forward_graph", {})
                    print(f"encoder {key[:-3]:>5}: encode {ms['encode']} ms, eager {ms.get('encode_eager', '-')} ms, "
                          f"forward {ms['forward']} ms, graph {graph.get('ms', '-') if isinstance(graph, dict) else graph} ms")
            if r.get("cuda_graphs"):
                print(f"encoder graphs: {r['cuda_graphs']}")
        if r["step"] == "exact":
            print("exact " + ", ".join(f"{k} {v}" for k, v in r.items() if k.startswith(("b", "roofline")) and k != "build_s"))
        if r["step"] == "same_ids":
            print(f"same top-5 ids: {r['same_top5']} of {r['questions']}")


if __name__ == "__main__":
    for name in sys.argv[1:] or sorted(str(p) for p in Path(__file__).parent.glob("run*.jsonl")):
        summarize(Path(name))
