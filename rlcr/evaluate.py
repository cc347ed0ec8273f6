"""Evaluation: pure analysis of rollout frames -> flat metrics (metrics/eval.json) + a tidy table.

Input: one run per (policy, org), named `<policy>__<org>` (`bootstrap__company`, `trained__single`),
each the episode frame and (optionally) the turn frame of `rlcr.org.records`. Runs that do not exist
yet (no trained policy) are simply not passed; their keys are absent, never an error.

Per run `<run>/...` (see `group_metrics`), on all episodes and again per `family/<name>`,
`difficulty/<d>`, `short` (difficulty <= `short_max`) and `long` (difficulty >= `long_min`):
    success (outcome >= 1) with success_ci_low/high (95% by default, TASKS resampled: rlcr.stats),
    outcome, episodes, tasks, tokens (generated per episode), critical_path_tokens, seconds (real),
    accuracy_per_1k_tokens (successes per 1000 generated tokens, pooled) with its CI.
Company runs whose episode table has the org chart are also cut by `verifiers/hired` (the org hired
a verifier or tester) and `verifiers/none`: observational, for Q3 (the ablation is the causal test);
and by the organisation each episode built (`form/<alone|delegate|verify>/...`, see `org_form`), each
with its `share` of the run's episodes.
Plus the run's aggregated behaviour metrics (`<run>/org/...`, `<run>/behaviour/...`, `<run>/time/...`,
`<run>/rollout/...`) from `rlcr.behaviour` when the turn frame is given, and two pooled rates with
their CIs: `behaviour/false_approval_rate` (false approvals / checked approvals: cover-up) and
`behaviour/idle_agents_per_hire` (idle hires / hires: free-riding).

Comparisons, paired by task on the tasks both runs share, overall, per short/long and per difficulty:
    compare/company_vs_single/<policy>/...       both orgs of one policy at the same token budget
    compare/<policy>_vs_<baseline>/<org>/...     e.g. trained_vs_bootstrap/company
with success_<a>, success_<b>, success_diff (a - b) and its CI, tasks, tokens_ratio (a/b generated
tokens), seconds_ratio (real time), critical_path_ratio (a's modelled time / b's, where a company
episode's time is its critical path and a single agent's its total tokens) with its CI, and, when
both runs have turn frames, false_approval_rate_diff and idle_agents_per_hire_diff (a - b) with CIs;
between two company runs, success_diff split into `form_shift` (a change in which organisations were
built) and `within_form` (a change in how well each did), with CIs (`form_decomposition`).

Transfer probes: given the trained families, everything above is computed on the episodes of those
families only, and the other families' episodes give `<run>/transfer/success` (pooled) and
`<run>/transfer/family/<name>/...`, never mixed into a headline figure. The cheating counters
(`<run>/cheat/...`, only for runs with code tasks: `rlcr.behaviour.cheating_metrics`) are the one
exception: they count over all of a run's episodes, probes included, since a canary or a tampered
test is cheating whichever family it is in.

`read_run` loads a run from data/rollouts (real seconds from its `.timing.parquet`), `spec_metrics`
records how the numbers were made (`eval/level`, ...), `plot_frames` gives the DVC plot tables.

Everything is a plain float; a quantity that cannot be defined (a ratio over zero tokens, a group
with no episodes) is left out rather than written as NaN.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from rlcr.behaviour import aggregate, cheating_metrics, episode_metrics
from rlcr.config import EvaluateConfig
from rlcr.org.records import EpisodeRecord, from_frames, to_frames
from rlcr.stats import Interval, bootstrap_ci, paired_diff_ci, paired_ratio_ci, percentiles, task_draws

EPISODE_COLUMNS = ("episode_id", "task_id", "family", "task", "mode", "outcome", "total_tokens",
                   "critical_path_tokens", "seconds")
TABLE_COLUMNS = ("run", "policy", "org", "group", "value", "episodes", "tasks", "success", "success_ci_low",
                 "success_ci_high", "outcome", "tokens", "critical_path_tokens", "seconds", "accuracy_per_1k_tokens",
                 "accuracy_per_1k_tokens_ci_low", "accuracy_per_1k_tokens_ci_high")
VERIFIER_ROLES = ("verifier", "tester")
FORMS = ("alone", "delegate", "verify")
"""The organisation a company episode built (`org_form`): nobody hired; hires, none of them a checker;
at least one verifier or tester hired."""
# pooled behaviour rates with a CI: name -> (numerator, denominator) columns of the episode table
RATES = {"behaviour/false_approval_rate": ("false_approvals", "approvals_checked"),
         "behaviour/idle_agents_per_hire": ("idle_agents", "hires")}
# those columns, from rlcr.behaviour's per-episode keys
BEHAVIOUR_COUNTS = {"false_approvals": "behaviour/false_approvals", "approvals_checked": "behaviour/approvals_checked",
                    "idle_agents": "behaviour/idle_agents", "hires": "org/hires"}


EvalSpec = EvaluateConfig
"""How to cut and how sure to be: the params section `evaluate` (short_max, long_min, n_resamples,
level, seed, baseline_policy), one dataclass so the stage and library cannot drift apart."""


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
    episodes: dict[str, pd.DataFrame] = field(default_factory=dict)
    """Per run, the episode table (`run_table`) of the trained families its figures come from."""

    def nested(self) -> dict:
        return nest(self.metrics)


# --------------------------------------------------------------------------------- episode table


def split_name(run: str) -> tuple[str, str]:
    """`bootstrap__company` -> ("bootstrap", "company"); a name without `__` has no org ("")."""
    policy, _, org = run.partition("__")
    return policy, org


def org_form(chart: str | list[dict]) -> str:
    """FORMS' name of the organisation an org chart (the episode frame's JSON `org_chart`, or its
    members parsed) describes."""
    roles = [m["role"] for m in (json.loads(chart) if isinstance(chart, str) else chart) if m.get("parent", -1) >= 0]
    if not roles:
        return "alone"
    return "verify" if any(r in VERIFIER_ROLES for r in roles) else "delegate"


def episode_table(episodes: pd.DataFrame) -> pd.DataFrame:
    """The columns analysis needs, with difficulty read from the stored task row and modelled time.

    Modelled time (docs/design.md, "The organisation"): a company's critical path; a single agent's total tokens."""
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
    out["mode"] = episodes["mode"].astype(str).to_numpy()
    if "org_chart" in episodes.columns:
        charts = [json.loads(c) for c in episodes["org_chart"]]
        out["verifiers"] = [sum(m["role"] in VERIFIER_ROLES for m in c) for c in charts]
        out["form"] = [org_form(c) for c in charts]
    return out.reset_index(drop=True)


def run_table(frames: RunFrames) -> tuple[pd.DataFrame, dict[str, float] | None]:
    """(`episode_table` plus each episode's BEHAVIOUR_COUNTS columns, the run's aggregated
    `rlcr.behaviour` metrics); without the turn frame, no behaviour columns and None."""
    table = episode_table(frames.episodes)
    if frames.turns is None:
        return table, None
    per_episode = [episode_metrics(r) for r in from_frames(frames.turns, frames.episodes)]
    for column, key in BEHAVIOUR_COUNTS.items():
        table[column] = [m.get(key, 0.0) for m in per_episode]
    return table, aggregate(per_episode)


def by_task(table: pd.DataFrame, column: str) -> dict[str, np.ndarray]:
    """{task_id: that column's values over the task's episodes}: the clusters the bootstrap draws."""
    return {str(k): g.to_numpy(dtype=float) for k, g in table.groupby("task_id", sort=True)[column]}


def length_groups(table: pd.DataFrame, spec: EvalSpec) -> dict[str, pd.DataFrame]:
    """{"short": ..., "long": ...}, each only when it has episodes."""
    parts = {"short": table[table["difficulty"] <= spec.short_max], "long": table[table["difficulty"] >= spec.long_min]}
    return {k: v for k, v in parts.items() if len(v)}


def _kw(spec: EvalSpec) -> dict:
    return {"n_resamples": spec.n_resamples, "seed": spec.seed, "level": spec.level}


def _ci(values: Mapping[str, np.ndarray], spec: EvalSpec) -> Interval:
    return bootstrap_ci(values, **_kw(spec))


def _with_ci(name: str, ci: Interval, scale: float = 1.0) -> dict[str, float]:
    return {name: scale * ci.estimate, f"{name}_ci_low": scale * ci.low, f"{name}_ci_high": scale * ci.high}


def rate_metrics(table: pd.DataFrame, spec: EvalSpec) -> dict[str, float]:
    """The RATES pooled over episodes (sum of numerators / sum of denominators) with task-resampled
    CIs; a rate whose denominator is 0 (no checked approval, no hire) is left out."""
    out: dict[str, float] = {}
    for name, (num, den) in RATES.items():
        if num in table and table[den].sum() > 0:
            out.update(_with_ci(name, paired_ratio_ci(by_task(table, num), by_task(table, den), **_kw(spec))))
    return out


def _finite_percentiles(estimate: float, draws: np.ndarray, spec: EvalSpec) -> tuple[float, float]:
    """The `spec.level` percentile interval of the finite draws; (estimate, estimate) when none is."""
    draws = draws[np.isfinite(draws)]
    return percentiles(draws, spec.level) if draws.size else (estimate, estimate)


def rate_diff_ci(a: pd.DataFrame, b: pd.DataFrame, num: str, den: str, spec: EvalSpec) -> Interval | None:
    """rate(a) - rate(b) with rate = sum(num) / sum(den), on the tasks both ran, both arms drawing the
    same tasks per resample; resamples where either denominator is 0 are dropped. None when either
    observed denominator is 0."""
    shared = sorted(set(a["task_id"]) & set(b["task_id"]))
    sums = [t[t["task_id"].isin(shared)].groupby("task_id", sort=True)[[num, den]].sum().reindex(shared).to_numpy()
            for t in (a, b)]  # (T, 2) each
    if not shared or any(s[:, 1].sum() == 0 for s in sums):
        return None
    idx = task_draws(len(shared), spec.n_resamples, spec.seed)  # (R, T)
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = [s[idx, 0].sum(axis=1) / s[idx, 1].sum(axis=1) for s in sums]  # (R,) each
    est = float(sums[0][:, 0].sum() / sums[0][:, 1].sum() - sums[1][:, 0].sum() / sums[1][:, 1].sum())
    return Interval(est, *_finite_percentiles(est, boot[0] - boot[1], spec), len(shared), len(a) + len(b))


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
    if table["tokens"].sum() > 0:  # successes per token pooled = mean success / mean tokens over the same episodes
        acc = paired_ratio_ci(by_task(table, "success"), by_task(table, "tokens"), **_kw(spec))
        out.update({f"accuracy_per_1k_tokens_ci_{k}": 1000.0 * getattr(acc, k) for k in ("low", "high")})
    return out


def groups(table: pd.DataFrame, spec: EvalSpec) -> list[tuple[str, str, pd.DataFrame]]:
    """(group kind, value, episodes) for all, each family, each difficulty, short and long."""
    out = [("all", "all", table)]
    out += [("family", str(f), g) for f, g in table.groupby("family", sort=True)]
    out += [("difficulty", str(d), g) for d, g in table.groupby("difficulty", sort=True)]
    out += [("length", k, g) for k, g in length_groups(table, spec).items()]
    if "verifiers" in table and (table["mode"] == "company").all():
        hired = table["verifiers"] > 0
        out += [("verifiers", k, g) for k, g in (("hired", table[hired]), ("none", table[~hired])) if len(g)]
        forms = [("form", f, table[table["form"] == f]) for f in FORMS]
        out += [x for x in forms if len(x[2])]
    return out


def _prefix(kind: str, value: str) -> str:
    return "" if kind == "all" else (f"{value}/" if kind == "length" else f"{kind}/{value}/")


def run_metrics(run: str, frames: RunFrames | tuple[pd.DataFrame, dict | None], spec: EvalSpec
                ) -> tuple[dict[str, float], list[dict]]:
    """All of one run's keys (`<run>/...`) and its rows of the tidy table (from its frames, or from
    the `run_table` already made of them)."""
    table, behaviour = frames if isinstance(frames, tuple) else run_table(frames)
    if table.empty:
        return {f"{run}/episodes": 0.0}, []
    policy, org = split_name(run)
    metrics: dict[str, float] = {}
    rows = []
    for kind, value, g in groups(table, spec):
        m = group_metrics(g, spec)
        if kind == "form":
            m["share"] = len(g) / len(table)
        metrics.update({f"{run}/{_prefix(kind, value)}{k}": v for k, v in m.items()})
        rows.append({"run": run, "policy": policy, "org": org, "group": kind, "value": value, **m})
    if behaviour is not None:
        beh = {**behaviour, **rate_metrics(table, spec)}
        metrics.update({f"{run}/{k}": float(v) for k, v in beh.items() if "/" in k})
    return metrics, rows


# -------------------------------------------------------------------------------- comparisons


def compare_tables(a: pd.DataFrame, b: pd.DataFrame, a_name: str, b_name: str, spec: EvalSpec) -> dict[str, float]:
    """Arm a against arm b on the tasks both ran (empty when they share none)."""
    shared = sorted(set(a["task_id"]) & set(b["task_id"]))
    if not shared:
        return {}
    a, b = a[a["task_id"].isin(shared)], b[b["task_id"].isin(shared)]
    kw = _kw(spec)
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
    for name, (num, den) in RATES.items():
        d = rate_diff_ci(a, b, num, den, spec) if num in a and num in b else None
        if d is not None:
            out.update(_with_ci(f"{name.split('/')[1]}_diff", d))
    if "form" in a and "form" in b and (a["mode"] == "company").all() and (b["mode"] == "company").all():
        out.update(form_decomposition(a, b, spec))
    return out


def _cell_counts(table: pd.DataFrame, tasks: list[str], cells: list[tuple[str, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(episodes, successes) per task and (form, difficulty) cell: two (tasks, cells) arrays."""
    col = {c: j for j, c in enumerate(cells)}
    row = {t: i for i, t in enumerate(tasks)}
    n, s = np.zeros((len(tasks), len(cells))), np.zeros((len(tasks), len(cells)))
    for t, f, d, ok in zip(table["task_id"], table["form"], table["difficulty"], table["success"], strict=True):
        n[row[t], col[(f, int(d))]] += 1.0
        s[row[t], col[(f, int(d))]] += ok
    return n, s


