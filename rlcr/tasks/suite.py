"""Build the train and eval splits from params: deterministic, disjoint, every row checked.

Disjointness is by prompt: eval draws candidates from its own seed and drops any whose prompt is in
train (or already drawn), drawing more until it has `n` or the family's pool is exhausted. Rows are
rejected, with their id and reason, when the prompt is empty or too long, or when the family's own
verifier does not give the reference answer full marks (a generator or a file that disagrees with
its scorer is a bad row, not a task).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from rlcr.config import FamilySpec, PrepareConfig
from rlcr.tasks import build_family
from rlcr.tasks.base import Task

EVAL_SEED_OFFSET = 1_000_003
COLUMNS = ["id", "split", "family", "kind", "difficulty", "prompt", "answer", "subproblems", "meta"]


@dataclass
class SplitReport:
    """What happened while building the splits: counts and every rejected row."""

    rejected: list[tuple[str, str]] = field(default_factory=list)
    """(row id, reason) for each row left out."""
    rows: dict[str, int] = field(default_factory=dict)
    """Input rows per family: lines of an imported file, or generated candidates."""
    bad: dict[str, int] = field(default_factory=dict)
    """Rejected rows per family."""
    overlap_dropped: int = 0
    """Eval candidates dropped because their prompt is in train."""

    def count(self, family: str, rows: int, rejected: list[tuple[str, str]]) -> None:
        self.rows[family] = self.rows.get(family, 0) + rows
        self.bad[family] = self.bad.get(family, 0) + len(rejected)
        self.rejected.extend(rejected)

    @property
    def input_rows(self) -> int:
        return sum(self.rows.values())

    @property
    def bad_fraction(self) -> float:
        return len(self.rejected) / max(self.input_rows, 1)

    def worst_family(self) -> tuple[str, float]:
        """The family with the largest share of rejected rows, and that share."""
        if not self.rows:
            return "", 0.0
        return max(((f, self.bad[f] / max(self.rows[f], 1)) for f in self.rows), key=lambda x: x[1])


def check_task(task: Task, max_prompt_chars: int) -> str | None:
    """Why a task cannot be used, or None."""
    from rlcr.tasks import verify

    if not task.prompt.strip():
        return "empty prompt"
    if len(task.prompt) > max_prompt_chars:
        return f"prompt longer than {max_prompt_chars} chars"
    if not task.answer.strip():
        return "empty answer"
    if task.kind != "code" and verify(task, task.answer) < 1.0:
        return "reference answer does not verify"
    return None


def _draw(spec: FamilySpec, seed: int, difficulty: int, exclude: set[str], cfg: PrepareConfig,
          report: SplitReport) -> list[Task]:
    """n good tasks of one family and difficulty whose prompts are not in `exclude`."""
    family = build_family(spec.name, spec.options)
    file_rows = getattr(family, "n_rows", None)
    if file_rows is not None and spec.name not in report.rows:
        # an imported file's bad lines count once, against all its lines
        report.count(spec.name, file_rows, [(f"{spec.name}:line{n}", why) for n, why in family.rejected])
    pool = getattr(family, "pool_size", None)
    want = spec.n
    while True:
        asked = want if pool is None else min(want, pool)
        candidates = family.generate(seed, asked, difficulty)
        picked, seen = [], set(exclude)
        rejected, overlap = [], 0
        for task in candidates:
            if task.prompt in seen:
                overlap += 1
                continue
            why = check_task(task, cfg.max_prompt_chars)
            if why:
                rejected.append((task.id, why))
                continue
            seen.add(task.prompt)
            picked.append(task)
            if len(picked) == spec.n:
                break
        exhausted = pool is not None and asked >= pool
        if len(picked) == spec.n or exhausted or want > 64 * spec.n + 1024:
            break
        want *= 2
    report.count(spec.name, 0 if file_rows is not None else len(candidates), rejected)
    report.overlap_dropped += overlap
    if len(picked) < spec.n:
        raise ValueError(
            f"family {spec.name!r} difficulty {difficulty}: only {len(picked)} usable distinct tasks "
            f"of {spec.n} asked ({len(rejected)} rejected, {overlap} overlapping)"
        )
    return picked


def build_split(specs: tuple[FamilySpec, ...], seed: int, exclude: set[str], cfg: PrepareConfig,
                report: SplitReport) -> list[Task]:
    tasks: list[Task] = []
    taken = set(exclude)
    for spec in specs:
        for d in spec.difficulties:
            drawn = _draw(spec, seed, d, taken, cfg, report)
            taken.update(t.prompt for t in drawn)
            tasks.extend(drawn)
    return tasks


def build_splits(cfg: PrepareConfig) -> tuple[pd.DataFrame, pd.DataFrame, SplitReport]:
    """(train frame, eval frame, report); frames have COLUMNS in a fixed order."""
    report = SplitReport()
    train = build_split(cfg.train, cfg.seed, set(), cfg, report)
    evals = build_split(cfg.eval, cfg.seed + EVAL_SEED_OFFSET, {t.prompt for t in train}, cfg, report)
    return to_frame(train, "train"), to_frame(evals, "eval"), report


def to_frame(tasks: list[Task], split: str) -> pd.DataFrame:
    rows = [{**t.to_row(), "split": split} for t in tasks]
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return frame.astype({"difficulty": "int64"})


def from_frame(frame: pd.DataFrame) -> list[Task]:
    return [Task.from_row(r) for r in frame.to_dict("records")]


def split_stats(train: pd.DataFrame, evals: pd.DataFrame, report: SplitReport) -> dict[str, float]:
    """Namespaced dataset stats for MLflow and metrics/prepare.json."""
    stats: dict[str, float] = {
        "data/train_tasks": len(train),
        "data/eval_tasks": len(evals),
        "data/rejected_rows": len(report.rejected),
        "data/bad_fraction": report.bad_fraction,
        "data/eval_overlap_dropped": report.overlap_dropped,
    }
    for split, frame in (("train", train), ("eval", evals)):
        stats[f"data/{split}_prompt_chars_mean"] = float(frame["prompt"].str.len().mean())
        for family, count in frame["family"].value_counts().sort_index().items():
            stats[f"data/{split}_n/{family}"] = int(count)
    return stats
