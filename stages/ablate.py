"""DVC stage `ablate` (one per variant x seed): short RL, rollouts of its policy and its start, evaluation.

rlcr/ablate.py does the work.

    python stages/ablate.py --variant no_board --seed 0

Outs (<label> = <variant>__s<seed>):
    ablations/<label>/policy/                  the policy the variant trained (HF folder)
    ablations/<label>/rollout.parquet          its eval rollout: episode table, turn table, real seconds
    ablations/<label>/rollout.turns.parquet    (rlcr.rollout.rollout_frames; the rollout stage's GE suite
    ablations/<label>/rollout.timing.parquet    is not run here: its ~6 s import per run is the budget of a task)
    ablations/<label>/start.parquet (+ .turns, .timing)   the start policy (models/bootstrap) rolled out the same
                                               way on the same tasks and seed: the baseline of the RL change
    metrics/ablations/<label>.json             variant, seed, train/success_first/last, <variant>/... evaluation,
                                               start/success and rl/success_diff (end minus start, paired by task)
    plots/ablations/<label>.csv                per-iteration learning curve, the columns of plots/train.csv

The run folder is built as ablations/.<label>.tmp and renamed into place at the end, and the metrics
file is written last: a failed run leaves nothing a later stage could take for a result. Checkpoints
live in .state/checkpoints/ablate/<key>-<iterations> (as in the train stage): a killed run resumes;
they are deleted once the outs are written.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's rlcr, not another installed copy

from rlcr.stage import run_stage  # noqa: E402


def body(params, tracker, root: Path, variant: str, seed: int, base) -> None:
    import pandas as pd

    from rlcr import io
    from rlcr.ablate import ablation_metrics, in_sweep, log_variant, run_label, run_variant
    from rlcr.rollout import rollout_frames, write_rollout
    from rlcr.tasks.suite import from_frame
    from rlcr.train.loop import curve_frame, run_key

    label, start = run_label(variant, seed), root / "models/bootstrap"
    if not (start / "config.json").is_file():
        raise FileNotFoundError(f"{start} is not an HF policy folder (no config.json): run the bootstrap stage")
    train_tasks = from_frame(pd.read_parquet(root / "data/tasks/train.parquet"))
    eval_tasks = from_frame(pd.read_parquet(root / "data/tasks/eval.parquet"))
    ckpt_dir = root / ".state/checkpoints/ablate" / f"{run_key(params, start, train_tasks)}-{params.train.iterations}"
    work, out = root / "ablations" / f".{label}.tmp", root / "ablations" / label
    shutil.rmtree(work, ignore_errors=True)
    print(f"[ablate] {label}: {params.train.iterations} iterations x {params.train.tasks_per_iteration} tasks x "
          f"{params.train.group_size} episodes, then the eval rollout")

    with in_sweep(tracker, base, root, variant, seed):
        run = run_variant(params, variant, start, train_tasks, eval_tasks, work, tracker, ckpt_dir)
        write_rollout(rollout_frames(run.records), work, "rollout")
        write_rollout(rollout_frames(run.start_records), work, "start")
        metrics = ablation_metrics(variant, seed, run)
        log_variant(tracker, variant, seed, params.profile, metrics)  # headline keys + the table as an artifact
        shutil.rmtree(out, ignore_errors=True)
        work.rename(out)
        with io.atomic_path(root / f"plots/ablations/{label}.csv") as tmp:
            curve_frame(run.history).to_csv(tmp, index=False)
        io.write_json(metrics, root / f"metrics/ablations/{label}.json")
    shutil.rmtree(ckpt_dir, ignore_errors=True)  # outs written: checkpoints only survive a kill
    m = metrics
    print(f"[ablate] {label}: train success {m['train/success_first']:.2f} -> {m['train/success_last']:.2f}; eval "
          f"success {m.get(f'{variant}/success', 0.0):.3f} on {m.get(f'{variant}/tasks', 0.0):.0f} tasks (start "
          f"{m.get('start/success', 0.0):.3f}, change {m.get('rl/success_diff', 0.0):+.3f}); "
          f"{m['train/seconds']:.0f} s train, {m['rollout/seconds']:.0f} + {m['start_rollout/seconds']:.0f} s rollouts")


def main() -> int:
    from rlcr.ablate import variant_overrides
    from rlcr.config import ConfigError, load_params

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", required=True, help="a name in ablate.variants")
    ap.add_argument("--seed", required=True, type=int, help="a seed in ablate.seeds")
    args = ap.parse_args()
    try:  # the sweep's params (no overrides): they give the run's overrides and the sweep key
        base = load_params(ROOT / "params.yaml")
        overrides = variant_overrides(base.ablate, args.variant, args.seed)
    except ConfigError as e:
        print(f"[ablate] {e}", file=sys.stderr)
        return 2
    return run_stage(f"ablate@{args.variant}-{args.seed}",
                     lambda p, t, r: body(p, t, r, args.variant, args.seed, base), ROOT, overrides=overrides)


if __name__ == "__main__":
    sys.exit(main())
