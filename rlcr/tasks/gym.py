"""Adapter over reasoning-gym: its generators become task families, its scorers their verifiers.

The whole reasoning-gym entry (question, answer, metadata) is stored in the task's `meta`, so a
stored task is scored later with no generator state. On top of the dataset's own scorer, a numeric
reference also accepts any numerically equal answer (`42` vs `42.0`), and surrounding whitespace
never matters. Scorers that raise on odd answers (some parse with int()) score 0 instead.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from typing import Any

from rlcr.tasks.base import Task, parse_number, task_id
from rlcr.tasks.math_answers import math_equal


def _rg():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import reasoning_gym

    return reasoning_gym


@dataclass(frozen=True)
class ReasoningGymFamily:
    """One reasoning-gym dataset; `config` goes to its dataset config (difficulty knobs live there)."""

    dataset: str
    config: dict[str, Any] = field(default_factory=dict)
    kind: str = "text"

    @property
    def name(self) -> str:
        return f"rg/{self.dataset}"

    def __post_init__(self) -> None:
        from reasoning_gym.factory import DATASETS

        if self.dataset not in DATASETS:
            raise ValueError(f"unknown reasoning-gym dataset {self.dataset!r}")

    def generate(self, seed: int, n: int, difficulty: int) -> list[Task]:
        data = _rg().create_dataset(self.dataset, size=n, seed=seed, **self.config)
        tasks = []
        for i in range(n):
            entry = json.loads(json.dumps(data[i], default=str))
            prompt = str(entry["question"])
            answer = str(entry["answer"])
            tasks.append(
                Task(
                    id=task_id(self.name, seed, i, prompt),
                    family=self.name,
                    kind="math" if parse_number(answer) is not None else "text",
                    difficulty=difficulty,
                    prompt=prompt,
                    answer=answer,
                    meta={"rg_dataset": self.dataset, "entry": entry},
                )
            )
        return tasks

    def verify(self, task: Task, answer: str) -> float:
        return verify_entry(task, answer)


def verify_entry(task: Task, answer: str) -> float:
    """Dataset scorer on the stored entry, plus, for a numeric answer, equality by value
    (`rlcr.tasks.math_answers`: `3.5` = `7/2` = `\\frac{7}{2}`); never raises."""
    if not isinstance(answer, str):
        return 0.0
    answer = answer.strip()
    if parse_number(task.answer) is not None and math_equal(answer, task.answer):
        return 1.0
    try:
        score = _rg().get_score_answer_fn(task.meta["rg_dataset"])(answer, task.meta["entry"])
        score = float(score)
    except Exception:  # noqa: BLE001 - a scorer's crash on a hostile answer is a wrong answer
        return 0.0
    return min(1.0, max(0.0, score)) if score == score else 0.0
