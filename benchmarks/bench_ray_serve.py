"""Ray Serve vs the plain server (prints numbers; not a test).

Serves the mini corpus (BM25 and dense MiniLM) three ways in one run: the plain server
(`verl-search serve`, a child process), and `serve --ray` with 1 and 2 replicas (a local Ray
instance started here), and drives each with `wrk` (single-query requests cycling through the QA
questions) at 1, 16 and 256 connections for `--seconds` each. Prints queries/s and p99 latency per
setup, and Serve's ratios to the plain server.

    python benchmarks/bench_ray_serve.py --seconds 6

Needs `wrk` (`apt-get install -y wrk`) and the `[ray]` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from verl_search.datasets import read_questions
from verl_search.server.local import SubprocessServer, free_port

from bench_data import add_data_arguments, index_folder  # this folder: run as python benchmarks/...


def lua_script(questions: list[str], folder: Path) -> Path:
    """A wrk script that POSTs `{"queries": [q], "topk": 3}` cycling through `questions`."""
    bodies = ",\n".join(f"[==[{json.dumps({'queries': [q], 'topk': 3})}]==]" for q in questions)
    script = folder / "retrieve.lua"
    script.write_text(
        f"local bodies = {{\n{bodies}\n}}\nlocal i = 0\n"
        "request = function()\n  i = i % #bodies + 1\n"
        '  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, bodies[i])\nend\n'
    )
    return script


def _ms(value: str, unit: str) -> float:
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def run_wrk(url: str, script: Path, clients: int, seconds: float) -> dict:
    """`wrk --latency` against `url/retrieve`; returns queries/s, p99 (ms) and errors (non-2xx + socket)."""
    command = ["wrk", "-t", str(min(clients, 2)), "-c", str(clients), "-d", f"{seconds:g}s", "--timeout", "30s",
               "--latency", "-s", str(script), f"{url}/retrieve"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    qps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p99 = re.search(r"\s99%\s+([\d.]+)(us|ms|s|m)\b", out)
    errors = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses: (\d+)", out))
    errors += sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    return {"qps": qps, "p99": _ms(*p99.groups()) if p99 else float("nan"), "errors": errors}


def drive(url: str, script: Path, levels: list[int], seconds: float) -> dict:
    run_wrk(url, script, 4, 1.0)  # warm-up
    return {clients: run_wrk(url, script, clients, seconds) for clients in levels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_arguments(parser)
    parser.add_argument("--retrievers", default="bm25,dense")
    parser.add_argument("--seconds", type=float, default=6.0, help="duration of each load level")
    parser.add_argument("--levels", default="1,16,256")
    parser.add_argument("--num-cpus", type=float, default=1.0, help="Ray CPUs per replica")
    parser.add_argument("--plain-threads", type=int, default=1,
                        help="OMP/MKL threads of the plain server (Ray gives each replica OMP_NUM_THREADS=num_cpus, "
                             "1 by default; 0 = the library default, every core)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install -y wrk")

    import ray
    from ray import serve

    from verl_search.server.ray_serve import deploy
    from verl_search.server.serve import RayOptions, ServeOptions
    from verl_search.server.settings import ServerSettings

    questions = [row["question"] for row in read_questions(args.qa)]
    levels = [int(x) for x in args.levels.split(",")]
    print(f"# Ray Serve vs plain server: {len(questions)} questions, {args.seconds:g} s per level, "
          f"{os.cpu_count()} cores, wrk clients on the same machine, plain server threads: "
          f"{args.plain_threads or 'default'}, Ray: {args.num_cpus:g} CPU per replica")
    ray.init(num_cpus=max(4, os.cpu_count()), include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            script = lua_script(questions, Path(tmp))
            for kind in args.retrievers.split(","):
                index_dir = index_folder(Path(args.index_root), kind, args.corpus, args.encoder)
                results = {}
                threads = {"OMP_NUM_THREADS": str(args.plain_threads), "MKL_NUM_THREADS": str(args.plain_threads)}
                saved = {name: os.environ.get(name) for name in threads}
                if args.plain_threads:
                    os.environ.update(threads)
                try:
                    with SubprocessServer(["--index", str(index_dir)]) as server:
                        results["plain"] = drive(server.url, script, levels, args.seconds)
                finally:
                    for name, value in saved.items():
                        os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
                for replicas in (1, 2):
                    port = free_port()
                    url = deploy(ServeOptions(index=str(index_dir), port=port), ServerSettings(),
                                 RayOptions(ray=True, replicas=replicas, num_cpus=args.num_cpus, app_name=f"bench-{kind}"))
                    results[f"ray x{replicas}"] = drive(url, script, levels, args.seconds)
                    serve.shutdown()
                print(f"\n## {kind}")
                print(f"{'clients':>7} " + " ".join(f"{name + ' q/s':>12} {'p99 ms':>8} {'err':>4}" for name in results)
                      + "  " + " ".join(f"{name + '/plain q/s, p99':>22}" for name in results if name != "plain"))
                for clients in levels:
                    cells = " ".join(f"{r[clients]['qps']:>12.1f} {r[clients]['p99']:>8.1f} {r[clients]['errors']:>4}"
                                     for r in results.values())
                    base = results["plain"][clients]
                    ratios = " ".join(f"{r[clients]['qps'] / base['qps']:>13.2f}x, {r[clients]['p99'] / base['p99']:>5.2f}x"
                                      for name, r in results.items() if name != "plain")
                    print(f"{clients:>7} {cells}  {ratios}", flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
