"""Environment overhead per agent turn: what the organisation code costs around the policy.

Runs batches of episodes with a policy whose own time is measured and subtracted, so what is left
is the scheduler: rendering observations, parsing, applying actions, board, workspace, records.

    OMP_NUM_THREADS=1 python benchmarks/env_overhead.py [--episodes 64] [--repeats 3]

Two policies:
- no-op: the CEO hires workers in round 1 (so observations have an org, a board and files), then
  every agent posts a short note, writes a small file, or waits: constant text, no thinking.
- scripted verify org on 8-term sums (leads, workers, verifiers): a realistic traffic mix.

The target is that the environment costs under 5% of a rollout with a tiny model. ASSUMPTION until
the engine exists: a tiny-model turn takes ~30 ms of generation on 2 cores (20-60 ms, measured).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from rlcr.config import OrgConfig
from rlcr.org import run_episodes
from rlcr.org.episode import Generation, Request
from rlcr.org.scripted import ScriptedOrg
from rlcr.tasks import build_family

ASSUMED_TURN_MS = 30.0


class Timed:
    """Wraps a policy and accumulates the seconds spent inside it."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, 0.0

    def generate_batch(self, requests: Sequence[Request]) -> list[Generation]:
        t0 = time.perf_counter()
        out = self.inner.generate_batch(requests)
        self.seconds += time.perf_counter() - t0
        return out


class NoOp:
    """Constant replies: round 1 the CEO hires 7 workers; then posts, small writes and waits."""

    def generate_batch(self, requests: Sequence[Request]) -> list[Generation]:
        out = []
        for r in requests:
            if r.agent == 0 and r.round == 1:
                out.append(Generation("\n".join(f"HIRE worker: part {i}" for i in range(7))))
            elif (r.agent + r.round) % 3 == 0:
                out.append(Generation(f"POST @agent0 status of part {r.agent}: working"))
            elif (r.agent + r.round) % 3 == 1:
                out.append(Generation(f"WRITE notes/agent{r.agent}.txt\nround {r.round}"))
            else:
                out.append(Generation("WAIT"))
        return out


def measure(name: str, policy, tasks, cfg: OrgConfig, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        timed = Timed(policy)
        t0 = time.perf_counter()
        recs = run_episodes(tasks, timed, cfg)
        total = time.perf_counter() - t0
        turns = sum(len(r.turns) for r in recs)
        best = min(best, (total - timed.seconds) / turns)
    us = best * 1e6
    ratio = best / (ASSUMED_TURN_MS / 1000)
    print(f"{name:<28} turns/run={turns:>6}  env overhead/turn={us:8.1f} us  "
          f"= {100 * ratio:5.2f}% of an ASSUMED {ASSUMED_TURN_MS:.0f} ms tiny-model turn  "
          f"({'OK' if ratio < 0.05 else 'OVER'} the 5% target)")
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    tasks = build_family("sum").generate(0, args.episodes, 7)
    cfg = OrgConfig(max_agents=32, max_rounds=12)
    print(f"episodes per batch: {args.episodes}; org limits: {cfg.max_agents} agents, {cfg.max_rounds} rounds")
    measure("no-op policy (8 agents)", NoOp(), tasks, cfg, args.repeats)
    measure("scripted verify org", ScriptedOrg("verify", error_rate=0.1), tasks, cfg, args.repeats)


if __name__ == "__main__":
    main()
