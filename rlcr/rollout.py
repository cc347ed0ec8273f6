"""Evaluation rollouts: one policy, one organisation mode, the eval tasks, the same token budget.

`rollout_policy(tasks, folder, "company" | "single", params, seed)` serves the policy folder with
the configured engine (`make_engine`), wraps it as an `EnginePolicy` (one engine call per round
for all agents of all episodes of a chunk) and runs `rlcr.org.run_episodes`. The single agent is
the same `org` section with `single_agent: true`: same scheduler, same `token_budget`, same
per-turn and observation limits, so the two modes differ only in who may act.

Episodes run in chunks of `rollout.batch_episodes` (the engine's batch and KV cache stay bounded);
chunk c samples with seed `chunk_seed(seed, c)`, and the engine policy adds the round number, so
the same seed, tasks and weights give the same tokens.

Determinism of the files (docs/reliability.md, item 13): `rollout_frames` moves the wall-clock columns (episode
`seconds`, turn `batch_seconds`/`env_seconds`) out of the episode and turn tables into a separate
timing table and writes 0.0 in their place, so the episode and turn parquets are byte-identical for
the same seed; the timing table is the only output that changes from run to run. Modelled time (the
critical path in tokens) stays in the episode table.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd

from rlcr import io
from rlcr.behaviour import behaviour_metrics
from rlcr.config import OrgConfig, Params
from rlcr.org.episode import Generation, Policy, Request, run_episodes
from rlcr.org.records import EpisodeRecord, to_frames
from rlcr.tasks import Task

ORG_MODES = ("company", "single")
TIMING_COLUMNS = ("episode_id", "seconds")
"""The timing table: real wall seconds per episode (shared batch time included, see records.py)."""


def run_name(policy: str, org_mode: str) -> str:
    """`<policy>__<org>`: the file stem under data/rollouts and the key evaluate uses."""
    return f"{policy}__{org_mode}"


def org_for(org: OrgConfig, org_mode: str) -> OrgConfig:
    """The org section for a mode; single = the same limits and budget with one agent."""
    if org_mode not in ORG_MODES:
        raise ValueError(f"org mode must be one of {ORG_MODES}, got {org_mode!r}")
    return replace(org, single_agent=org_mode == "single")


def select_tasks(tasks: Sequence[Task], max_per_family: int) -> list[Task]:
    """At most `max_per_family` tasks of each family (0 = all), round-robin over its difficulties in
    file order, so a capped family keeps its short and long tasks; the result keeps file order."""
    if max_per_family <= 0:
        return list(tasks)
    by_group: dict[tuple[str, int], list[int]] = {}
    for i, t in enumerate(tasks):
        by_group.setdefault((t.family, t.difficulty), []).append(i)
    keep: set[int] = set()
    for family in dict.fromkeys(t.family for t in tasks):
        groups = [idx for (f, _), idx in sorted(by_group.items()) if f == family]
        picked, depth = 0, 0
        while picked < max_per_family and any(depth < len(g) for g in groups):
            for g in groups:
                if depth < len(g) and picked < max_per_family:
                    keep.add(g[depth])
                    picked += 1
            depth += 1
    return [t for i, t in enumerate(tasks) if i in keep]


def chunk_seed(seed: int, chunk: int) -> int:
    """A 31-bit sampling seed for one chunk, derived (not added) so chunks never share a stream."""
    return int.from_bytes(hashlib.sha256(f"rollout/{seed}/{chunk}".encode()).digest()[:4], "big") >> 1


class _Progress:
    """A Policy wrapper that shows the round and batch size of each engine call on a tqdm bar."""

    def __init__(self, policy: Policy, bar) -> None:
        self.policy, self.bar, self.tokens = policy, bar, 0

    def generate_batch(self, requests: Sequence[Request]) -> list[Generation]:
        out = self.policy.generate_batch(requests)
        self.tokens += sum(g.completion_tokens or 0 for g in out)
        if requests:
            self.bar.set_postfix(round=requests[0].round, turns=len(requests), tokens=self.tokens, refresh=True)
        return out


def rollout_policy(
    tasks: Sequence[Task],
    folder: str | Path,
    org_mode: str,
    params: Params,
    seed: int,
    *,
    engine=None,
    progress: bool = False,
) -> list[EpisodeRecord]:
    """`rollout.samples_per_task` episodes per task, ids `<task id>#<k>`, in task order per sample.

    `engine` serves the policy instead of loading `folder` (tests, benchmarks, the train loop)."""
    from rlcr.policy.bridge import EnginePolicy, token_length_fn
    from rlcr.policy.engine import Sampling, make_engine

    cfg = params.rollout
    org = org_for(params.org, org_mode)
    engine = engine if engine is not None else make_engine(params.engine, folder, params.model)
    tokenizer = engine.tokenizer
    len_fn = token_length_fn(tokenizer)
    runner = None
    if any(t.kind == "code" for t in tasks):  # RUN exists only where a task is code
        from rlcr.org.runner import SandboxRunner

        runner = SandboxRunner()
    plan = [(t, f"{t.id}#{k}") for k in range(cfg.samples_per_task) for t in tasks]
    n = cfg.batch_episodes
    chunks = [plan[i : i + n] for i in range(0, len(plan), n)]

    from tqdm.auto import tqdm

    records: list[EpisodeRecord] = []
    with tqdm(total=len(plan), desc=f"rollout {org_mode}", unit="ep", disable=not progress, leave=True) as bar:
        for c, chunk in enumerate(chunks):
            sampling = Sampling.from_config(params.engine, seed=chunk_seed(seed, c))
            policy = _Progress(EnginePolicy(engine, tokenizer, sampling), bar)
            records += run_episodes([t for t, _ in chunk], policy, org, params.reward, len_fn=len_fn,
                                    runner=runner, episode_ids=[i for _, i in chunk])
            bar.update(len(chunk))
    return records


def rollout_frames(records: list[EpisodeRecord]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(episodes, turns, timing): the records' tables with wall-clock columns moved to `timing`."""
    turns, episodes = to_frames(records)
    timing = episodes[list(TIMING_COLUMNS)].copy()
    episodes["seconds"] = 0.0
    turns["batch_seconds"] = 0.0
    turns["env_seconds"] = 0.0
    return episodes, turns, timing


