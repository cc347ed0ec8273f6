"""Episode records: the flat schema every later stage reads (training, rewards, behaviour, reports).

Two tables, both flat (scalars and JSON strings only, so parquet round-trips them exactly):

TURNS, one row per agent turn
    episode_id, task_id     which episode, which task
    round                   1-based round of the episode
    agent, role, parent     agent index (agent0 is the CEO), its role, who hired it (-1 for the CEO)
    depth                   0 for the CEO, parent's depth + 1 for a hire
    prompt, completion      exactly the text the policy saw and produced (completion after the
                            scheduler's cut to max_new_tokens, if any), so logprobs can be recomputed
    actions                 JSON list of {kind, arg, body}: the parsed actions that were accepted
    errors                  JSON list of error messages shown to the agent next round
    n_actions, n_errors
    malformed               the turn had a protocol error (unknown action, bad arguments, no action,
                            too many actions); the malformed-action rate counts these
    events                  JSON list of what the environment did with each action, e.g.
                            {"kind": "READ", "path": "a.txt", "author": 2, "version": 1},
                            {"kind": "POST", "post": 7, "mentions": [0]}, {"kind": "HIRE", "agent": 5},
                            {"kind": "WRITE", "path": "a.txt"}, {"kind": "SUBMIT", "answer": "204"},
                            and {"kind": ..., "refused": "why"} for actions the environment refused
    prompt_tokens, completion_tokens   as the policy reported them, else the length function's count
    max_new_tokens          what this turn was allowed to generate
    finish_reason           the policy's ("stop", "length", ...) or "cut" when the scheduler cut it
    token_ids, logprobs     JSON lists when the policy returned them, else ""
    batch_seconds           wall seconds of the round's single batched policy call (shared)
    env_seconds             wall seconds the environment spent on this turn (parse + apply)
    reward                  this agent's reward for the episode (same for all agents if collective)

EPISODES, one row per episode
    episode_id, task_id, family, task (JSON of Task.to_row(), so rewards are pure over the record)
    mode                    "company" or "single"
    outcome                 the task verifier's score of the submitted answer (0 if none)
    reward                  mean of the agents' rewards under the configured reward
    agent_rewards           JSON {agent index: reward}
    submitted, answer, submitter (-1 if nobody submitted)
    end_reason              submit | max_rounds | budget | idle (nobody left to act)
    truncated               ended by max_rounds or budget
    rounds, n_agents, max_depth, n_turns, malformed_turns
    org_chart               JSON list of {agent, role, parent, depth, brief, round (joined)}
    critical_path_tokens    sum over rounds of the longest generation of that round (modelled time)
    total_tokens            all generated tokens of all agents
    prompt_tokens           all observation tokens
    budget_used             tokens charged to the org's budget
    seconds                 real wall seconds of the episode's rounds (shared batch time included)
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from rlcr.tasks.base import Task


@dataclass
class TurnRow:
    episode_id: str
    task_id: str
    round: int
    agent: int
    role: str
    parent: int
    depth: int
    prompt: str
    completion: str
    actions: str = "[]"
    errors: str = "[]"
    n_actions: int = 0
    n_errors: int = 0
    malformed: bool = False
    events: str = "[]"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    max_new_tokens: int = 0
    finish_reason: str = ""
    token_ids: str = ""
    logprobs: str = ""
    batch_seconds: float = 0.0
    env_seconds: float = 0.0
    reward: float = 0.0

    def action_list(self) -> list[dict[str, str]]:
        return json.loads(self.actions)

    def event_list(self) -> list[dict[str, Any]]:
        return json.loads(self.events)


@dataclass
class EpisodeRow:
    episode_id: str
    task_id: str
    family: str
    task: str
    mode: str = "company"
    outcome: float = 0.0
    reward: float = 0.0
    agent_rewards: str = "{}"
    submitted: bool = False
    answer: str = ""
    submitter: int = -1
    end_reason: str = ""
    truncated: bool = False
    rounds: int = 0
    n_agents: int = 1
    max_depth: int = 0
    n_turns: int = 0
    malformed_turns: int = 0
    org_chart: str = "[]"
    critical_path_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens: int = 0
    budget_used: int = 0
    seconds: float = 0.0

    def task_obj(self) -> Task:
        return Task.from_row(json.loads(self.task))

    def org(self) -> list[dict[str, Any]]:
        return json.loads(self.org_chart)


@dataclass
class EpisodeRecord:
    """One episode: its summary row and its turns in (round, agent) order."""

    episode: EpisodeRow
    turns: list[TurnRow] = field(default_factory=list)


_PANDAS = {int: "int64", float: "float64", bool: "bool", str: "str"}


def _frame(rows: list[Any], cls: type) -> pd.DataFrame:
    hints = {f.name: f.type for f in dataclasses.fields(cls)}
    types = {k: {"int": int, "float": float, "bool": bool, "str": str}[v] if isinstance(v, str) else v for k, v in hints.items()}
    data = {k: [getattr(r, k) for r in rows] for k in hints}
    return pd.DataFrame({k: pd.Series(v, dtype=_PANDAS[types[k]]) for k, v in data.items()})


def to_frames(records: list[EpisodeRecord]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(turns, episodes) DataFrames with fixed dtypes, also for an empty list."""
    turns = [t for r in records for t in r.turns]
    return _frame(turns, TurnRow), _frame([r.episode for r in records], EpisodeRow)


def _rows(df: pd.DataFrame, cls: type) -> list[Any]:
    names = [f.name for f in dataclasses.fields(cls)]
    missing = [n for n in names if n not in df.columns]
    if missing:
        raise ValueError(f"{cls.__name__}: columns missing from the table: {missing}")
    cols = {n: df[n].tolist() for n in names}
    return [cls(**{n: cols[n][i] for n in names}) for i in range(len(df))]


def from_frames(turns: pd.DataFrame, episodes: pd.DataFrame) -> list[EpisodeRecord]:
    """Records back from the two tables (the inverse of `to_frames`)."""
    by_ep: dict[str, list[TurnRow]] = {}
    for t in _rows(turns, TurnRow):
        by_ep.setdefault(t.episode_id, []).append(t)
    return [EpisodeRecord(e, by_ep.get(e.episode_id, [])) for e in _rows(episodes, EpisodeRow)]


def write_parquet(records: list[EpisodeRecord], turns_path: str | Path, episodes_path: str | Path) -> None:
    turns, episodes = to_frames(records)
    turns.to_parquet(turns_path, index=False)
    episodes.to_parquet(episodes_path, index=False)


def read_parquet(turns_path: str | Path, episodes_path: str | Path) -> list[EpisodeRecord]:
    return from_frames(pd.read_parquet(turns_path), pd.read_parquet(episodes_path))
