"""Bring your own data: a JSONL file of `{"question": ..., "answer": ...}` rows (GSM8K style).

A GSM8K answer `... #### 42` is reduced to `42`. Rows that cannot be used (bad UTF-8, bad JSON,
missing or non-string fields, empty question or answer) are rejected with their 1-based line number
and reason and kept in `rejected`; the prepare stage counts them and fails above its threshold.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from rlcr.tasks.base import Task, normalise_text, parse_number, task_id
from rlcr.tasks.math_answers import is_math, math_equal


def extract_answer(answer: str) -> str:
    """GSM8K keeps the final answer after `####`; other files give it plainly."""
    return answer.split("####")[-1].strip() if "####" in answer else answer.strip()


def read_rows(path: Path) -> tuple[list[tuple[int, str, str]], list[tuple[int, str]]]:
    """(good rows as (line, question, answer), rejected rows as (line, reason))."""
    good, bad = [], []
    for line_no, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            bad.append((line_no, "not valid UTF-8"))
            continue
        except json.JSONDecodeError as e:
            bad.append((line_no, f"bad JSON: {e.msg}"))
            continue
        if not isinstance(row, dict):
            bad.append((line_no, "not a JSON object"))
            continue
        missing = [k for k in ("question", "answer") if k not in row]
        if missing:
            bad.append((line_no, f"missing field {missing[0]!r}"))
            continue
        q, a = row["question"], row["answer"]
        if isinstance(a, int | float) and not isinstance(a, bool):
            a = str(a)
        if not isinstance(q, str) or not isinstance(a, str):
            bad.append((line_no, "question and answer must be strings"))
            continue
        if not q.strip() or not extract_answer(a):
            bad.append((line_no, "empty question or answer"))
            continue
        good.append((line_no, q.strip(), extract_answer(a)))
    return good, bad


@dataclass
class JsonlFamily:
    """Tasks from a user's JSONL file; generate() draws a seeded shuffle of its good rows."""

    name: str
    path: str = ""
    kind: str = "math"
    rejected: list[tuple[int, str]] = field(default_factory=list)
    n_rows: int = 0

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError(f"{self.name}: options.path is required")
        p = Path(self.path)
        if not p.is_file():
            raise ValueError(f"{self.name}: file not found: {p}")
        self._rows, self.rejected = read_rows(p)
        self.n_rows = len(self._rows) + len(self.rejected)

    @property
    def pool_size(self) -> int:
        return len(self._rows)

    def generate(self, seed: int, n: int, difficulty: int) -> list[Task]:
        rows = list(self._rows)
        random.Random(f"{self.name}:{seed}").shuffle(rows)
        return [
            Task(
                id=task_id(self.name, seed, i, q),
                family=self.name,
                kind="math" if parse_number(a) is not None else "text",
                difficulty=difficulty,
                prompt=q,
                answer=a,
                meta={"line": line},
            )
            for i, (line, q, a) in enumerate(rows[:n])
        ]

    def verify(self, task: Task, answer: str) -> float:
        return verify_imported(task, answer)


def verify_imported(task: Task, answer: str) -> float:
    """Math answers (a number, `1/2`, `\\frac{1}{2}`) compare by value (`rlcr.tasks.math_answers`:
    math-verify); other answers by case- and whitespace-insensitive text."""
    if not isinstance(answer, str):
        return 0.0
    if is_math(task.answer):
        return 1.0 if math_equal(answer, task.answer) else 0.0
    return 1.0 if normalise_text(answer) == normalise_text(task.answer) and answer.strip() else 0.0
