"""Evaluation: pure analysis of rollout frames -> flat metrics (metrics/eval.json) + a tidy table.

Input: one run per (policy, org), named `<policy>__<org>` (`bootstrap__company`, `trained__single`),
each the episode frame and (optionally) the turn frame of `rlcr.org.records`. Runs that do not exist
yet (no trained policy) are simply not passed; their keys are absent, never an error.

Per run `<run>/...` (see `group_metrics`), on all episodes and again per `family/<name>`,
`difficulty/<d>`, `short` (difficulty <= `short_max`) and `long` (difficulty >= `long_min`):
    success (outcome >= 1) with success_ci_low/high (95% by default, TASKS resampled: rlcr.stats),
    outcome, episodes, tasks, tokens (generated per episode), critical_path_tokens, seconds (real),
    accuracy_per_1k_tokens (successes per 1000 generated tokens, pooled).
Plus the run's aggregated behaviour metrics (`<run>/org/...`, `<run>/behaviour/...`, `<run>/time/...`,
`<run>/rollout/...`) from `rlcr.behaviour` when the turn frame is given.

Comparisons, paired by task on the tasks both runs share, overall and per short/long:
    compare/company_vs_single/<policy>/...       both orgs of one policy at the same token budget
    compare/<policy>_vs_<baseline>/<org>/...     e.g. trained_vs_bootstrap/company
with success_<a>, success_<b>, success_diff (a - b) and its CI, tasks, tokens_ratio (a/b generated
tokens), seconds_ratio (real time), critical_path_ratio (a's modelled time / b's, where a company
episode's time is its critical path and a single agent's its total tokens) with its CI.

Everything is a plain float; a quantity that cannot be defined (a ratio over zero tokens, a group
with no episodes) is left out rather than written as NaN.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rlcr.behaviour import behaviour_metrics
from rlcr.org.records import EpisodeRecord, from_frames, to_frames
from rlcr.stats import Interval, bootstrap_ci, paired_diff_ci, paired_ratio_ci

EPISODE_COLUMNS = ("episode_id", "task_id", "family", "task", "mode", "outcome", "total_tokens",
                   "critical_path_tokens", "seconds")
TABLE_COLUMNS = ("run", "policy", "org", "group", "value", "episodes", "tasks", "success", "success_ci_low",
                 "success_ci_high", "outcome", "tokens", "critical_path_tokens", "seconds", "accuracy_per_1k_tokens")


@dataclass(frozen=True)
class EvalSpec:
    """How to cut and how sure to be."""

    short_max: int = 1
    """Tasks of difficulty <= this are `short` (difficulty d = d+1 terms for the sum families)."""
    long_min: int = 3
    """Tasks of difficulty >= this are `long`; between the two cuts a task is neither."""
    n_resamples: int = 2000
    """Bootstrap resamples per interval."""
    level: float = 0.95
    """Confidence level of every interval."""
    seed: int = 0
    """Seed of every bootstrap (the same for all, so reruns give identical numbers)."""
    baseline_policy: str = "bootstrap"
    """Other policies are compared against this one, org by org."""

    def __post_init__(self) -> None:
        if self.long_min <= self.short_max:
            raise ValueError(f"long_min {self.long_min} must be above short_max {self.short_max}: "
                             "a task cannot be both short and long")
        if self.n_resamples < 1 or not 0.0 < self.level < 1.0:
            raise ValueError(f"need n_resamples >= 1 and 0 < level < 1, got {self.n_resamples}, {self.level}")


@dataclass(frozen=True)
class RunFrames:
    """One run's rollout tables as `rlcr.org.records.to_frames` writes them."""

    episodes: pd.DataFrame
    turns: pd.DataFrame | None = None
    """Needed only for the behaviour metrics; without it they are left out."""

    @classmethod
    def from_records(cls, records: list[EpisodeRecord]) -> RunFrames:
        turns, episodes = to_frames(records)
        return cls(episodes=episodes, turns=turns)


@dataclass(frozen=True)
class Evaluation:
    metrics: dict[str, float]
    """Flat, namespaced: `bootstrap__company/success`, `compare/company_vs_single/bootstrap/success_diff`."""
    table: pd.DataFrame
    """Tidy: one row per run x group (all, family, difficulty, length) with TABLE_COLUMNS."""

    def nested(self) -> dict:
        return nest(self.metrics)


# --------------------------------------------------------------------------------- episode table


def split_name(run: str) -> tuple[str, str]:
    """`bootstrap__company` -> ("bootstrap", "company"); a name without `__` has no org ("")."""
    policy, _, org = run.partition("__")
    return policy, org


