"""Counterfactual credit for hires: what did this hire add to the outcome? (difference rewards)

For a sampled subset of the iteration's hires, the episode is run again from the hiring point with
that hire withheld, and the hired agent's tokens are credited with

    D = outcome(episode with the hire) - outcome(the same episode without it)

instead of the group-relative advantage of the collective reward. D is already a baseline-subtracted
return (the counterfactual is the baseline), so it is used as the hire's advantage as is; it lies
in [-1, 1] like the outcome difference it is. The idea is Wolpert & Tumer's difference rewards
(2002) and COMA's counterfactual baseline (Foerster et al. 2018, arXiv 1705.08926), with the
counterfactual obtained by simulation instead of a learned critic.

How "re-run from the hiring point" is done, exactly:
- rounds before the hire and the hiring round itself are REPLAYED: every agent's recorded text is
  given back verbatim (the environment is deterministic given the texts, so the org reaches the
  same state; `credit/replay_mismatch` counts replayed turns whose observation differs, which
  would mean it is not);
- in the hiring round, the hirer's turn is replayed with that one HIRE line removed (its other
  actions stay, and it is charged the tokens it really generated, so budgets match);
- from the next round on, every agent of the counterfactual org samples fresh from the same policy,
  with a sampling seed derived from the iteration's seed stream.
Approximations, said plainly: the counterfactual is ONE sample of the rest of the episode (the
original is one sample too), so D is a noisy estimate of the hire's effect; a hire whose HIRE line
cannot be removed cleanly (e.g. a second HIRE in the same line's text) is skipped and counted;
only the hired agent's own tokens get D (a withheld lead also withholds its own hires, whose tokens
keep the collective advantage); the hirer's HIRE line keeps the collective advantage.

Cost: one extra episode per credited hire, all of them batched in one `run_episodes` call;
reported as `credit/extra_episodes` and `credit/seconds`.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from rlcr.config import OrgConfig, RewardConfig
from rlcr.org.episode import Generation, LengthFn, Policy, Request, run_episodes
from rlcr.org.protocol import parse_turn
from rlcr.org.records import EpisodeRecord, TurnRow


@dataclass(frozen=True)
class Hire:
    """One accepted HIRE in a recorded episode."""

    record: int
    """Index of the episode in the iteration's records."""
    round: int
    """Round of the HIRE (the hire joins at round + 1)."""
    hirer: int
    hired: int
    nth: int
    """Which HIRE action of the hirer's turn it was (0-based, refused ones included)."""


def find_hires(records: Sequence[EpisodeRecord]) -> list[Hire]:
    """Every accepted HIRE of every episode, in order."""
    out = []
    for i, rec in enumerate(records):
        for t in rec.turns:
            hires = [e for e in json.loads(t.events) if e["kind"] == "HIRE"]
            for nth, e in enumerate(hires):
                if "refused" not in e and "agent" in e:
                    out.append(Hire(i, t.round, t.agent, int(e["agent"]), nth))
    return out


def without_hire(text: str, nth: int, max_actions: int) -> str | None:
    """The completion with its nth HIRE action line removed; None when that cannot be done cleanly.

    Action lines are found as the parser finds them (a WRITE takes every line after it as content,
    so no HIRE can follow it); the result must parse to the same actions minus that one."""
    lines = text.split("\n")
    seen, drop = 0, None
    for i, line in enumerate(lines):
        acts = parse_turn(line, max_actions).actions
        if not acts:
            continue
        if acts[0].kind == "WRITE":
            break
        if acts[0].kind == "HIRE":
            if seen == nth:
                drop = i
                break
            seen += 1
    if drop is None:
        return None
    new = "\n".join(lines[:drop] + lines[drop + 1:])
    before = list(parse_turn(text, max_actions).actions)
    hires = [k for k, a in enumerate(before) if a.kind == "HIRE"]
    if nth >= len(hires):
        return None
    del before[hires[nth]]
    return new if list(parse_turn(new, max_actions).actions) == before else None


