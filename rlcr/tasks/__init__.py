"""Task families and their registry.

Family names: `sum`, `signed_sum` (built in, decomposable), `rg/<dataset>` (reasoning-gym),
`jsonl/<name>` (a user's `{question, answer}` file), `humaneval` (code tasks), `canary` (impossible code
tasks: passing one means the grader was gamed, `rlcr.tasks.canary`).
`verify(task, answer)` scores any stored task from the task alone, so rollouts and rewards never
need the generator's options.
"""

from __future__ import annotations

from typing import Any

from rlcr.tasks.arithmetic import SumFamily, verify_subproblem
from rlcr.tasks.base import SubProblem, Task, TaskFamily, numbers_equal, parse_number

BUILTIN = {
    "sum": lambda **o: SumFamily(name="sum", signed=False, **o),
    "signed_sum": lambda **o: SumFamily(name="signed_sum", signed=True, **o),
}


def build_family(name: str, options: dict[str, Any] | None = None) -> TaskFamily:
    """The family object for a registry name; unknown names and options fail with the name."""
    options = dict(options or {})
    if name in BUILTIN:
        try:
            return BUILTIN[name](**options)
        except TypeError as e:
            raise ValueError(f"task family {name!r}: bad options {sorted(options)}: {e}") from None
    if name.startswith("rg/"):
        from rlcr.tasks.gym import ReasoningGymFamily

        return ReasoningGymFamily(dataset=name[3:], config=options)
    if name.startswith("jsonl/"):
        from rlcr.tasks.jsonl import JsonlFamily

        return JsonlFamily(name=name, **options)
    if name == "humaneval":
        from rlcr.tasks.humaneval import HumanEvalFamily

        return HumanEvalFamily(**options)
    if name == "canary":
        from rlcr.tasks.canary import CanaryFamily

        return CanaryFamily(**options)
    raise ValueError(
        f"unknown task family {name!r}: expected one of {sorted(BUILTIN)}, 'rg/<dataset>', "
        "'jsonl/<name>', 'humaneval' or 'canary'"
    )


def task_lines(task: Task) -> list[str]:
    """The task as the lines of its workspace file (`org.task_file`), so a brief can name a part of
    it by line numbers: one term per line for the sum families (`6`, `+5`, `-4`), else the prompt's
    own lines."""
    terms = task.meta.get("terms") if isinstance(task.meta, dict) else None
    if task.family in BUILTIN and isinstance(terms, list) and terms:
        return [str(terms[0])] + [f"+{t}" if t >= 0 else str(t) for t in terms[1:]]
    return str(task.prompt).split("\n")


def verify(task: Task, answer: str) -> float:
    """Score an answer to a stored task in [0, 1] using only what the task row carries."""
    if task.family in BUILTIN:
        return BUILTIN[task.family]().verify(task, answer)
    if task.family.startswith("rg/"):
        from rlcr.tasks.gym import verify_entry

        return verify_entry(task, answer)
    if task.family.startswith("jsonl/"):
        from rlcr.tasks.jsonl import verify_imported

        return verify_imported(task, answer)
    if task.family in ("humaneval", "canary"):  # a canary is graded exactly like HumanEval
        from rlcr.tasks.humaneval import verify_code

        return verify_code(task, answer)
    raise ValueError(f"task {task.id!r}: unknown family {task.family!r}")


__all__ = [
    "SubProblem",
    "Task",
    "TaskFamily",
    "build_family",
    "numbers_equal",
    "parse_number",
    "task_lines",
    "verify",
    "verify_subproblem",
]
