"""Ablations: which part of the method matters? One variant = a few dotted params overrides.

Each run of the `ablate` stage is one variant x seed: a SHORT RL run from models/bootstrap
(`rlcr.train.loop.train`, `ablate.iterations` iterations, every other `train` param as it is), then a
rollout of the policy it trained on the eval tasks (`rlcr.rollout`, `ablate.max_tasks_per_family`
tasks per family) and the evaluation of that rollout (`rlcr.evaluate`, run name = the variant, so the
metrics read `<variant>/success`, `<variant>/accuracy_per_1k_tokens`, ... as rlcr/report.py expects).
The rollout is the company, except for `no_hiring`, whose organisation IS the single agent.

MLflow: every variant x seed is one run (tags `ablation`, `seed`), nested (tag `mlflow.parentRunId`)
under ONE parent run per sweep. DVC runs each matrix entry as its own process, so there is no
process that could own the parent: each child finds it by the sweep key (tag `rlcr.sweep` on the
parent) or creates it. The key hashes what every run of the sweep shares and DVC tracks: the
resolved params the stage depends on (without the lists `ablate.variants` / `ablate.seeds`, which
only enumerate the matrix, so adding a seed or running one variant alone lands under the same
parent), the md5 of models/bootstrap and of the task files, and the git commit. Two children that
create the parent at the same moment both keep the oldest run with that key; the other is deleted.
The parent's status follows its children: FAILED (or KILLED) while the latest run of any variant x
seed is, RUNNING while one runs, else FINISHED.

Covers: one parent per sweep across processes, runs of one variant alone (`dvc exp run --set-param
ablate.variants=[individual]`). Does not cover: a child killed by SIGKILL (its parent stays RUNNING,
like the child itself, see rlcr/tracking.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcr.config import ABLATION_VARIANTS, AblateConfig, ConfigError, Params
from rlcr.tasks import Task

if TYPE_CHECKING:
    import pandas as pd

INPUTS = ("models/bootstrap", "data/tasks/train.parquet", "data/tasks/eval.parquet")
"""Files every run of a sweep starts from (part of the sweep key)."""


@dataclass(frozen=True)
class Variant:
    """One ablation: what it changes and why."""

    overrides: Mapping[str, Any]
    """Dotted params keys -> values, applied over params.yaml and its profile (`rlcr.config.resolve`)."""
    why: str
    """The question it answers, in one line."""
    org_mode: str = "company"
    """How its trained policy is rolled out on the eval tasks (rlcr.rollout.ORG_MODES)."""


VARIANTS: dict[str, Variant] = {
    "collective": Variant({}, "the method: every agent is paid the verified outcome of the episode"),
    "individual": Variant({"reward.kind": "individual"},
                          "each agent is paid only for what it delivers itself: does sharing the reward matter?"),
    "mixed": Variant({"reward.kind": "mixed", "reward.alpha": 0.5},
                     "half collective, half individual: is there a middle ground?"),
    "counterfactual": Variant({"train.counterfactual_hires": 2},
                              "2 hires per iteration credited by re-running their episode without them "
                              "(rlcr/train/credit.py): does credit for hires beat the shared reward?"),
    # checked in rlcr/org/episode.py `observe`: with board_posts_shown 0 neither board section shows a
    # post (others' or the agent's own; only their count is in the section title). POST is still
    # accepted and stored, unseen. Briefs (org section) and workspace files still carry information.
    "no_board": Variant({"org.board_posts_shown": 0},
                        "agents cannot read each other's posts: how much of the gain is the board?"),
    "no_hiring": Variant({"org.single_agent": True},
                         "single-agent RL at the same token budget: does the organisation matter?",
                         org_mode="single"),
    # checked in rlcr/org/episode.py `_apply_one`: a HIRE naming a role not in org.roles is refused
    # ("unknown role") and its turn counted malformed; observations list only the roles left. A worker
    # briefed to check another's work still can (rlcr.behaviour detects verifiers by brief too).
    "no_verifiers": Variant({"org.roles": ["worker", "lead"]},
                            "no verifier or tester can be hired: does checking each other's work pay?"),
    # checked in rlcr/org/episode.py `_apply_one`: a SUBMIT before the company's first hire is refused with
    # the reason (not a malformed turn); start and end policies are rolled out under the same rule
    "must_hire": Variant({"org.min_hires": 1},
                         "the company must hire before it submits: kept from working alone, does RL improve "
                         "the organisation or find a way around it?"),
}
if set(VARIANTS) != set(ABLATION_VARIANTS):
    raise RuntimeError(f"rlcr.ablate.VARIANTS {sorted(VARIANTS)} != rlcr.config.ABLATION_VARIANTS "
                       f"{sorted(ABLATION_VARIANTS)}")


def run_label(variant: str, seed: int) -> str:
    """`<variant>__s<seed>`: the run's folder under ablations/ and its file stem under metrics/ and plots/."""
    return f"{variant}__s{seed}"


