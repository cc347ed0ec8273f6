"""`dvc repro` in parallel lanes: what `make repro` runs (`python -m rlcr.repro --jobs 2`).

DVC runs one stage at a time. Most of a default repro is 21 independent `ablate@<variant>-<seed>`
stages, each one process of a tiny model whose work is mostly single-threaded Python, so one of two
cores sits idle. This runs the pipeline in three steps, each a plain `dvc repro`:

1. `dvc repro <before>` (default `bootstrap`): everything the lanes share;
2. `jobs` concurrent `dvc --wait-for-lock repro --single-item <stages...>`, one per lane: the stages
   matching `--together` (default `train rollout@*`) in one lane, the stages matching `--spread`
   (default `ablate@*`) dealt out one by one; each stage counts one in the balance;
3. `dvc repro`: the rest (evaluate, report, headline), and a check that nothing is left stale.

Every stage is still run, hashed and locked by DVC (DVC releases its repo lock while a stage's
command runs; `--wait-for-lock` waits for it instead of failing), so `dvc.lock` is that of a plain
`dvc repro`. Each stage runs at its own fixed torch thread count whatever the lanes (`rlcr.env.STAGE_THREADS`:
the bootstrap at 2, alone in the first phase, every other stage at 1), because CPU matrix products
round differently at another thread count (rarely, and a training run carries it on): so `--jobs 1`,
2 lanes on 2 cores and 4 lanes on 4 compute the same bits. `--jobs 1` is a plain `dvc repro`. If a lane fails, the other
lanes are stopped with SIGTERM (their stages end KILLED and leave no outs) and the exit status is
the failed lane's.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

TOGETHER = ("train", "rollout@*")
"""The default group kept in one lane, in this order: train, then the rollouts that read its policy."""


def _globs(globs: str | Sequence[str]) -> list[str]:
    return [globs] if isinstance(globs, str) else list(globs)


def _matches(stage: str, globs: str | Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(stage, g) for g in _globs(globs))


def plan_lanes(stages: Sequence[str], jobs: int, spread: str | Sequence[str] = "ablate@*",
               together: str | Sequence[str] = TOGETHER) -> list[list[str]]:
    """The stages of each lane: the `together` group whole in the first lane, in the order of its
    globs (a lane runs its stages as listed, without looking at the DAG: `train` before the rollouts
    of its policy), then each `spread` stage to the lane with the fewest stages so far (ties: the
    lower lane). Empty lanes are dropped."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    lanes: list[list[str]] = [[] for _ in range(jobs)]
    for glob in _globs(together):
        lanes[0].extend(s for s in stages if _matches(s, glob) and s not in lanes[0])
    for s in stages:
        if _matches(s, spread) and not _matches(s, together):
            min(lanes, key=len).append(s)
    return [lane for lane in lanes if lane]


def stage_names(root: Path, dvc: str = "dvc") -> list[str]:
    """Every stage of the project's dvc.yaml, matrix instances expanded (`dvc stage list`)."""
    out = subprocess.run([dvc, "stage", "list", "--name-only"], cwd=root, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"`dvc stage list` failed in {root}: {out.stderr.strip()}")
    return out.stdout.split()


def _pump(proc: subprocess.Popen, prefix: str) -> None:
    for line in proc.stdout:
        sys.stdout.write(f"{prefix}{line}")
        sys.stdout.flush()


def run_lanes(root: Path, lanes: Sequence[Sequence[str]], dvc: str = "dvc") -> int:
    """One `dvc --wait-for-lock repro --single-item` per lane, at once (single items: a lane must not
    check its upstream stages, whose outs another lane holds read-locked); 0 when every lane succeeds,
    else the first failure's exit status (the other lanes are terminated)."""
    procs = [subprocess.Popen([dvc, "--wait-for-lock", "repro", "--single-item", *lane], cwd=root,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for lane in lanes]
    pumps = [threading.Thread(target=_pump, args=(p, f"[lane {i}] "), daemon=True) for i, p in enumerate(procs)]
    for t in pumps:
        t.start()
    status = 0
    try:
        pending = list(procs)
        while pending:
            time.sleep(0.2)
            for proc in [p for p in pending if p.poll() is not None]:
                pending.remove(proc)
                if proc.returncode != 0 and status == 0:
                    status = proc.returncode
                    print(f"[repro] lane {procs.index(proc)} failed (exit {status}): stopping the others", flush=True)
                    _terminate(pending)
    except BaseException:
        _terminate(procs)
        raise
    for t in pumps:
        t.join()
    return status


def _terminate(procs: Sequence[subprocess.Popen]) -> None:
    for p in procs:
        if p.returncode is None:
            with suppress(ProcessLookupError):  # already gone
                os.killpg(p.pid, signal.SIGTERM)  # dvc and the stage process it runs


def repro(root: Path, jobs: int, before: str = "bootstrap", spread: str | Sequence[str] = "ablate@*",
          together: str | Sequence[str] = TOGETHER, dvc: str = "dvc") -> int:
    def step(*args: str) -> int:
        return subprocess.run([dvc, *args], cwd=root).returncode

    if jobs == 1:
        return step("repro")
    if rc := step("repro", before):
        return rc
    lanes = plan_lanes(stage_names(root, dvc), jobs, spread, together)
    print(f"[repro] {len(lanes)} lanes: " + "; ".join(f"{i}: {' '.join(lane)}" for i, lane in enumerate(lanes)),
          flush=True)
    if rc := run_lanes(root, lanes, dvc):
        return rc
    return step("repro")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="lanes run at once (1: a plain `dvc repro`)")
    ap.add_argument("--before", default="bootstrap", help="the stage run first, alone")
    ap.add_argument("--spread", default="ablate@*", help="stages dealt out over the lanes (glob)")
    ap.add_argument("--together", nargs="+", default=list(TOGETHER),
                    help="stages kept in one lane, in the order of these globs")
    ap.add_argument("--root", type=Path, default=Path.cwd(), help="the project (default: here)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    return repro(args.root.resolve(), args.jobs, args.before, args.spread, args.together)


if __name__ == "__main__":
    sys.exit(main())
