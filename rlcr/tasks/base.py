"""The task interface every family implements, and answer matching shared by the verifiers.

A task is a frozen record: the prompt the CEO sees, the reference answer, and, for decomposable
families, a tree of sub-problems whose answers are known (so a hire's own result can be verified
and a verifier has something real to check). Families turn (seed, n, difficulty) into tasks and
score an answer string in [0, 1].
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol

KINDS = ("math", "text", "code")


@dataclass(frozen=True)
class SubProblem:
    """One independently verifiable part of a task."""

    prompt: str
    answer: str


@dataclass(frozen=True)
class Task:
    """One problem as the pipeline stores it (one parquet row)."""

    id: str
    family: str
    kind: str
    difficulty: int
    prompt: str
    answer: str
    subproblems: tuple[SubProblem, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)

    def to_row(self) -> dict[str, Any]:
        """Flat, JSON-string columns: stable bytes in parquet, easy to validate."""
        return {
            "id": self.id,
            "family": self.family,
            "kind": self.kind,
            "difficulty": int(self.difficulty),
            "prompt": self.prompt,
            "answer": self.answer,
            "subproblems": json.dumps([[s.prompt, s.answer] for s in self.subproblems]),
            "meta": json.dumps(self.meta, sort_keys=True),
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Task:
        subs = tuple(SubProblem(p, a) for p, a in json.loads(row["subproblems"]))
        return cls(
            id=str(row["id"]),
            family=str(row["family"]),
            kind=str(row["kind"]),
            difficulty=int(row["difficulty"]),
            prompt=str(row["prompt"]),
            answer=str(row["answer"]),
            subproblems=subs,
            meta=json.loads(row["meta"]),
        )


class TaskFamily(Protocol):
    """What the registry needs from a family."""

    name: str
    kind: str

    def generate(self, seed: int, n: int, difficulty: int) -> list[Task]:
        """n tasks, a pure function of (seed, n, difficulty) and the family's options."""
        ...

    def verify(self, task: Task, answer: str) -> float:
        """Score in [0, 1]; never raises on any answer string."""
        ...


_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def parse_number(text: str) -> Decimal | None:
    """A number written in any of the plain ways (`42`, ` 42.0 `, `+42`, `4.2e1`, `1,234`), else None.

    Thousands separators are accepted only in groups of three, so `1,2` is not 12.
    """
    if not isinstance(text, str):
        return None
    s = text.strip().rstrip(".").strip()
    if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?", s):
        s = s.replace(",", "")
    if not _NUMBER.fullmatch(s):
        return None
    try:
        value = Decimal(s)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def numbers_equal(answer: str, reference: str) -> bool:
    """True when both parse as numbers and are equal (42 == 42.0 == 4.2e1)."""
    a, r = parse_number(answer), parse_number(reference)
    return a is not None and r is not None and a == r


def normalise_text(text: str) -> str:
    """Case- and whitespace-insensitive form for short free-text answers."""
    return " ".join(str(text).split()).casefold()


def task_id(family: str, seed: int, index: int, prompt: str) -> str:
    """Stable id: family, seed, position and a short hash of the prompt (so edits change it)."""
    import hashlib

    digest = hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:8]
    return f"{family}-{seed}-{index}-{digest}"