def variant_overrides(cfg: AblateConfig, variant: str, seed: int) -> dict[str, Any]:
    """The overrides of one run: the variant's, its seed, and the sweep's number of iterations.

    The variant and seed must be in `ablate.variants` / `ablate.seeds` as resolved: dvc.yaml's
    matrix reads those lists from params.yaml as written, so a mismatch means a profile changed them."""
    if variant not in cfg.variants:
        raise ConfigError(f"params.yaml: ablate.variants: {variant!r} is not in {list(cfg.variants)} (known: "
                          f"{list(ABLATION_VARIANTS)}; profiles cannot change this list: dvc.yaml's matrix reads it "
                          "from params.yaml as written)")
    if seed not in cfg.seeds:
        raise ConfigError(f"params.yaml: ablate.seeds: {seed} is not in {list(cfg.seeds)} (profiles cannot change "
                          "this list either)")
    return {**VARIANTS[variant].overrides, "train.iterations": cfg.iterations,
            "seed": seed, "train.seed": seed, "rollout.seed": seed}


# ------------------------------------------------------------------------------------- MLflow


def sweep_key(params: Params, root: Path) -> str:
    """What every run of a sweep shares (see the module docstring), hashed; `params` WITHOUT overrides."""
    from rlcr.tracking import git_state, path_md5

    data = dataclasses.asdict(params)
    shared = {
        "profile": params.profile,
        **{k: data[k] for k in ("model", "engine", "org", "reward", "train", "evaluate")},
        "rollout": {k: data["rollout"][k] for k in ("samples_per_task", "batch_episodes")},
        "ablate": {k: v for k, v in data["ablate"].items() if k not in ("variants", "seeds")},
        "inputs": {p: path_md5(root / p) for p in INPUTS},
        "git": git_state(root)["git.commit"],
    }
    return hashlib.sha256(json.dumps(shared, sort_keys=True, default=str).encode()).hexdigest()[:16]


def find_or_create_parent(client, experiment_id: str, key: str, name: str, tags: dict[str, str]) -> str:
    """The id of the sweep's parent run (tag `rlcr.sweep` = key), created if there is none yet."""
    query, order = f"tags.`rlcr.sweep` = '{key}'", ["attributes.start_time ASC"]
    found = client.search_runs([experiment_id], query, order_by=order, max_results=1)
    if found:
        return found[0].info.run_id
    mine = client.create_run(experiment_id, run_name=name, tags={**tags, "rlcr.sweep": key}).info.run_id
    first = client.search_runs([experiment_id], query, order_by=order, max_results=1)[0].info.run_id
    if first != mine:  # another child created one at the same time: keep the oldest
        client.delete_run(mine)
    return first


def sweep_status(children: Sequence[tuple[str, str, int, str]]) -> str:
    """A parent's status from its children (variant, seed, start time, status): the latest run of each
    variant x seed counts; any FAILED -> FAILED, else KILLED, else RUNNING, else FINISHED."""
    latest: dict[tuple[str, str], tuple[int, str]] = {}
    for variant, seed, start, status in children:
        if (variant, seed) not in latest or start >= latest[(variant, seed)][0]:
            latest[(variant, seed)] = (start, status)
    statuses = {s for _, s in latest.values()}
    return next((s for s in ("FAILED", "KILLED", "RUNNING") if s in statuses), "FINISHED")


SUMMARY_KEYS = ("eval/success", "eval/tokens", "eval/critical_path_ratio", "eval/malformed_rate")
"""Headline keys the sweep's parent summarises per variant across seeds."""


