"""great-expectations suites for the data the pipeline writes, and one way to run them.

`validate_frame` runs a suite on a pandas frame in an ephemeral GX context and returns a report that
names every failing expectation and the ids of the rows that broke it; `require_valid` raises with
that report. Stages validate BEFORE writing their outs, so a failing suite leaves nothing behind that
a later stage could mistake for good data.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from rlcr.tasks.base import KINDS

MAX_ROWS_NAMED = 20


class DataValidationError(ValueError):
    """A frame failed its suite; the message lists the failing expectations and rows."""

    def __init__(self, report: ValidationReport):
        self.report = report
        super().__init__(report.describe())


@dataclass
class ExpectationFailure:
    expectation: str
    column: str | None
    unexpected_count: int
    row_ids: list[str] = field(default_factory=list)

    def describe(self) -> str:
        where = f"[{self.column}]" if self.column else ""
        rows = f"; rows: {', '.join(self.row_ids[:MAX_ROWS_NAMED])}" if self.row_ids else ""
        more = f" (+{len(self.row_ids) - MAX_ROWS_NAMED} more)" if len(self.row_ids) > MAX_ROWS_NAMED else ""
        return f"{self.expectation}{where}: {self.unexpected_count} unexpected{rows}{more}"


@dataclass
class ValidationReport:
    suite: str
    n_rows: int
    evaluated: int
    failures: list[ExpectationFailure]

    @property
    def success(self) -> bool:
        return not self.failures

    def describe(self) -> str:
        head = f"suite {self.suite!r} on {self.n_rows} rows: {len(self.failures)} of {self.evaluated} expectations failed"
        return "\n  ".join([head, *(f.describe() for f in self.failures)])


def _gx():
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx

    return gx


def validate_frame(frame: pd.DataFrame, suite_name: str, expectations: list[Any], id_column: str) -> ValidationReport:
    """Run expectations on the frame; failures carry the `id_column` values of offending rows."""
    gx = _gx()
    context = gx.get_context(mode="ephemeral")
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = context.data_sources.add_pandas(f"{suite_name}_source").add_dataframe_asset(suite_name)
    batch = asset.add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame})
    suite = gx.ExpectationSuite(name=suite_name)
    for e in expectations:
        suite.add_expectation(e)
    result = batch.validate(
        suite, result_format={"result_format": "COMPLETE", "unexpected_index_column_names": [id_column]}
    )
    failures = []
    for r in result.results:
        if r.success:
            continue
        res = r.result or {}
        ids = [str(row.get(id_column)) for row in res.get("unexpected_index_list") or [] if isinstance(row, dict)]
        kw = r.expectation_config.kwargs
        failures.append(
            ExpectationFailure(
                expectation=r.expectation_config.type,
                column=kw.get("column") or (f"{kw['column_A']},{kw['column_B']}" if "column_A" in kw else None),
                unexpected_count=int(res.get("unexpected_count") or 0),
                row_ids=ids,
            )
        )
    return ValidationReport(suite_name, len(frame), len(result.results), failures)


def require_valid(report: ValidationReport) -> ValidationReport:
    if not report.success:
        raise DataValidationError(report)
    return report


# ------------------------------------------------------------------------------------------ tasks


def task_expectations(columns: list[str], families: list[str], max_prompt_chars: int) -> list[Any]:
    """Schema, nulls, ranges, unique ids and prompts (train and eval share no prompt), JSON columns."""
    E = _gx().expectations
    exps: list[Any] = [E.ExpectTableColumnsToMatchOrderedList(column_list=columns)]
    exps += [E.ExpectColumnValuesToNotBeNull(column=c) for c in columns]
    exps += [
        E.ExpectColumnValuesToBeUnique(column="id"),
        # one frame holds both splits, so a unique prompt is the disjointness check
        E.ExpectColumnValuesToBeUnique(column="prompt"),
        E.ExpectColumnValuesToBeInSet(column="split", value_set=["train", "eval"]),
        E.ExpectColumnValuesToBeInSet(column="kind", value_set=list(KINDS)),
        E.ExpectColumnValuesToBeInSet(column="family", value_set=sorted(families)),
        E.ExpectColumnValuesToBeBetween(column="difficulty", min_value=1, max_value=100),
        E.ExpectColumnValueLengthsToBeBetween(column="prompt", min_value=1, max_value=max_prompt_chars),
        E.ExpectColumnValueLengthsToBeBetween(column="answer", min_value=1),
        E.ExpectColumnValuesToBeJsonParseable(column="subproblems"),
        E.ExpectColumnValuesToBeJsonParseable(column="meta"),
    ]
    return exps


def validate_tasks(train: pd.DataFrame, evals: pd.DataFrame, families: list[str], max_prompt_chars: int) -> ValidationReport:
    from rlcr.tasks.suite import COLUMNS

    both = pd.concat([train, evals], ignore_index=True)
    return validate_frame(both, "tasks", task_expectations(COLUMNS, families, max_prompt_chars), "id")


def report_json(report: ValidationReport) -> str:
    return json.dumps(
        {"suite": report.suite, "rows": report.n_rows, "success": report.success,
         "failures": [f.__dict__ for f in report.failures]},
        indent=2,
    )


# --------------------------------------------------------------------------------------- rollouts


def rollout_expectations(table: str, columns: list[str], org: Any, reward: Any, mode: str,
                         episode_ids: list[str] | None = None) -> list[Any]:
    """The suite of one rollout table ("episodes" or "turns"), on the columns `records.py` writes plus
    the derived check columns `rollout_check_frames` adds (turns_found; turn_id, n_logprobs,
    n_token_ids, logprobs_finite, logprob_max, context_used)."""
    E = _gx().expectations
    exps: list[Any] = [E.ExpectTableColumnsToMatchOrderedList(column_list=columns)]
    exps += [E.ExpectColumnValuesToNotBeNull(column=c) for c in columns]
    # rewards: outcome in [0, 1] minus at most token_cost (the budget is never exceeded) and malformed_cost
    low = -float(reward.token_cost) - float(reward.malformed_cost)
    exps.append(E.ExpectColumnValuesToBeBetween(column="reward", min_value=low, max_value=1.0))
    if table == "episodes":
        exps += [
            E.ExpectColumnValuesToBeUnique(column="episode_id"),
            E.ExpectColumnValuesToBeBetween(column="outcome", min_value=0.0, max_value=1.0),
            E.ExpectColumnValuesToBeInSet(column="mode", value_set=[mode]),
            E.ExpectColumnValuesToBeInSet(column="end_reason", value_set=["submit", "max_rounds", "budget", "idle"]),
            E.ExpectColumnValuesToBeBetween(column="rounds", min_value=1, max_value=org.max_rounds),
            E.ExpectColumnValuesToBeBetween(column="n_agents", min_value=1,
                                            max_value=1 if mode == "single" else org.max_agents),
            E.ExpectColumnValuesToBeBetween(column="total_tokens", min_value=1),
            E.ExpectColumnValuesToBeBetween(column="critical_path_tokens", min_value=1),
            E.ExpectColumnValuesToBeBetween(column="budget_used", min_value=1, max_value=org.token_budget),
            E.ExpectColumnPairValuesAToBeGreaterThanB(column_A="total_tokens", column_B="critical_path_tokens",
                                                      or_equal=True),
            # one outcome per episode: every episode's turns are in the turn table, and no others
            E.ExpectColumnPairValuesToBeEqual(column_A="n_turns", column_B="turns_found"),
            E.ExpectColumnValuesToBeBetween(column="n_turns", min_value=1),
        ]
    else:
        exps += [
            E.ExpectColumnValuesToBeUnique(column="turn_id"),
            E.ExpectColumnValuesToBeInSet(column="episode_id", value_set=sorted(episode_ids or [])),
            E.ExpectColumnValuesToBeInSet(column="role", value_set=["ceo", *([] if mode == "single" else org.roles)]),
            E.ExpectColumnValuesToBeBetween(column="completion_tokens", min_value=1, max_value=org.max_turn_tokens),
            E.ExpectColumnValuesToBeBetween(column="prompt_tokens", min_value=1),
            E.ExpectColumnPairValuesAToBeGreaterThanB(column_A="max_new_tokens", column_B="completion_tokens",
                                                      or_equal=True),
            E.ExpectColumnValuesToBeBetween(column="context_used", min_value=2, max_value=org.context_tokens),
            E.ExpectColumnPairValuesToBeEqual(column_A="n_logprobs", column_B="completion_tokens"),
            E.ExpectColumnPairValuesToBeEqual(column_A="n_token_ids", column_B="completion_tokens"),
            E.ExpectColumnValuesToBeInSet(column="logprobs_finite", value_set=[True]),
            E.ExpectColumnValuesToBeBetween(column="logprob_max", max_value=1e-4),
        ]
    return exps


def rollout_check_frames(episodes: pd.DataFrame, turns: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Copies of the two tables with the derived columns the suites check (computed, never stored)."""
    import math

    def floats(text: Any) -> list[float] | None:
        try:
            v = json.loads(text) if isinstance(text, str) and text else None
        except ValueError:
            return None
        return [float(x) for x in v] if isinstance(v, list) and all(isinstance(x, int | float) for x in v) else None

    eps, tns = episodes.copy(), turns.copy()
    counts = tns["episode_id"].value_counts()
    eps["turns_found"] = eps["episode_id"].map(counts).fillna(0).astype("int64")
    tns["turn_id"] = tns["episode_id"].astype(str) + "/r" + tns["round"].astype(str) + "/a" + tns["agent"].astype(str)
    lps = [floats(x) for x in tns["logprobs"]]
    ids = [floats(x) for x in tns["token_ids"]]
    tns["n_logprobs"] = pd.Series([len(v) if v is not None else -1 for v in lps], index=tns.index, dtype="int64")
    tns["n_token_ids"] = pd.Series([len(v) if v is not None else -1 for v in ids], index=tns.index, dtype="int64")
    tns["logprobs_finite"] = pd.Series([v is not None and all(math.isfinite(x) for x in v) for v in lps],
                                       index=tns.index, dtype="bool")
    tns["logprob_max"] = pd.Series([max(v) if v and all(math.isfinite(x) for x in v) else 0.0 for v in lps],
                                   index=tns.index, dtype="float64")
    tns["context_used"] = tns["prompt_tokens"] + tns["completion_tokens"]
    return eps, tns


