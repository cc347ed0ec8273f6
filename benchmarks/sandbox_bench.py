"""Sandbox seconds per RUN: one run after another, and 64 at once from threads (rlcr/sandbox.py).

    OMP_NUM_THREADS=1 python benchmarks/sandbox_bench.py [--runs 64] [--concurrency 64] [--repeats 3]

Each run is a full `run_python` call (temp folder, bwrap, launcher, program, teardown, every process
reaped) of a small program that prints a line, what a RUN of a short agent script costs beyond the
script itself. Rows (seconds):
- sequential: each call's own seconds, calls one after another (the baseline);
- concurrent, per call: each call's own seconds while `--concurrency` threads call at once (latency);
- concurrent, wall / runs: wall seconds of a whole batch divided by its runs (cost per RUN when a
  round's RUNs are spread over threads), one figure per repeat.
The last column is the row's median over the sequential median. After the runs it checks that no
sandbox process is left.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from rlcr.sandbox import NOBODY, run_python

PROGRAM = "print(sum(range(1000)))\n"


def timed_run(_: int = 0) -> float:
    t0 = time.perf_counter()
    result = run_python(PROGRAM)
    if not result.ok:
        raise RuntimeError(f"benchmark run failed: {result}")
    return time.perf_counter() - t0


def sequential(runs: int) -> list[float]:
    return [timed_run() for _ in range(runs)]


def concurrent(runs: int, workers: int) -> tuple[list[float], float]:
    """(each call's seconds, wall seconds of the batch)."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        each = list(pool.map(timed_run, range(runs)))
    return each, time.perf_counter() - t0


def summary(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def table(rows: list[tuple[str, list[float]]]) -> str:
    """Median, min, max per row and the ratio of its median to the first row's."""
    base = statistics.median(rows[0][1])
    lines = [f"{'seconds per RUN':<34}{'median':>9}{'min':>9}{'max':>9}{'x seq':>8}  n"]
    for name, xs in rows:
        med, lo, hi = summary(xs)
        lines.append(f"{name:<34}{med:>9.4f}{lo:>9.4f}{hi:>9.4f}{med / base:>8.2f}  {len(xs)}")
    return "\n".join(lines)


def owner(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:  # gone meanwhile
        return None


def leftovers() -> int:
    """Processes of the sandbox uid still there (as root every sandbox runs as uid 65534)."""
    return sum(1 for p in os.listdir("/proc") if p.isdigit() and owner(p) == NOBODY)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=64, help="runs per batch (sequential and concurrent)")
    ap.add_argument("--concurrency", type=int, default=64, help="threads calling run_python at once")
    ap.add_argument("--repeats", type=int, default=3, help="batches of each kind, interleaved")
    args = ap.parse_args()
    load = os.getloadavg()[0]  # before our own runs: what else the machine was doing
    timed_run()  # warm the page cache
    seq, each, per_run = [], [], []
    for _ in range(args.repeats):
        seq += sequential(args.runs)
        calls, wall = concurrent(args.runs, args.concurrency)
        each += calls
        per_run.append(wall / args.runs)
    print(f"{args.runs} runs x {args.repeats} repeats, {os.cpu_count()} CPUs, load average {load:.1f} before")
    print(table([("sequential", seq), (f"{args.concurrency} concurrent, per call", each),
                 (f"{args.concurrency} concurrent, wall / runs", per_run)]))
    if os.geteuid() == 0:
        print(f"sandbox processes left: {leftovers()}")


if __name__ == "__main__":
    main()