def sweep_summary(children: Sequence[tuple[str, str, int, str, Mapping[str, float]]], level: float = 0.95
                  ) -> dict[str, dict[str, dict[str, float]]]:
    """variant -> headline key -> `rlcr.stats.across_seeds` (mean, ci_low, ci_high, min, max, seeds) over
    the latest FINISHED run of each variant x seed (children: variant, seed, start time, status, metrics)."""
    from rlcr.stats import across_seeds

    latest: dict[tuple[str, str], tuple[int, Mapping[str, float]]] = {}
    for variant, seed, start, status, metrics in children:
        if status == "FINISHED" and ((variant, seed) not in latest or start >= latest[(variant, seed)][0]):
            latest[(variant, seed)] = (start, metrics)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for variant in sorted({v for v, _ in latest}, key=lambda v: (v not in VARIANTS, list(VARIANTS).index(v)
                                                                 if v in VARIANTS else v)):
        runs = [m for (v, _), (_, m) in sorted(latest.items()) if v == variant]
        out[variant] = {k: across_seeds([m[k] for m in runs if k in m], level) for k in SUMMARY_KEYS
                        if any(k in m for m in runs)}
    return out


def summary_metrics(summary: Mapping[str, Mapping[str, Mapping[str, float]]]) -> dict[str, float]:
    """The parent's metrics: `<variant>/success_mean`, `_ci_low`, `_ci_high` and `<variant>/seeds`."""
    out = {}
    for variant, keys in summary.items():
        for key, s in keys.items():
            name = key.removeprefix("eval/")
            out.update({f"{variant}/{name}_{k}": s[k] for k in ("mean", "ci_low", "ci_high")})
        if "eval/success" in keys:
            out[f"{variant}/seeds"] = keys["eval/success"]["seeds"]
    return out


def summary_markdown(summary: Mapping[str, Mapping[str, Mapping[str, float]]], base: Params) -> str:
    """The parent's description: what the sweep is, and success per variant with its interval across seeds."""
    a = base.ablate
    lines = [f"**Ablation sweep** (profile `{base.profile}`): each variant x seed is a short RL run "
             f"({a.iterations} iterations) from models/bootstrap, then a rollout on the eval tasks "
             f"({a.max_tasks_per_family or 'all'} per trained family). Variants {', '.join(a.variants)}; "
             f"seeds {', '.join(map(str, a.seeds))}. Compare the child runs on `eval/success`.", "",
             "| variant | eval/success, mean [95% CI across seeds] | seeds | tokens | what it asks |",
             "|---|---|---|---|---|"]
    for variant, keys in summary.items():
        s, t = keys.get("eval/success"), keys.get("eval/tokens")
        cell = f"{s['mean']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}]" if s else "-"
        why = VARIANTS[variant].why if variant in VARIANTS else ""
        lines.append(f"| {variant} | {cell} | {int(s['seeds']) if s else 0} | "
                     f"{format(t['mean'], '.1f') if t else '-'} | {why} |")
    return "\n".join(lines)


def sweep_params(base: Params, key: str) -> dict[str, Any]:
    """The parent's params: what every run of the sweep shares (the variant and seed lists are in its
    description: they may grow under the same parent)."""
    return {"profile": base.profile, "rlcr.sweep": key, "ablate.iterations": base.ablate.iterations,
            "ablate.max_tasks_per_family": base.ablate.max_tasks_per_family, "reward.kind": base.reward.kind,
            "train.lr": base.train.lr, "train.group_size": base.train.group_size,
            "train.tasks_per_iteration": base.train.tasks_per_iteration, "org.token_budget": base.org.token_budget}


def log_sweep_summary(client, parent: str, base: Params, summary) -> None:
    """Write the summary onto the parent: metrics, a `summary.json` artifact and the description."""
    from rlcr.tracking import MlflowTracker, describe_run, log_table

    tracker = MlflowTracker(client, parent)
    if summary:
        tracker.log_metrics(summary_metrics(summary))
    log_table(tracker, summary, "summary.json")
    describe_run(tracker, summary_markdown(summary, base))


def log_variant(tracker, variant: str, seed: int, profile: str, metrics: Mapping[str, Any]) -> dict[str, float]:
    """One child's comparison view: param `variant` (next to the `seed` and `profile` params), tags,
    the headline keys (rlcr.tracking.HEADLINE_KEYS) at the last RL iteration's step, a few train
    figures, and the whole metrics table as the artifact `metrics.json`. Returns what it logged. (The
    learning curve, `train/<curve column>` at steps 1..iterations, is logged during RL: CurveTracker.)"""
    from rlcr.tracking import headline_from_evaluation, log_table

    head = headline_from_evaluation(dict(metrics), variant)
    extra = {k: float(metrics[k]) for k in ("train/success_first", "train/success_last", "train/reward_last",
                                             "train/seconds", "rollout/seconds") if k in metrics}
    tracker.log_params({"variant": variant, "org_mode": VARIANTS[variant].org_mode})
    tracker.set_tags({"rlcr.variant": variant, "rlcr.seed": str(seed), "rlcr.profile": profile,
                      "rlcr.policy_out": f"ablations/{run_label(variant, seed)}/policy"})
    tracker.log_metrics({**head, **extra}, step=int(metrics.get("train/iterations", 0)))
    log_table(tracker, dict(metrics), "metrics.json")
    return {**head, **extra}


