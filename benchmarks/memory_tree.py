"""Memory of every process on the machine while a job runs (prints numbers; not a test).

Samples `/proc/PID/smaps_rollup` (Linux) every `--interval` seconds and appends one JSON line per sample
to `--out`: the time, the machine's used memory (`MemTotal - MemAvailable`, KiB), the PSS summed over
processes holding more than 50 MiB, and those processes (PSS KiB, RSS KiB, pid, command line). PSS
(proportional set size) counts a page shared by n processes 1/n in each, so the sum over a process tree
is its memory; RSS sums count shared pages (torch's libraries, Ray's object store) once per process.

    python benchmarks/memory_tree.py --out mem.jsonl &         # while e.g. `verl-search quickstart` runs
    python benchmarks/memory_tree.py --summarize mem.jsonl     # the peak sample, process by process

Run it on a machine where the job is the only thing running: every process is counted.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

KIB_PER_GIB = 2 ** 20
SMALL_KIB = 50 * 1024  # processes under 50 MiB PSS are left out of the rows (and the sum)


def sample() -> dict:
    """One sample: `{"t": "HH:MM:SS", "used_kb", "pss_total_kb", "rows": [[pss_kb, rss_kb, pid, command]]}`."""
    rows = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as handle:
                sizes = {line.split(":")[0]: int(line.split()[1]) for line in handle if line.startswith(("Rss:", "Pss:"))}
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):  # the process ended, or is not ours to read
            continue
        if sizes.get("Pss", 0) > SMALL_KIB:
            rows.append([sizes["Pss"], sizes.get("Rss", 0), int(pid), command.strip()[:160]])
    rows.sort(reverse=True)
    with open("/proc/meminfo") as handle:
        info = {line.split(":")[0]: int(line.split()[1]) for line in handle}
    return {"t": time.strftime("%H:%M:%S"), "used_kb": info["MemTotal"] - info["MemAvailable"],
            "pss_total_kb": sum(row[0] for row in rows), "rows": rows}


def summarize(path: Path, top: int) -> None:
    samples = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not samples:
        raise SystemExit(f"{path} holds no sample")
    peak = max(samples, key=lambda s: s["pss_total_kb"])
    print(f"{len(samples)} samples, {samples[0]['t']} to {samples[-1]['t']}")
    print(f"peak PSS sum {peak['pss_total_kb'] / KIB_PER_GIB:.2f} GiB at {peak['t']}; machine used memory then "
          f"{peak['used_kb'] / KIB_PER_GIB:.2f} GiB, at most {max(s['used_kb'] for s in samples) / KIB_PER_GIB:.2f} GiB")
    print(f"largest process RSS over all samples: {max(r[1] for s in samples for r in s['rows']) / KIB_PER_GIB:.2f} GiB")
    print("| PSS GiB | RSS GiB | process |\n| ---: | ---: | --- |")
    for pss, rss, _, command in peak["rows"][:top]:
        print(f"| {pss / KIB_PER_GIB:.2f} | {rss / KIB_PER_GIB:.2f} | `{command[:90]}` |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="append samples here until stopped")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--summarize", type=Path, help="print the peak sample of this file")
    parser.add_argument("--top", type=int, default=15, help="processes printed by --summarize")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize, args.top)
        return
    if not args.out:
        parser.error("give --out FILE (sample) or --summarize FILE")
    with args.out.open("a") as out:
        while True:
            out.write(json.dumps(sample()) + "\n")
            out.flush()
            time.sleep(args.interval)


if __name__ == "__main__":
    main()
