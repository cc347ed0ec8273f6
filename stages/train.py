"""DVC stage `train`: RL from collective rewards, models/bootstrap -> models/trained.

    python stages/train.py                       # one process (train.backend torch or deepspeed)
    deepspeed --num_gpus 8 stages/train.py       # 8 data-parallel ranks (train.backend: deepspeed, ZeRO-0)

Outs:
    models/trained/        the trained policy, an HF folder (written atomically at the end)
    metrics/train.json    held-out company success before and after RL, and the last iteration's metrics
    plots/train.csv       one row per iteration: reward, success, losses, advantages, throughput

Checkpoints are not outs: they live in `.state/checkpoints/train/<key>/`, where the key hashes the
starting policy, the train tasks and every param that shapes the run (not `train.iterations`), so a
killed run started again resumes exactly. They exist only to survive a kill: once the outs are
written they are deleted, so every result comes from a run DVC can reproduce from its deps, never
from a finished run left in `.state/` (`train/resumed_from` in metrics/train.json says whether a
killed run was resumed).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's rlcr, not another installed copy

from rlcr.stage import run_stage  # noqa: E402


def inputs(params, root: Path):
    """(starting policy folder, train tasks, held-out tasks, checkpoint folder)."""
    import pandas as pd

    from rlcr.tasks.suite import from_frame
    from rlcr.train.loop import held_out, run_key

    start = root / "models/bootstrap"
    if not (start / "config.json").is_file():
        raise FileNotFoundError(f"{start} is not an HF policy folder (no config.json): run the bootstrap stage")
    tasks = from_frame(pd.read_parquet(root / "data/tasks/train.parquet"))
    evals = held_out(from_frame(pd.read_parquet(root / "data/tasks/eval.parquet")), params.train.eval_tasks)
    return start, tasks, evals, root / ".state/checkpoints/train" / run_key(params, start, tasks)


def body(params, tracker, root: Path) -> None:
    import time

    from rlcr import io
    from rlcr.train.loop import CURVE_COLUMNS, curve_frame, evaluate_folder, train

    t0 = time.perf_counter()
    start, tasks, evals, ckpt_dir = inputs(params, root)
    out, cfg = root / "models/trained", params.train
    print(f"[train] {cfg.iterations} iterations x {cfg.tasks_per_iteration} tasks x {cfg.group_size} episodes, "
          f"backend {cfg.backend}, checkpoints in {ckpt_dir.relative_to(root)}; held-out eval on {len(evals)} tasks")

    before = evaluate_folder(start, evals, params, cfg.seed)
    print(f"[train] held-out company success before RL: {before.get('eval/success', 0.0):.3f}")
    result = train(params, start, tasks, out, tracker, ckpt_dir=ckpt_dir)
    after = evaluate_folder(out, evals, params, cfg.seed)  # same tasks, same sampling seed: paired
    print(f"[train] held-out company success after RL: {after.get('eval/success', 0.0):.3f}")

    last = result.history[-1] if result.history else {}
    metrics = {
        **{k.replace("eval/", "eval_before/"): v for k, v in before.items()},
        **{k.replace("eval/", "eval_after/"): v for k, v in after.items()},
        "eval/success_delta": after.get("eval/success", 0.0) - before.get("eval/success", 0.0),
        "train/iterations": float(len(result.history)),
        "train/resumed_from": float(result.resumed_from or 0),
        "train/refused_updates": float(result.refused_updates),
        "train/seconds": time.perf_counter() - t0,
        **{f"last/{k}": last[k] for k in CURVE_COLUMNS if k in last},
    }
    log_train(tracker, params, before, after, metrics, len(result.history))
    with io.atomic_path(root / "plots/train.csv") as tmp:
        curve_frame(result.history).to_csv(tmp, index=False)
    io.write_json(metrics, root / "metrics/train.json")
    shutil.rmtree(ckpt_dir, ignore_errors=True)  # outs written: the run is DVC's to reproduce now


def log_train(tracker, params, before: dict, after: dict, metrics: dict, iterations: int) -> None:
    """MLflow: the held-out headline (rlcr.tracking.HEADLINE_KEYS) before RL at step 0 and after it at
    step `iterations`, so each key is one line from the bootstrap to the trained policy next to the
    learning curve; `eval/success_delta`; the whole metrics table as the artifact `metrics.json`; and
    the registered model version of this run tagged with its scores, profile and source."""
    from rlcr.policy.mlflow_model import REGISTERED_MODEL
    from rlcr.tracking import headline_from_held_out, log_table, tag_model_version

    level = params.evaluate.level
    tracker.log_metrics(headline_from_held_out(before, level), step=0)
    head = headline_from_held_out(after, level)
    tracker.log_metrics({**head, "eval/success_delta": metrics["eval/success_delta"],
                         "train/seconds": metrics["train/seconds"]}, step=iterations)
    log_table(tracker, metrics, "metrics.json")
    if head:
        b, a = before.get("eval/success", 0.0), after.get("eval/success", 0.0)
        tag_model_version(tracker, REGISTERED_MODEL, {
            "eval.success": f"{a:.4f}", "eval.success_before": f"{b:.4f}",
            "eval.success_delta": f"{a - b:+.4f}", "eval.tasks": f"{head['eval/tasks']:.0f}",
            "eval.improved": str(a > b).lower(), "rlcr.profile": params.profile},
            f"RL from collective rewards (stage `train`, profile `{params.profile}`, {iterations} iterations) "
            f"from models/bootstrap. Held-out company success {a:.3f} "
            f"[{head['eval/success_ci_low']:.3f}, {head['eval/success_ci_high']:.3f}] on "
            f"{head['eval/tasks']:.0f} tasks, {a - b:+.3f} against the bootstrap ({b:.3f})"
            + ("." if a > b else ": NOT an improvement on the bootstrap."))


def worker_body(params, tracker, root: Path) -> None:
    """Ranks > 0 of a multi-rank launch: their share of the rollouts and the gradient all-reduce only."""
    from rlcr.train.loop import train

    start, tasks, _, ckpt_dir = inputs(params, root)
    train(params, start, tasks, root / "models/trained", tracker, ckpt_dir=ckpt_dir)


if __name__ == "__main__":
    if os.environ.get("RANK", "0") != "0":  # one MLflow run and one set of outs: rank 0's
        sys.exit(run_stage("train", worker_body, ROOT, overrides={"tracking.enabled": False}))
    sys.exit(run_stage("train", body, ROOT))