def write_rollout(frames: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame], folder: Path, stem: str) -> None:
    """`rollout_frames`' (episodes, turns, timing) as <stem>.parquet, <stem>.turns.parquet and
    <stem>.timing.parquet in `folder`: the files `rlcr.evaluate.read_run` reads back."""
    for suffix, frame in zip(("", ".turns", ".timing"), frames, strict=True):
        io.write_parquet(frame, folder / f"{stem}{suffix}.parquet")


def rollout_metrics(records: list[EpisodeRecord], seconds: float, len_fn=None) -> dict[str, float]:
    """Namespaced metrics of one rollout: outcome, reward, tokens, modelled time, throughput, and the
    aggregated behaviour metrics of `rlcr.behaviour`."""
    kw = {"len_fn": len_fn} if len_fn is not None else {}
    m = behaviour_metrics(records, **kw)
    eps = [r.episode for r in records]
    n = max(1, len(eps))
    tokens = sum(e.total_tokens for e in eps)
    m.update({
        "rollout/episodes": float(len(eps)),
        "rollout/success": sum(e.outcome >= 1.0 for e in eps) / n,
        "rollout/outcome_mean": sum(e.outcome for e in eps) / n,
        "rollout/reward_mean": sum(e.reward for e in eps) / n,
        "rollout/tokens_mean": tokens / n,
        "rollout/critical_path_mean": sum(e.critical_path_tokens for e in eps) / n,
        "rollout/submitted": sum(e.submitted for e in eps) / n,
        "perf/seconds": float(seconds),
        "perf/tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "perf/prompt_tokens_per_s": sum(e.prompt_tokens for e in eps) / seconds if seconds > 0 else 0.0,
    })
    return m


__all__ = ["ORG_MODES", "chunk_seed", "org_for", "rollout_frames", "rollout_metrics",
           "rollout_policy", "run_name", "select_tasks"]
