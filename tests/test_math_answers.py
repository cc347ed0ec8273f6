"""Math answers by value through math-verify (rlcr/tasks/math_answers.py): equivalent forms pass,
wrong ones and guesses among several fail, hostile ones fail fast; the built-in sums are untouched."""

from __future__ import annotations

import json
import threading
import time

import pytest

from rlcr.tasks import build_family, verify
from rlcr.tasks.math_answers import is_math, math_equal


@pytest.mark.parametrize("reference,answer", [
    ("0.5", "1/2"), ("0.5", "\\frac{1}{2}"), ("0.5", "$\\frac{1}{2}$"), ("0.5", "\\boxed{0.5}"), ("0.5", "2/4"),
    ("0.5", ".5"), ("3.5", "7/2"), ("1/2", "0.5"), ("\\frac{1}{2}", "1/2"), ("42", "42.0"), ("42", "4.2e1"),
    ("42", "84/2"), ("-7", " -7 "), ("2", "\\sqrt{4}"), ("1000", "1,000"), ("42", "42."),
])
def test_equivalent_forms_are_right(reference, answer):
    assert math_equal(answer, reference)


@pytest.mark.parametrize("reference,answer", [
    ("42", "43"), ("42", "3 or 42"), ("42", "42 or 3"), ("42", "42x"), ("42", "x=42"), ("42", "41.99999"),
    ("42", "forty-two"), ("42", ""), ("42", "   "), ("0.5", "0.51"), ("1/3", "0.3333"), ("42", "(42"),
    ("42", "\\boxed{42"), ("42", "42" * 40),
])
def test_wrong_forms_and_guesses_among_several_are_wrong(reference, answer):
    assert not math_equal(answer, reference)


def test_hostile_answers_fail_fast_and_never_raise():
    t0 = time.perf_counter()
    for answer in ("9^9^9^9^9", "\\frac{1}{0}", "1/0", "\\sqrt{-1}", "}{", "\\frac{", "$$", "\x00\x01", None, 42):
        assert not math_equal(answer, "42")
    assert time.perf_counter() - t0 < 10


def test_off_the_main_thread_only_plain_numbers_compare():
    seen = {}
    worker = threading.Thread(target=lambda: seen.update(fraction=math_equal("1/2", "0.5"), plain=math_equal("0.50", "0.5")))
    worker.start()
    worker.join()
    assert seen == {"fraction": False, "plain": True}  # math-verify's timeouts need the main thread


def test_which_references_are_math():
    assert is_math("42") and is_math("1/2") and is_math("\\frac{3}{4}")
    assert not is_math("Paris") and not is_math("3 apples") and not is_math("")


def test_jsonl_and_reasoning_gym_answers_use_it(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"question": "Half of one?", "answer": "1/2"}, {"question": "Capital of France?", "answer": "Paris"},
            {"question": "Six times seven?", "answer": "#### 42"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = {t.prompt: t for t in build_family("jsonl/mine", {"path": str(path)}).generate(0, 3, 1)}
    half, paris, six = tasks["Half of one?"], tasks["Capital of France?"], tasks["Six times seven?"]
    assert verify(half, "0.5") == verify(half, "\\frac{1}{2}") == verify(half, "1/2") == 1.0
    assert verify(half, "1/3") == verify(half, "0.5 or 1") == 0.0
    assert verify(paris, " paris ") == 1.0 and verify(paris, "Lyon") == 0.0
    assert verify(six, "\\boxed{42}") == verify(six, "42.0") == 1.0 and verify(six, "41") == 0.0

    task = next(t for t in build_family("rg/decimal_chain_sum").generate(0, 20, 1) if "." in t.answer)
    value, places = float(task.answer), len(task.answer.split(".")[1])
    assert verify(task, f"${task.answer}$") == 1.0
    assert verify(task, f"{round(value * 10 ** places)}/{10 ** places}") == 1.0  # the same value as a fraction
    assert verify(task, f"{value + 1}") == 0.0


def test_the_built_in_sums_grade_as_before():
    """Integers compared exactly, as before math-verify: forms only math-verify reads stay wrong."""
    (task,) = build_family("sum").generate(0, 1, 2)
    assert verify(task, task.answer) == verify(task, f" {task.answer}.0 ") == 1.0
    for other in (f"\\boxed{{{task.answer}}}", f"{int(task.answer) * 2}/2", f"${task.answer}$"):
        assert verify(task, other) == 0.0