def episode_table(episodes: pd.DataFrame) -> pd.DataFrame:
    """The columns analysis needs, with difficulty read from the stored task row and modelled time.

    Modelled time (DESIGN: Time): a company's critical path; a single agent's total tokens."""
    missing = [c for c in EPISODE_COLUMNS if c not in episodes.columns]
    if missing:
        raise ValueError(f"episode frame lacks columns {missing}")
    out = pd.DataFrame({
        "task_id": episodes["task_id"].astype(str),
        "family": episodes["family"].astype(str),
        "difficulty": [int(json.loads(t)["difficulty"]) for t in episodes["task"]],
        "success": (episodes["outcome"].astype(float) >= 1.0).astype(float),
        "outcome": episodes["outcome"].astype(float),
        "tokens": episodes["total_tokens"].astype(float),
        "critical_path_tokens": episodes["critical_path_tokens"].astype(float),
        "seconds": episodes["seconds"].astype(float),
    })
    single = (episodes["mode"] == "single").to_numpy()
    out["time_tokens"] = np.where(single, out["tokens"], out["critical_path_tokens"])
    return out.reset_index(drop=True)


def by_task(table: pd.DataFrame, column: str) -> dict[str, np.ndarray]:
    """{task_id: that column's values over the task's episodes}: the clusters the bootstrap draws."""
    return {str(k): g.to_numpy(dtype=float) for k, g in table.groupby("task_id", sort=True)[column]}


def length_groups(table: pd.DataFrame, spec: EvalSpec) -> dict[str, pd.DataFrame]:
    """{"short": ..., "long": ...}, each only when it has episodes."""
    parts = {"short": table[table["difficulty"] <= spec.short_max], "long": table[table["difficulty"] >= spec.long_min]}
    return {k: v for k, v in parts.items() if len(v)}


def _ci(values: Mapping[str, np.ndarray], spec: EvalSpec) -> Interval:
    return bootstrap_ci(values, n_resamples=spec.n_resamples, seed=spec.seed, level=spec.level)


def _per_1k(successes: float, tokens: float) -> dict[str, float]:
    return {"accuracy_per_1k_tokens": 1000.0 * successes / tokens} if tokens > 0 else {}


# ------------------------------------------------------------------------------------ one run


def group_metrics(table: pd.DataFrame, spec: EvalSpec) -> dict[str, float]:
    """Success with its task-resampled CI, cost and time of a non-empty set of episodes."""
    ci = _ci(by_task(table, "success"), spec)
    out = {"success": ci.estimate, "success_ci_low": ci.low, "success_ci_high": ci.high,
           "episodes": float(len(table)), "tasks": float(ci.n_tasks),
           "outcome": float(table["outcome"].mean()), "tokens": float(table["tokens"].mean()),
           "critical_path_tokens": float(table["critical_path_tokens"].mean()),
           "seconds": float(table["seconds"].mean())}
    out.update(_per_1k(float(table["success"].sum()), float(table["tokens"].sum())))
    return out


def groups(table: pd.DataFrame, spec: EvalSpec) -> list[tuple[str, str, pd.DataFrame]]:
    """(group kind, value, episodes) for all, each family, each difficulty, short and long."""
    out = [("all", "all", table)]
    out += [("family", str(f), g) for f, g in table.groupby("family", sort=True)]
    out += [("difficulty", str(d), g) for d, g in table.groupby("difficulty", sort=True)]
    out += [("length", k, g) for k, g in length_groups(table, spec).items()]
    return out


def _prefix(kind: str, value: str) -> str:
    return "" if kind == "all" else (f"{value}/" if kind == "length" else f"{kind}/{value}/")


def run_metrics(run: str, frames: RunFrames, spec: EvalSpec) -> tuple[dict[str, float], list[dict]]:
    """All of one run's keys (`<run>/...`) and its rows of the tidy table."""
    table = episode_table(frames.episodes)
    if table.empty:
        return {f"{run}/episodes": 0.0}, []
    policy, org = split_name(run)
    metrics: dict[str, float] = {}
    rows = []
    for kind, value, g in groups(table, spec):
        m = group_metrics(g, spec)
        metrics.update({f"{run}/{_prefix(kind, value)}{k}": v for k, v in m.items()})
        rows.append({"run": run, "policy": policy, "org": org, "group": kind, "value": value, **m})
    if frames.turns is not None:
        beh = behaviour_metrics(from_frames(frames.turns, frames.episodes))
        metrics.update({f"{run}/{k}": float(v) for k, v in beh.items() if "/" in k})
    return metrics, rows


# -------------------------------------------------------------------------------- comparisons