@contextlib.contextmanager
def in_sweep(tracker, base: Params, root: Path, variant: str, seed: int) -> Iterator[str | None]:
    """Tag the stage's run as one variant x seed of the sweep of `base` (the params without overrides)
    and nest it under the sweep's parent; yields the parent's id (None when tracking is off)."""
    from rlcr.tracking import MlflowTracker, Terminated, git_state

    client = getattr(tracker, "client", None)
    if client is None:
        yield None
        return
    experiment = client.get_run(tracker.run_id).info.experiment_id
    key = sweep_key(base, root)
    parent = find_or_create_parent(client, experiment, key, f"ablate__{base.profile}__{key[:8]}",
                                   {"rlcr.profile": base.profile, **git_state(root)})
    tracker.set_tags({"ablation": variant, "seed": str(seed), "mlflow.parentRunId": parent})
    try:  # the same values each time; two children logging them at once may collide, harmlessly
        MlflowTracker(client, parent).log_params(sweep_params(base, key))
    except Exception:  # noqa: BLE001 - an MlflowException or a sqlite IntegrityError: already there
        pass
    client.update_run(parent, status="RUNNING")
    outcome = "FAILED"
    try:
        yield parent
        outcome = "FINISHED"
    except (Terminated, KeyboardInterrupt):
        outcome = "KILLED"
        raise
    finally:
        runs = client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parent}'")
        rows = [(r.data.tags.get("ablation", ""), r.data.tags.get("seed", ""), r.info.start_time,
                 outcome if r.info.run_id == tracker.run_id else r.info.status) for r in runs]
        status = sweep_status(rows)
        summary = sweep_summary([(*row, r.data.metrics) for row, r in zip(rows, runs, strict=True)])  # latest values
        log_sweep_summary(client, parent, base, summary)
        if status == "RUNNING":
            client.update_run(parent, status=status)
        else:
            client.set_terminated(parent, status=status)


# ----------------------------------------------------------------------------------- one run


def show_progress(stream=None) -> bool:
    """A progress bar for the run's eval rollout: on a terminal, never under CI (`$CI` set) or in a log file."""
    import os
    import sys

    stream = sys.stderr if stream is None else stream
    return not os.environ.get("CI") and bool(getattr(stream, "isatty", lambda: False)())


class CurveTracker:
    """The tracker an ablation's RL loop logs through: of each iteration's metrics it keeps the learning
    curve's columns (rlcr.train.loop.CURVE_COLUMNS) under `train/` (`train/reward/mean`, ...), so
    a child run has tens of metrics, none of which shadows the evaluation's `behaviour/...` headline.
    Everything else goes to the wrapped tracker as it is."""

    def __init__(self, tracker):
        self.tracker = tracker

    def __getattr__(self, name: str):
        return getattr(self.tracker, name)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from rlcr.train.loop import CURVE_COLUMNS

        self.tracker.log_metrics({f"train/{k}": metrics[k] for k in CURVE_COLUMNS if k in metrics}, step=step)


@dataclass
class VariantRun:
    history: list[dict[str, float]]
    """The RL run's metrics per iteration (rlcr.train.loop.TrainResult.history)."""
    resumed_from: int | None
    records: list
    """The eval rollout's episode records."""
    evaluation: dict[str, float]
    """rlcr.evaluate metrics of the rollout (keys `<variant>/...`) and how they were made (`eval/...`)."""
    seconds: dict[str, float]
    """Wall seconds of `train`, `rollout` and `start_rollout`."""
    start_records: list = dataclasses.field(default_factory=list)
    """The start policy's rollout on the same tasks (the RL change's baseline)."""


