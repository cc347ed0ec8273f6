"""Built-in families for the tiny default: multi-term sums that split into verifiable pair sums.

Why these: a tiny model learns `a+b` in minutes but not `a+b+c+d` answered directly (measured
on 2 cores), so a company that hands pairs to workers and adds their results has something real to
gain over a single agent, and a worker's residual error gives a verifier a real job.

A task with k terms carries its reduction tree as sub-problems: level one adds neighbouring terms in
pairs, each next level adds neighbouring results, until one number is left. Every node is a
two-operand problem with a known answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlcr.tasks.base import SubProblem, Task, numbers_equal, task_id


def _render(terms: list[int]) -> str:
    """`12+34-5`: the first term keeps its own sign, the others are joined by theirs."""
    out = str(terms[0])
    for t in terms[1:]:
        out += f"+{t}" if t >= 0 else f"-{-t}"
    return out


def reduction_tree(terms: list[int]) -> list[SubProblem]:
    """Pairwise reduction, level by level; an odd element is carried up unchanged."""
    subs: list[SubProblem] = []
    level = list(terms)
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level) - 1, 2):
            a, b = level[i], level[i + 1]
            subs.append(SubProblem(_render([a, b]), str(a + b)))
            nxt.append(a + b)
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return subs


@dataclass(frozen=True)
class SumFamily:
    """`difficulty + 1` terms of `digits` digits each; with `signed`, terms after the first may be negative."""

    name: str = "sum"
    digits: int = 2
    signed: bool = False
    kind: str = "math"

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 9:
            raise ValueError(f"{self.name}: digits must be in 1..9, got {self.digits}")

    def n_terms(self, difficulty: int) -> int:
        if difficulty < 1:
            raise ValueError(f"{self.name}: difficulty must be >= 1, got {difficulty}")
        return difficulty + 1

    def generate(self, seed: int, n: int, difficulty: int) -> list[Task]:
        k = self.n_terms(difficulty)
        rng = random.Random(f"{self.name}:{self.digits}:{self.signed}:{seed}:{difficulty}")
        lo, hi = 10 ** (self.digits - 1) if self.digits > 1 else 0, 10**self.digits - 1
        tasks = []
        for i in range(n):
            terms = [rng.randint(lo, hi) for _ in range(k)]
            if self.signed:
                terms = [terms[0]] + [t if rng.random() < 0.5 else -t for t in terms[1:]]
            prompt = _render(terms)
            tasks.append(
                Task(
                    id=task_id(self.name, seed, i, prompt),
                    family=self.name,
                    kind=self.kind,
                    difficulty=difficulty,
                    prompt=prompt,
                    answer=str(sum(terms)),
                    subproblems=tuple(reduction_tree(terms)),
                    meta={"terms": terms},
                )
            )
        return tasks

    def verify(self, task: Task, answer: str) -> float:
        return 1.0 if numbers_equal(answer, task.answer) else 0.0


def verify_subproblem(sub: SubProblem, answer: str) -> float:
    """A sub-problem is always a number; the same equivalences as the whole task."""
    return 1.0 if numbers_equal(answer, sub.answer) else 0.0
