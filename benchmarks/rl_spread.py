"""How much of an RL gain is the seed: the train stage's RL run from one start, several training seeds,
each policy scored with several eval seeds on the train stage's held-out tasks.

The train stage measures its gain once: one training seed, one sampled episode per held-out task (the
eval seed is `train.seed`). Both draws move the figure. This benchmark repeats the stage's own loop
(`rlcr.train.loop.train`, params.yaml's train/org/reward/engine, the prepare stage's tasks) with
training seeds --train-seeds, and scores the start and every trained policy with `evaluate_folder`
under each of --eval-seeds (128 held-out tasks x one episode each per seed in the default), so a gain
is read against both spreads:

    python benchmarks/rl_spread.py [--policy models/bootstrap] [--train-seeds 0 1 2] [--eval-seeds 0 1 2 3]
                                   [--set train.lr=3e-4 ...] [--out .state/rl_spread]

Prints, per policy, the company success under each eval seed, its mean and malformed-turn rate, and
per training seed the gain over the start (mean over eval seeds); then the mean gain and its range over
training seeds. With --single each policy is also scored as a single agent (`org.single_agent`, the same
tasks, budget and eval seeds): what RL did to the shared policy's other mode (`train.single_share`). Runs `train` from scratch in --out (an existing run there is resumed, as the stage
would). Asserts only that no held-out prompt is a train prompt.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]


def parse_sets(items: list[str]) -> dict[str, object]:
    """`key=value` overrides (values parsed as YAML: numbers, booleans, lists) -> load_params overrides."""
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set wants key=value, got {item!r}")
        out[key] = yaml.safe_load(value)
    return out


def scores(folder: Path, held, params, eval_seeds: list[int]) -> tuple[list[float], float]:
    """(company success under each eval seed, mean malformed-turn rate) of the policy in `folder`."""
    from rlcr.train.loop import evaluate_seeds, pool_seeds

    runs = evaluate_seeds(folder, held, params, eval_seeds)
    return [r["eval/success"] for r in runs], pool_seeds(runs)["eval/malformed_rate"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", default=str(ROOT / "models/bootstrap"))
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--tasks", default=str(ROOT / "data/tasks"), help="the prepare stage's train/eval parquet folder")
    ap.add_argument("--train-seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--eval-seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--set", dest="sets", nargs="*", default=[], help="params overrides, key=value")
    ap.add_argument("--out", default=str(ROOT / ".state/rl_spread"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--single", action="store_true", help="also score every policy as a single agent")
    args = ap.parse_args()

    import pandas as pd
    import torch

    sys.path.insert(0, str(ROOT))
    from rlcr.config import load_params
    from rlcr.tasks.suite import from_frame
    from rlcr.tracking import NullTracker
    from rlcr.train.loop import held_out, train

    torch.set_num_threads(args.threads)
    params = load_params(args.params, {"tracking.enabled": False, **parse_sets(args.sets)})
    tasks = from_frame(pd.read_parquet(Path(args.tasks) / "train.parquet"))
    held = held_out(from_frame(pd.read_parquet(Path(args.tasks) / "eval.parquet")), params.train.eval_tasks)
    assert not {t.prompt for t in tasks} & {t.prompt for t in held}, "a held-out prompt is a train prompt"
    out = Path(args.out)
    print(f"start {args.policy}; {len(held)} held-out tasks; {params.train.iterations} iterations x "
          f"{params.train.tasks_per_iteration} tasks x {params.train.group_size} episodes; overrides {args.sets or 'none'}")

    alone = replace(params, org=replace(params.org, single_agent=True))

    def scored(name: str, folder: Path) -> tuple:
        single = scores(folder, held, alone, args.eval_seeds) if args.single else None
        return (name, *scores(folder, held, params, args.eval_seeds), single)

    rows = [scored("start", Path(args.policy))]
    for seed in args.train_seeds:
        t0 = time.perf_counter()
        run = load_params(args.params, {"tracking.enabled": False, **parse_sets(args.sets), "train.seed": seed})
        folder = out / f"train_seed{seed}"
        train(run, args.policy, tasks, folder, NullTracker(), ckpt_dir=out / f"ckpt_seed{seed}",
              log=lambda *_: None, register=False)
        rows.append(scored(f"train seed {seed} ({time.perf_counter() - t0:.0f} s)", folder))

    start = statistics.fmean(rows[0][1])
    extra = (" single agent: success mean (malformed turns) |", "---|") if args.single else ("", "")
    print(f"\n| policy | success, eval seeds {' / '.join(map(str, args.eval_seeds))} | mean | gain | malformed turns |"
          + extra[0])
    print("|---|---|---|---|---|" + extra[1])
    for name, succ, mal, single in rows:
        mean = statistics.fmean(succ)
        gain = "" if name == "start" else f"{mean - start:+.3f}"
        cell = f" {statistics.fmean(single[0]):.3f} ({single[1]:.3f}) |" if single else ""
        print(f"| {name} | {' / '.join(f'{s:.3f}' for s in succ)} | {mean:.3f} | {gain} | {mal:.3f} |" + cell)
    gains = [statistics.fmean(succ) - start for _, succ, _, _ in rows[1:]]
    if gains:
        print(f"\ngain over the start, mean over {len(gains)} training seeds: {statistics.fmean(gains):+.3f} "
              f"(lowest {min(gains):+.3f}, highest {max(gains):+.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