def _shift_within(n_a: np.ndarray, s_a: np.ndarray, n_b: np.ndarray, s_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(form_shift, within_form) of (..., cells) episode and success sums: shift = sum over cells of
    (share_a - share_b) * success_b, where a cell b never played counts at a's success; within = a's
    success minus b's, minus the shift."""
    with np.errstate(divide="ignore", invalid="ignore"):
        p_a, p_b = n_a / n_a.sum(-1, keepdims=True), n_b / n_b.sum(-1, keepdims=True)
        rate_b = np.where(n_b > 0, s_b / n_b, np.where(n_a > 0, s_a / n_a, 0.0))
    shift = ((p_a - p_b) * rate_b).sum(-1)
    total = s_a.sum(-1) / n_a.sum(-1) - s_b.sum(-1) / n_b.sum(-1)
    return shift, total - shift


def form_decomposition(a: pd.DataFrame, b: pd.DataFrame, spec: EvalSpec) -> dict[str, float]:
    """Company a's success minus company b's on the tasks both ran, as `form_shift` + `within_form`.

    The episodes fall in cells of (org form, task difficulty). `form_shift` is what a's mix of forms
    would gain at b's success in each cell (on the same tasks, so within each difficulty): the gain of
    building other organisations, e.g. a company that learned to stop hiring. `within_form` is the rest,
    a's share of each cell times its change in success there: the gain of doing better in the same
    organisation. A cell that b never played is counted at a's success (a new form is a shift). CIs
    resample tasks, both runs drawing the same ones (paired)."""
    tasks = sorted(set(a["task_id"]) & set(b["task_id"]))
    a, b = a[a["task_id"].isin(tasks)], b[b["task_id"].isin(tasks)]
    if not tasks or a.empty or b.empty:
        return {}
    cells = sorted({(f, int(d)) for t in (a, b) for f, d in zip(t["form"], t["difficulty"], strict=True)})
    (n_a, s_a), (n_b, s_b) = _cell_counts(a, tasks, cells), _cell_counts(b, tasks, cells)
    shift, within = _shift_within(n_a.sum(0), s_a.sum(0), n_b.sum(0), s_b.sum(0))
    idx = task_draws(len(tasks), spec.n_resamples, spec.seed)  # (R, T)
    boot = _shift_within(n_a[idx].sum(1), s_a[idx].sum(1), n_b[idx].sum(1), s_b[idx].sum(1))  # (R,) each
    out: dict[str, float] = {}
    for name, est, draws in (("form_shift", float(shift), boot[0]), ("within_form", float(within), boot[1])):
        low, high = _finite_percentiles(est, draws, spec)
        out.update({name: est, f"{name}_ci_low": low, f"{name}_ci_high": high})
    return out


def compare_runs(a: pd.DataFrame, b: pd.DataFrame, a_name: str, b_name: str, spec: EvalSpec) -> dict[str, float]:
    """`compare_tables` overall, then within short and long tasks (keys `short/...`, `long/...`) and
    per difficulty (`difficulty/<d>/...`)."""
    out = compare_tables(a, b, a_name, b_name, spec)
    la, lb = length_groups(a, spec), length_groups(b, spec)
    for part in ("short", "long"):
        if part in la and part in lb:
            out.update({f"{part}/{k}": v for k, v in compare_tables(la[part], lb[part], a_name, b_name, spec).items()})
    for d in sorted(set(a["difficulty"]) & set(b["difficulty"])):
        da, db = a[a["difficulty"] == d], b[b["difficulty"] == d]
        out.update({f"difficulty/{int(d)}/{k}": v for k, v in compare_tables(da, db, a_name, b_name, spec).items()})
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


def split_transfer(frames: RunFrames, trained: frozenset[str] | None) -> tuple[RunFrames, RunFrames | None]:
    """(the episodes of trained families, those of the other families or None): transfer probes are
    kept apart, so a family the policy never saw cannot dilute or decide the trained families' figures."""
    if trained is None:
        return frames, None
    seen = frames.episodes["family"].astype(str).isin(trained)
    if seen.all():
        return frames, None

    def part(mask) -> RunFrames:
        eps = frames.episodes[mask.to_numpy()]
        turns = frames.turns
        if turns is not None:
            turns = turns[turns["episode_id"].isin(set(eps["episode_id"]))]
        return RunFrames(eps.reset_index(drop=True), None if turns is None else turns.reset_index(drop=True))

    return part(seen), part(~seen)


def transfer_metrics(run: str, probe: RunFrames, spec: EvalSpec) -> dict[str, float]:
    """`<run>/transfer/...`: success of the probe families pooled and per family (no comparisons)."""
    table = episode_table(probe.episodes)
    out = {f"{run}/transfer/{k}": v for k, v in group_metrics(table, spec).items()}
    for fam, g in table.groupby("family", sort=True):
        out.update({f"{run}/transfer/family/{fam}/{k}": v for k, v in group_metrics(g, spec).items()})
    return out


def evaluate(runs: Mapping[str, RunFrames], spec: EvalSpec | None = None,
             trained: frozenset[str] | None = None) -> Evaluation:
    """Metrics of every run given and every comparison whose two runs are both given. With `trained`
    (the families of the train split), every figure and comparison is on those families only and the
    other families are reported apart as transfer probes (`transfer_metrics`)."""
    spec = spec or EvalSpec()
    metrics: dict[str, float] = {}
    rows: list[dict] = []
    tables = {}
    for run in sorted(runs):
        main, probe = split_transfer(runs[run], trained)
        if probe is not None:
            metrics.update(transfer_metrics(run, probe, spec))
        tables[run] = run_table(main)
    for run, table in tables.items():
        m, r = run_metrics(run, table, spec)
        metrics.update(m)
        rows += r
        if runs[run].turns is not None:  # over the whole run, probes included (module docstring)
            whole = cheating_metrics(from_frames(runs[run].turns, runs[run].episodes))
            metrics.update({f"{run}/{k}": v for k, v in whole.items()})
    metrics.update(comparisons({run: t for run, (t, _) in tables.items()}, spec))
    table = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    return Evaluation({k: float(v) for k, v in metrics.items()}, table, {run: t for run, (t, _) in tables.items()})


def spec_metrics(spec: EvalSpec, runs: int) -> dict[str, float]:
    """How the numbers were made, kept next to them so a report quotes them from the metrics file."""
    return {"eval/level": float(spec.level), "eval/n_resamples": float(spec.n_resamples),
            "eval/short_max": float(spec.short_max), "eval/long_min": float(spec.long_min), "eval/runs": float(runs)}


def plot_frames(ev: Evaluation) -> dict[str, pd.DataFrame]:
    """DVC plot tables: success per family per run (with CI), and success vs cost and modelled time
    per run, overall and per difficulty (a company's critical path; a single agent's is its total)."""
    t = ev.table
    keep = ["run", "success", "success_ci_low", "success_ci_high", "episodes"]
    fam = t[t["group"] == "family"].rename(columns={"value": "family"})[["family", *keep]]
    fam.insert(0, "family_run", fam["family"] + " | " + fam["run"])  # one bar per family and run
    cut = t[t["group"].isin(["all", "difficulty"])].rename(columns={"value": "difficulty"})
    time = cut[["run", "policy", "org", "difficulty", "critical_path_tokens", "tokens", "seconds", *keep[1:]]]
    return {"success_by_family": fam.reset_index(drop=True), "success_vs_critical_path": time.reset_index(drop=True)}


def read_run(folder: str | Path, run: str) -> RunFrames | None:
    """`<folder>/<run>.parquet` with its `.turns.parquet`, real seconds taken from `.timing.parquet`
    (the episode table stores 0.0 there so it stays byte-reproducible); None when never rolled out."""
    folder = Path(folder)
    if not (folder / f"{run}.parquet").exists():
        return None
    episodes = pd.read_parquet(folder / f"{run}.parquet")
    if (folder / f"{run}.timing.parquet").exists():
        seconds = pd.read_parquet(folder / f"{run}.timing.parquet").set_index("episode_id")["seconds"]
        lost = sorted(set(episodes["episode_id"]) - set(seconds.index))
        if lost:
            raise ValueError(f"{run}.timing.parquet lacks episodes {lost[:5]}: rerun its rollout stage")
        episodes = episodes.assign(seconds=episodes["episode_id"].map(seconds).astype(float))
    turns = folder / f"{run}.turns.parquet"
    return RunFrames(episodes=episodes, turns=pd.read_parquet(turns) if turns.exists() else None)


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


__all__ = ["BEHAVIOUR_COUNTS", "EPISODE_COLUMNS", "FORMS", "RATES", "TABLE_COLUMNS", "VERIFIER_ROLES", "EvalSpec", "Evaluation",
           "RunFrames", "by_task", "compare_runs", "compare_tables", "comparisons", "episode_table", "evaluate", "form_decomposition",
           "group_metrics", "groups", "length_groups", "nest", "plot_frames", "rate_diff_ci", "rate_metrics",
           "org_form", "read_run", "run_metrics", "run_table", "spec_metrics", "split_name"]
