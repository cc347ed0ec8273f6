"""The headline views DVC shows: one small metrics file per evaluated run, with the same keys in every
file, and the long-format tables the top-level `plots:` of dvc.yaml draw.

    metrics/headline/train.json                  the train stage's held-out check after RL
    metrics/headline/rollout/<policy>__<org>.json  each rollout run, from metrics/eval.json
    metrics/headline/ablate/<variant>__s<seed>.json  each ablation run, from metrics/ablations/
    plots/compare/learning_curves.csv            iteration, run, variant, seed, success, reward: every
                                                 ablation run and the train run, one line each
    plots/compare/runs.csv                       run, kind, success and its interval: every run above

Keys (DVC_KEYS, the first of rlcr.tracking.HEADLINE_KEYS): `eval/success`, `eval/success_ci_low`,
`eval/success_ci_high`, `eval/tokens`, `eval/critical_path_ratio`, `eval/malformed_rate`, so
`dvc metrics show` is one row per run and six columns, and `dvc metrics diff` pairs them by key. A
key a run does not measure (the train stage's check has no critical path) is absent. The full
tables stay in metrics/*.json (outs, not DVC metrics); nothing here computes a new figure: each
value is copied from them (the train check's interval is Wilson's, rlcr.tracking.headline_from_held_out).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlcr.tracking import HEADLINE_KEYS, headline_from_evaluation, headline_from_held_out

DVC_KEYS = tuple(k for k in HEADLINE_KEYS[:7] if k != "eval/tasks")
"""Success with its interval, tokens, critical path ratio, malformed rate: six columns."""


def _keep(head: Mapping[str, float]) -> dict[str, float]:
    return {k: round(float(head[k]), 4) for k in DVC_KEYS if k in head}


def headline_files(eval_metrics: Mapping[str, Any] | None, train_metrics: Mapping[str, Any] | None,
                   ablations: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Relative path -> headline of every run the metrics files hold (`ablations`: label -> its file)."""
    out: dict[str, dict[str, float]] = {}
    if train_metrics:
        after = {k.replace("eval_after/", "eval/"): v for k, v in train_metrics.items() if k.startswith("eval_after/")}
        level = float((eval_metrics or {}).get("eval/level", 0.95))
        if after:
            out["metrics/headline/train.json"] = _keep(headline_from_held_out(after, level))
    runs = sorted({k.split("/", 1)[0] for k in (eval_metrics or {}) if "__" in k.split("/", 1)[0]})
    for run in runs:
        head = _keep(headline_from_evaluation(dict(eval_metrics), run))
        if head:
            out[f"metrics/headline/rollout/{run}.json"] = head
    for label, m in sorted(ablations.items()):
        head = _keep(headline_from_evaluation(dict(m), str(m.get("variant", ""))))
        if head:
            out[f"metrics/headline/ablate/{label}.json"] = head
    return out


def runs_table(files: Mapping[str, Mapping[str, float]]):
    """plots/compare/runs.csv: one row per headline file, `run` a readable label (`trained company`,
    `ablation collective s0`, `train held-out`), `kind` train | rollout | ablate."""
    import pandas as pd

    rows = []
    for path, head in files.items():
        kind, stem = path.split("/")[2], path.rsplit("/", 1)[1].removesuffix(".json")
        kind = "train" if kind == "train.json" else kind
        label = {"train": "train held-out", "rollout": stem.replace("__", " "),
                 "ablate": "ablation " + stem.replace("__", " ")}[kind]
        rows.append({"run": label, "kind": kind, "success": head.get("eval/success"),
                     "success_ci_low": head.get("eval/success_ci_low"),
                     "success_ci_high": head.get("eval/success_ci_high"), "tokens": head.get("eval/tokens")})
    return pd.DataFrame(rows, columns=["run", "kind", "success", "success_ci_low", "success_ci_high", "tokens"])


def learning_curves(curves: Mapping[str, Any]):
    """plots/compare/learning_curves.csv from curve frames (label -> plots/train.csv or
    plots/ablations/<label>.csv as read): iteration, run (`collective s0`, `train`), variant, seed,
    success (the iteration's training rollouts), reward; the train run's seed is `none`."""
    import pandas as pd

    parts = []
    for label, frame in sorted(curves.items()):
        variant, _, seed = label.partition("__s")
        parts.append(pd.DataFrame({"iteration": frame["iteration"], "run": f"{variant} s{seed}" if seed else label,
                                   "variant": variant, "seed": seed or "none",
                                   "success": frame["rollout_success"], "reward": frame["reward_mean"]}))
    columns = ["iteration", "run", "variant", "seed", "success", "reward"]
    return pd.concat(parts, ignore_index=True)[columns] if parts else pd.DataFrame(columns=columns)


__all__ = ["DVC_KEYS", "headline_files", "learning_curves", "runs_table"]
