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
from typing import Any

from rlcr.config import ABLATION_VARIANTS, AblateConfig, ConfigError, Params
from rlcr.tasks import Task

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


@contextlib.contextmanager
def in_sweep(tracker, base: Params, root: Path, variant: str, seed: int) -> Iterator[str | None]:
    """Tag the stage's run as one variant x seed of the sweep of `base` (the params without overrides)
    and nest it under the sweep's parent; yields the parent's id (None when tracking is off)."""
    from rlcr.tracking import Terminated, git_state

    client = getattr(tracker, "client", None)
    if client is None:
        yield None
        return
    experiment = client.get_run(tracker.run_id).info.experiment_id
    key = sweep_key(base, root)
    parent = find_or_create_parent(client, experiment, key, f"ablate__{base.profile}__{key[:8]}",
                                   {"rlcr.profile": base.profile, **git_state(root)})
    tracker.set_tags({"ablation": variant, "seed": str(seed), "mlflow.parentRunId": parent})
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
        status = sweep_status([(r.data.tags.get("ablation", ""), r.data.tags.get("seed", ""), r.info.start_time,
                                outcome if r.info.run_id == tracker.run_id else r.info.status) for r in runs])
        if status == "RUNNING":
            client.update_run(parent, status=status)
        else:
            client.set_terminated(parent, status=status)


# ----------------------------------------------------------------------------------- one run


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
    """Wall seconds of `train` and `rollout`."""


def run_variant(params: Params, variant: str, start: Path, train_tasks: Sequence[Task], eval_tasks: Sequence[Task],
                work: Path, tracker, ckpt_dir: Path, log=print) -> VariantRun:
    """Train from `start` into `work/policy` (params already carry the variant's overrides), roll the
    policy out on the eval tasks of the trained families, evaluate."""
    from rlcr.evaluate import RunFrames, evaluate, spec_metrics
    from rlcr.rollout import rollout_policy, select_tasks
    from rlcr.train.loop import train

    t0 = time.perf_counter()
    result = train(params, start, train_tasks, work / "policy", tracker, ckpt_dir=ckpt_dir, log=log, register=False)
    t1 = time.perf_counter()
    trained = frozenset(t.family for t in train_tasks)
    # the trained families only: transfer probes are the main rollouts' business, not the ablations'
    tasks = select_tasks([t for t in eval_tasks if t.family in trained], params.ablate.max_tasks_per_family)
    org_mode = VARIANTS[variant].org_mode
    log(f"[ablate] {variant}: rollout of the trained policy as {org_mode} on {len(tasks)} eval tasks")
    records = rollout_policy(tasks, work / "policy", org_mode, params, params.rollout.seed)
    t2 = time.perf_counter()
    ev = evaluate({variant: RunFrames.from_records(records)}, params.evaluate, trained)
    return VariantRun(result.history, result.resumed_from, records, {**spec_metrics(params.evaluate, 1), **ev.metrics},
                      {"train": t1 - t0, "rollout": t2 - t1})


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


__all__ = ["INPUTS", "VARIANTS", "Variant", "VariantRun", "ablation_metrics",
           "find_or_create_parent", "in_sweep", "run_label", "run_variant", "sweep_key", "sweep_status",
           "variant_overrides"]