def run_variant(params: Params, variant: str, start: Path, train_tasks: Sequence[Task], eval_tasks: Sequence[Task],
                work: Path, tracker, ckpt_dir: Path, log=print) -> VariantRun:
    """Train from `start` into `work/policy` (params already carry the variant's overrides), roll the
    policy out on the eval tasks of the trained families, evaluate."""
    from rlcr.evaluate import RunFrames, evaluate, run_table, spec_metrics
    from rlcr.rollout import rollout_policy, select_tasks
    from rlcr.train.loop import train

    t0 = time.perf_counter()
    result = train(params, start, train_tasks, work / "policy", CurveTracker(tracker), ckpt_dir=ckpt_dir, log=log,
                   register=False)
    t1 = time.perf_counter()
    trained = frozenset(t.family for t in train_tasks)
    # the trained families only: transfer probes are the main rollouts' business, not the ablations'
    tasks = select_tasks([t for t in eval_tasks if t.family in trained], params.ablate.max_tasks_per_family)
    org_mode = VARIANTS[variant].org_mode
    log(f"[ablate] {variant}: rollout of the trained policy as {org_mode} on {len(tasks)} eval tasks")
    records = rollout_policy(tasks, work / "policy", org_mode, params, params.rollout.seed, progress=show_progress())
    t2 = time.perf_counter()
    log(f"[ablate] {variant}: rollout of its start ({start.name}) as {org_mode} on the same tasks and seed")
    start_records = rollout_policy(tasks, start, org_mode, params, params.rollout.seed, progress=show_progress())
    t3 = time.perf_counter()
    ev = evaluate({variant: RunFrames.from_records(records)}, params.evaluate, trained)
    start_table, _ = run_table(RunFrames.from_records(start_records))
    return VariantRun(result.history, result.resumed_from, records,
                      {**spec_metrics(params.evaluate, 1), **ev.metrics,
                       **rl_change(ev.episodes[variant], start_table, params.evaluate)},
                      {"train": t1 - t0, "rollout": t2 - t1, "start_rollout": t3 - t2}, start_records)


def rl_change(end: pd.DataFrame, start: pd.DataFrame, spec) -> dict[str, float]:
    """What the variant's RL did, paired by task, from the episode tables (`rlcr.evaluate.run_table`) of its
    end and start policies on the same tasks, seed and organisation: the start's success with its interval
    (`start/success...`, `start/tasks`) and end minus start (`rl/success_diff...`, `rl/tasks`;
    rlcr.evaluate.compare_runs) with its split into a change of organisation and a change within it
    (`rl/form_shift...`, `rl/within_form...`; company variants), overall and on short and long tasks
    (`rl/short/...`, `rl/long/...`)."""
    from rlcr.evaluate import compare_runs, group_metrics

    out = {f"start/{k}": v for k, v in group_metrics(start, spec).items() if k.startswith(("success", "tasks"))}
    for k, v in compare_runs(end, start, "end", "start", spec).items():
        stat = k.removeprefix("short/").removeprefix("long/")
        if not k.startswith("difficulty/") and stat.startswith(("success_diff", "tasks", "form_shift", "within_form")):
            out[f"rl/{k}"] = v
    return out


def ablation_metrics(variant: str, seed: int, run: VariantRun) -> dict[str, Any]:
    """metrics/ablations/<variant>__s<seed>.json: `variant`, `seed`, the learning curve's ends, the
    evaluation (`<variant>/...`) and how the numbers were made."""
    first, last = (run.history[0], run.history[-1]) if run.history else ({}, {})
    return {
        "variant": variant, "seed": seed, "org": VARIANTS[variant].org_mode,
        "train/success_first": first.get("rollout/success", 0.0),
        "train/success_last": last.get("rollout/success", 0.0),
        "train/reward_first": first.get("reward/mean", 0.0), "train/reward_last": last.get("reward/mean", 0.0),
        "train/iterations": float(len(run.history)), "train/resumed_from": float(run.resumed_from or 0),
        **{f"{k}/seconds": v for k, v in run.seconds.items()},
        **run.evaluation,
    }


__all__ = ["INPUTS", "SUMMARY_KEYS", "CurveTracker", "VARIANTS", "Variant", "VariantRun", "ablation_metrics",
           "find_or_create_parent", "in_sweep", "log_sweep_summary", "log_variant", "rl_change", "run_label", "run_variant",
           "show_progress", "summary_markdown", "summary_metrics", "sweep_key", "sweep_params", "sweep_status", "sweep_summary",
           "variant_overrides"]
