"""DVC stage `evaluate`: data/rollouts/<policy>__<org>.* -> metrics/eval.json, plots/eval/, MLflow.

Pure analysis (rlcr/evaluate.py), no model: every configured policy x org that has been rolled out
is read; one that has not (no trained policy yet) is named and left out, never an error.

Outs:
    metrics/eval.json                       flat metrics: per run, per family/difficulty/short/long,
                                            comparisons with task-resampled CIs, eval/* (how they were made)
    plots/eval/table.csv                    tidy table: one row per run x group
    plots/eval/success_by_family.csv        DVC plot: success per family per run, with CI
    plots/eval/success_vs_critical_path.csv DVC plot: success vs modelled time per run and difficulty
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's rlcr, not another installed copy

from rlcr.stage import run_stage  # noqa: E402


def body(params, tracker, root: Path) -> None:
    from rlcr import io
    from rlcr.evaluate import evaluate, plot_frames, read_run, spec_metrics

    cfg = params.evaluate
    names = [f"{p}__{org}" for p in params.rollout.policies for org in params.rollout.orgs]
    found = {name: read_run(root / "data/rollouts", name) for name in names}
    runs = {name: frames for name, frames in found.items() if frames is not None}
    missing = sorted(set(names) - set(runs))
    if missing:
        print(f"[evaluate] not rolled out (left out): {', '.join(missing)}")
    tracker.set_tags({"rlcr.eval.runs": ",".join(sorted(runs)), "rlcr.eval.missing": ",".join(missing)})

    import pandas as pd

    trained = frozenset(pd.read_parquet(root / "data/tasks/train.parquet", columns=["family"])["family"].astype(str))
    print(f"[evaluate] trained families: {', '.join(sorted(trained))}; the others are transfer probes")
    ev = evaluate(runs, cfg, trained)
    metrics = {**spec_metrics(cfg, len(runs)), **ev.metrics}
    from rlcr.tracking import EVALUATE_LOGGED, log_table, select_metrics

    tracker.log_metrics(select_metrics(metrics, EVALUATE_LOGGED))  # tens of keys; the table is an artifact
    log_table(tracker, metrics, "metrics.json")
    out = root / "plots/eval"
    for name, frame in {"table": ev.table, **plot_frames(ev)}.items():
        with io.atomic_path(out / f"{name}.csv") as tmp:
            frame.to_csv(tmp, index=False)
    io.write_json(metrics, root / "metrics/eval.json")
    tracker.log_artifact(out, "eval")
    for run in sorted(runs):
        m = ev.metrics
        if f"{run}/success" in m:
            print(f"[evaluate] {run}: success {m[f'{run}/success']:.3f} "
                  f"[{m[f'{run}/success_ci_low']:.3f}, {m[f'{run}/success_ci_high']:.3f}] on "
                  f"{m[f'{run}/tasks']:.0f} tasks, {m[f'{run}/tokens']:.0f} tokens/episode")


if __name__ == "__main__":
    sys.exit(run_stage("evaluate", body, ROOT))