def validate_rollouts(episodes: pd.DataFrame, turns: pd.DataFrame, org: Any, reward: Any, mode: str) -> ValidationReport:
    """Both rollout tables against their suites; one report, failing columns named `table.column`,
    offending rows by episode id (episodes) or `<episode id>/r<round>/a<agent>` (turns)."""
    import dataclasses

    from rlcr.org.records import EpisodeRow, TurnRow

    eps, tns = rollout_check_frames(episodes, turns)
    # the schema is records.py's, whatever the frames hold; derived columns follow it
    e_cols = [f.name for f in dataclasses.fields(EpisodeRow)]
    t_cols = [f.name for f in dataclasses.fields(TurnRow)]
    reports = [
        ("episodes", validate_frame(eps, "rollout_episodes",
                                    rollout_expectations("episodes", [*e_cols, "turns_found"], org, reward, mode),
                                    "episode_id")),
        ("turns", validate_frame(tns, "rollout_turns",
                                 rollout_expectations("turns", [*t_cols, *[c for c in tns.columns if c not in turns.columns]],
                                                      org, reward, mode, episodes["episode_id"].astype(str).tolist()),
                                 "turn_id")),
    ]
    failures = []
    for table, rep in reports:
        for f in rep.failures:
            f.column = f"{table}.{f.column}" if f.column else table
            failures.append(f)
    return ValidationReport("rollout", len(episodes) + len(turns), sum(r.evaluated for _, r in reports), failures)
