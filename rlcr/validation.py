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
        failures.append(
            ExpectationFailure(
                expectation=r.expectation_config.type,
                column=r.expectation_config.kwargs.get("column"),
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