def compare_tables(a: pd.DataFrame, b: pd.DataFrame, a_name: str, b_name: str, spec: EvalSpec) -> dict[str, float]:
    """Arm a against arm b on the tasks both ran (empty when they share none)."""
    shared = sorted(set(a["task_id"]) & set(b["task_id"]))
    if not shared:
        return {}
    a, b = a[a["task_id"].isin(shared)], b[b["task_id"].isin(shared)]
    kw = {"n_resamples": spec.n_resamples, "seed": spec.seed, "level": spec.level}
    diff = paired_diff_ci(by_task(a, "success"), by_task(b, "success"), **kw)
    out = {f"success_{a_name}": float(a["success"].mean()), f"success_{b_name}": float(b["success"].mean()),
           "success_diff": diff.estimate, "success_diff_ci_low": diff.low, "success_diff_ci_high": diff.high,
           "tasks": float(diff.n_tasks)}
    for key, col in (("tokens_ratio", "tokens"), ("seconds_ratio", "seconds")):
        if b[col].sum() > 0:
            out[key] = float(a[col].mean() / b[col].mean())
    if b["time_tokens"].sum() > 0:
        r = paired_ratio_ci(by_task(a, "time_tokens"), by_task(b, "time_tokens"), **kw)
        out.update({"critical_path_ratio": r.estimate, "critical_path_ratio_ci_low": r.low,
                    "critical_path_ratio_ci_high": r.high})
    for name, t in ((a_name, a), (b_name, b)):
        out.update({f"{k}_{name}": v for k, v in _per_1k(float(t["success"].sum()), float(t["tokens"].sum())).items()})
    return out


def compare_runs(a: pd.DataFrame, b: pd.DataFrame, a_name: str, b_name: str, spec: EvalSpec) -> dict[str, float]:
    """`compare_tables` overall, then within short and long tasks (keys `short/...`, `long/...`)."""
    out = compare_tables(a, b, a_name, b_name, spec)
    la, lb = length_groups(a, spec), length_groups(b, spec)
    for part in ("short", "long"):
        if part in la and part in lb:
            out.update({f"{part}/{k}": v for k, v in compare_tables(la[part], lb[part], a_name, b_name, spec).items()})
    return out


def comparisons(tables: Mapping[str, pd.DataFrame], spec: EvalSpec) -> dict[str, float]:
    """Company vs single per policy; every other policy vs the baseline per org."""
    out: dict[str, float] = {}
    named = {split_name(r): t for r, t in tables.items() if split_name(r)[1] and len(t)}
    for (policy, org), t in sorted(named.items()):
        if org == "company" and (policy, "single") in named:
            m = compare_runs(t, named[(policy, "single")], "company", "single", spec)
            out.update({f"compare/company_vs_single/{policy}/{k}": v for k, v in m.items()})
        if policy != spec.baseline_policy and (spec.baseline_policy, org) in named:
            m = compare_runs(t, named[(spec.baseline_policy, org)], policy, spec.baseline_policy, spec)
            out.update({f"compare/{policy}_vs_{spec.baseline_policy}/{org}/{k}": v for k, v in m.items()})
    return out


# ---------------------------------------------------------------------------------- the whole


def evaluate(runs: Mapping[str, RunFrames], spec: EvalSpec | None = None) -> Evaluation:
    """Metrics of every run given and every comparison whose two runs are both given."""
    spec = spec or EvalSpec()
    metrics: dict[str, float] = {}
    rows: list[dict] = []
    for run in sorted(runs):
        m, r = run_metrics(run, runs[run], spec)
        metrics.update(m)
        rows += r
    metrics.update(comparisons({run: episode_table(f.episodes) for run, f in runs.items()}, spec))
    table = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    return Evaluation({k: float(v) for k, v in metrics.items()}, table)


def nest(flat: Mapping[str, float]) -> dict:
    """`a/b/c: x` -> {a: {b: {c: x}}} (for tools that want nested JSON); a clash is an error."""
    root: dict = {}
    for key, value in flat.items():
        node = root
        *parents, leaf = key.split("/")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"metric key {key!r} clashes with a value at {p!r}")
        if leaf in node:
            raise ValueError(f"metric key {key!r} clashes with another key")
        node[leaf] = value
    return root


__all__ = ["EPISODE_COLUMNS", "TABLE_COLUMNS", "EvalSpec", "Evaluation", "RunFrames", "by_task", "compare_runs",
           "compare_tables", "comparisons", "episode_table", "evaluate", "group_metrics", "groups", "length_groups",
           "nest", "run_metrics", "split_name"]
