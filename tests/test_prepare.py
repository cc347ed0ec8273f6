"""The prepare stage's parts: deterministic splits, disjointness, GE catching corrupted frames."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlcr import io
from rlcr.config import FamilySpec, PrepareConfig
from rlcr.tasks.suite import COLUMNS, build_splits, from_frame
from rlcr.validation import DataValidationError, require_valid, validate_tasks

SMALL = PrepareConfig(
    seed=3,
    train=(FamilySpec("sum", 200, (1, 2)), FamilySpec("signed_sum", 50, (1,))),
    eval=(FamilySpec("sum", 20, (1, 2)), FamilySpec("rg/gcd", 5)),
)
FAMILIES = ["sum", "signed_sum", "rg/gcd"]


@pytest.fixture(scope="module")
def splits():
    return build_splits(SMALL)


def test_same_seed_byte_identical_parquet(tmp_path, splits):
    train, evals, _ = splits
    again_train, again_eval, _ = build_splits(SMALL)
    io.write_parquet(train, tmp_path / "a.parquet")
    io.write_parquet(again_train, tmp_path / "b.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert evals.equals(again_eval)


def test_other_seed_other_tasks(splits):
    other = PrepareConfig(seed=4, train=SMALL.train, eval=SMALL.eval)
    assert not build_splits(other)[0]["prompt"].equals(splits[0]["prompt"])


def test_eval_shares_no_prompt_with_train(splits):
    train, evals, report = splits
    assert not set(train["prompt"]) & set(evals["prompt"])
    assert train["prompt"].is_unique and evals["prompt"].is_unique
    # one-pair sums of two digits collide often: the drop is real, counted, and made up for
    assert report.overlap_dropped > 0
    assert (evals["family"] == "sum").sum() == 40


def test_schema_and_round_trip(splits):
    train, evals, _ = splits
    assert list(train.columns) == COLUMNS
    tasks = from_frame(evals)
    assert [t.to_row()["prompt"] for t in tasks] == list(evals["prompt"])
    assert all(t.subproblems for t in tasks if t.family == "sum")


def test_clean_frames_pass_the_suite(splits):
    train, evals, _ = splits
    report = validate_tasks(train, evals, FAMILIES, 4000)
    assert report.success, report.describe()


@pytest.mark.parametrize(
    "corrupt, expectation",
    [
        (lambda t, e: t.assign(prompt=t["prompt"].where(t.index != 3, e["prompt"].iloc[0])),
         "expect_column_values_to_be_unique"),
        (lambda t, e: t.assign(difficulty=t["difficulty"].where(t.index != 5, 0)),
         "expect_column_values_to_be_between"),
        (lambda t, e: t.assign(answer=t["answer"].where(t.index != 7, None)),
         "expect_column_values_to_not_be_null"),
        (lambda t, e: t.assign(meta=t["meta"].where(t.index != 2, "{not json")),
         "expect_column_values_to_be_json_parseable"),
        (lambda t, e: t.assign(family=t["family"].where(t.index != 4, "sums")),
         "expect_column_values_to_be_in_set"),
    ],
)
def test_suite_names_the_failing_expectation_and_row(splits, corrupt, expectation):
    train, evals, _ = splits
    bad = corrupt(train.copy(), evals)
    with pytest.raises(DataValidationError) as err:
        require_valid(validate_tasks(bad, evals, FAMILIES, 4000))
    failures = err.value.report.failures
    assert expectation in [f.expectation for f in failures]
    failed = next(f for f in failures if f.expectation == expectation)
    changed = bad.index[(bad != train).any(axis=1)][0]
    assert train["id"].iloc[changed] in failed.row_ids
    assert expectation in str(err.value)


def test_dropped_column_fails_schema(splits):
    train, evals, _ = splits
    report = validate_tasks(train.drop(columns=["meta"]), evals.drop(columns=["meta"]), FAMILIES, 4000)
    assert "expect_table_columns_to_match_ordered_list" in [f.expectation for f in report.failures]


def test_bad_jsonl_rows_are_rejected_by_id(tmp_path):
    good = [json.dumps({"question": f"q{i}?", "answer": str(i)}) for i in range(30)]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(good + ["{oops", '{"question": ""}']) + "\n")
    cfg = PrepareConfig(train=(FamilySpec("jsonl/mine", 10, options={"path": str(path)}),),
                        eval=(FamilySpec("sum", 5),))
    train, _, report = build_splits(cfg)
    assert len(train) == 10
    assert [r for r, _ in report.rejected] == ["jsonl/mine:line31", "jsonl/mine:line32"]
    assert report.worst_family() == ("jsonl/mine", pytest.approx(2 / 32))


def test_too_few_tasks_is_an_error_naming_the_family(tmp_path):
    path = Path(tmp_path / "d.jsonl")
    path.write_text(json.dumps({"question": "q?", "answer": "1"}) + "\n")
    cfg = PrepareConfig(train=(FamilySpec("jsonl/mine", 3, options={"path": str(path)}),),
                        eval=(FamilySpec("sum", 5),))
    with pytest.raises(ValueError, match="family 'jsonl/mine' difficulty 1: only 1 usable"):
        build_splits(cfg)
