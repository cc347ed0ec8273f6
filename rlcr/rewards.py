"""Rewards: pure functions of an episode record and the task's verifier.

Nothing here reads what agents *claim* (an "it's correct!" on the board is just text): a number only
pays when the task's verifier, or the family's sub-problem verifier, says it is right.

collective (the method)
    R = outcome - token_cost * total_tokens / token_budget, the same for every agent, where outcome
    = verify(task, submitted answer) (0 when nothing was submitted) and total_tokens counts all
    generated tokens of the episode.
individual (ablation)
    Each agent is paid only for what it delivers itself:
    - the submitter gets the outcome of its submission;
    - any other agent gets 1 if its FINAL delivered value (see `delivered_value`; taken from its last
      accepted POST or WRITE that contains a number) is right for a verifiable unit that appears in
      its brief: a sub-problem of the task whose prompt occurs in the brief as a whole expression
      (checked with `verify_subproblem`), or the whole task (checked with `verify`);
    - else 0 (so families without sub-problems pay hires only for solving the whole task).
    minus token_cost * (the agent's own generated tokens) / token_budget. Only the final delivery
    counts, so spraying many guesses does not pay.
mixed (ablation)
    alpha * collective + (1 - alpha) * individual, per agent.

In every kind, an agent's reward is then lowered by malformed_cost times the share of its own turns
that were malformed (protocol errors: what it wrote was not a valid action for it).
"""

from __future__ import annotations

import json
import re

from rlcr.config import RewardConfig
from rlcr.org.protocol import MENTION
from rlcr.org.records import EpisodeRecord
from rlcr.tasks import SubProblem, Task, verify, verify_subproblem

_NUM = re.compile(r"[-+]?\d+(?:\.\d+)?")


def delivered_value(text: str) -> str | None:
    """The number a delivery states: the first number after the last `=`, else the last number.

    `@agentN` mentions are removed first, so `@agent0 68+57=125` states 125 and `125 @agent2` too.
    """
    s = MENTION.sub(" ", text)
    if "=" in s:
        m = _NUM.search(s.rsplit("=", 1)[1])
        return m.group(0) if m else None
    found = _NUM.findall(s)
    return found[-1] if found else None


def _compact(s: str) -> str:
    return "".join(s.split())


def occurs(expr: str, brief: str) -> bool:
    """`expr` occurs in `brief` as a whole expression: not glued to a longer number, and not negated
    by a minus sign just before it (`12-5` is not in `-12-5`, `68+57` is not in `168+57`, `-12-5` is
    in `68+57-12-5`)."""
    e, b = _compact(expr), _compact(brief)
    if not e:
        return False
    # a signed expression may follow a digit (`57-12-5` holds `-12-5`); an unsigned one may not
    before = r"(?<![.])" if e[0] in "+-" else r"(?<![\d.\-])"
    return re.search(before + re.escape(e) + r"(?![\d.])", b) is not None


def verifiable_units(task: Task, brief: str) -> list[SubProblem | Task]:
    """The sub-problems (and the whole task) whose prompt occurs in the brief."""
    units: list[SubProblem | Task] = [s for s in task.subproblems if occurs(s.prompt, brief)]
    if occurs(task.prompt, brief):
        units.append(task)
    return units


def final_deliveries(record: EpisodeRecord) -> dict[int, str]:
    """agent -> the value of its last accepted POST/WRITE that states a number."""
    out: dict[int, str] = {}
    for t in record.turns:
        for a in json.loads(t.actions):
            text = a["arg"] if a["kind"] == "POST" else a["body"] if a["kind"] == "WRITE" else None
            value = delivered_value(text) if text is not None else None
            if value is not None:
                out[t.agent] = value
    return out


def _outcome(record: EpisodeRecord, task: Task) -> float:
    ep = record.episode
    return float(verify(task, ep.answer)) if ep.submitted else 0.0


def _own_tokens(record: EpisodeRecord) -> dict[int, int]:
    out: dict[int, int] = {}
    for t in record.turns:
        out[t.agent] = out.get(t.agent, 0) + t.completion_tokens
    return out


def collective_reward(record: EpisodeRecord, token_cost: float = 0.0, budget: int = 1) -> float:
    task = record.episode.task_obj()
    return _outcome(record, task) - token_cost * record.episode.total_tokens / budget


def individual_rewards(record: EpisodeRecord, token_cost: float = 0.0, budget: int = 1) -> dict[int, float]:
    ep = record.episode
    task = ep.task_obj()
    delivered = final_deliveries(record)
    tokens = _own_tokens(record)
    out: dict[int, float] = {}
    for member in ep.org():
        i = member["agent"]
        if i == ep.submitter:
            r = _outcome(record, task)
        elif i in delivered and member["parent"] >= 0:
            units = verifiable_units(task, member["brief"])
            r = max((verify_subproblem(u, delivered[i]) if isinstance(u, SubProblem) else verify(task, delivered[i])
                     for u in units), default=0.0)
        else:
            r = 0.0
        out[i] = float(r) - token_cost * tokens.get(i, 0) / budget
    return out


def malformed_shares(record: EpisodeRecord) -> dict[int, float]:
    """agent -> the share of its turns that were malformed (agents without turns: absent)."""
    turns: dict[int, list[bool]] = {}
    for t in record.turns:
        turns.setdefault(t.agent, []).append(bool(t.malformed))
    return {a: sum(m) / len(m) for a, m in turns.items()}


def agent_rewards(record: EpisodeRecord, cfg: RewardConfig, budget: int) -> dict[int, float]:
    """Every org member's reward under the configured kind, minus its malformed-turn cost."""
    members = [m["agent"] for m in record.episode.org()]
    coll = collective_reward(record, cfg.token_cost, budget)
    if cfg.kind == "collective":
        out = {i: coll for i in members}
    elif cfg.kind == "individual":
        out = individual_rewards(record, cfg.token_cost, budget)
    else:
        ind = individual_rewards(record, cfg.token_cost, budget)
        out = {i: cfg.alpha * coll + (1.0 - cfg.alpha) * ind[i] for i in members}
    if cfg.malformed_cost:
        shares = malformed_shares(record)
        out = {i: r - cfg.malformed_cost * shares.get(i, 0.0) for i, r in out.items()}
    return out


def assign_rewards(record: EpisodeRecord, cfg: RewardConfig, budget: int) -> dict[int, float]:
    """Write the rewards into the record (turn.reward, episode.reward = mean, episode.agent_rewards)."""
    r = agent_rewards(record, cfg, budget)
    for t in record.turns:
        t.reward = r[t.agent]
    record.episode.agent_rewards = json.dumps({str(k): v for k, v in sorted(r.items())})
    record.episode.reward = sum(r.values()) / len(r)
    return r