class ReplayThenSample:
    """A policy that gives back recorded turns where it has them and asks `policy` for the rest.

    `replay[(episode_id, agent, round)] = (Generation, expected prompt)`; all fresh requests of a round
    still go to the inner policy as one batch."""

    def __init__(self, policy: Policy, replay: dict[tuple[str, int, int], tuple[Generation, str]]):
        self.policy, self.replay, self.mismatch, self.replayed = policy, replay, 0, 0

    def generate_batch(self, requests: Sequence[Request]) -> list[Generation]:
        out: list[Generation | None] = [None] * len(requests)
        fresh = []
        for i, r in enumerate(requests):
            hit = self.replay.get((r.episode_id, r.agent, r.round))
            if hit is None:
                fresh.append(i)
                continue
            gen, prompt = hit
            self.replayed += 1
            self.mismatch += prompt != r.prompt
            out[i] = gen
        if fresh:
            for i, g in zip(fresh, self.policy.generate_batch([requests[i] for i in fresh]), strict=True):
                out[i] = g
        return out  # type: ignore[return-value]


def _replayed(t: TurnRow, text: str | None = None) -> Generation:
    """A recorded turn as a Generation: same text (or the edited one), same token counts."""
    return Generation(text=t.completion if text is None else text, prompt_tokens=t.prompt_tokens,
                      completion_tokens=t.completion_tokens, finish_reason=t.finish_reason or None)


def counterfactual_credit(
    records: Sequence[EpisodeRecord],
    policy: Policy,
    org: OrgConfig,
    reward: RewardConfig,
    len_fn: LengthFn,
    n_hires: int,
    rng: random.Random,
) -> tuple[dict[tuple[str, int], float], dict[str, float]]:
    """({(episode_id, hired agent): D}, cost and summary metrics) for up to n_hires sampled hires."""
    t0 = time.perf_counter()
    hires = find_hires(records)
    picked = sorted(rng.sample(range(len(hires)), min(n_hires, len(hires))))
    tasks, ids, replay, plan, skipped = [], [], {}, [], 0
    for p in picked:
        h = hires[p]
        rec = records[h.record]
        hirer_turn = next(t for t in rec.turns if t.round == h.round and t.agent == h.hirer)
        edited = without_hire(hirer_turn.completion, h.nth, org.max_actions_per_turn)
        if edited is None:
            skipped += 1
            continue
        cf_id = f"{rec.episode.episode_id}~without{h.hired}"
        for t in rec.turns:
            if t.round <= h.round:
                text = edited if t is hirer_turn else None
                replay[(cf_id, t.agent, t.round)] = (_replayed(t, text), t.prompt)
        tasks.append(rec.episode.task_obj())
        ids.append(cf_id)
        plan.append(h)
    wrapped = ReplayThenSample(policy, replay)
    cf = run_episodes(tasks, wrapped, org, reward, len_fn=len_fn, episode_ids=ids) if tasks else []
    credit: dict[tuple[str, int], float] = {}
    for h, rec in zip(plan, cf, strict=True):
        original = records[h.record].episode
        credit[(original.episode_id, h.hired)] = original.outcome - rec.episode.outcome
    diffs = list(credit.values())
    stats = {
        "credit/hires_available": float(len(hires)),
        "credit/hires_credited": float(len(credit)),
        "credit/skipped": float(skipped),
        "credit/extra_episodes": float(len(cf)),
        "credit/extra_tokens": float(sum(r.episode.total_tokens for r in cf)),
        "credit/seconds": time.perf_counter() - t0,
        "credit/difference_mean": sum(diffs) / len(diffs) if diffs else 0.0,
        "credit/helpful_share": sum(d > 0 for d in diffs) / len(diffs) if diffs else 0.0,
        "credit/harmful_share": sum(d < 0 for d in diffs) / len(diffs) if diffs else 0.0,
        "credit/replay_mismatch": float(wrapped.mismatch),
    }
    return credit, stats


__all__ = ["Hire", "ReplayThenSample", "counterfactual_credit", "find_hires", "without_hire"]
