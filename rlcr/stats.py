"""Confidence intervals for evaluation numbers, by bootstrap over TASKS (clusters).

Why tasks and not episodes: an eval runs several episodes per task, and episodes of one task share
its difficulty, so they are correlated. Resampling episodes as if independent makes intervals too
narrow. Here a resample draws tasks with replacement and every episode of a drawn task comes along
(the cluster bootstrap); with one episode per task it is the ordinary bootstrap.

Paired comparisons (company vs single, trained vs bootstrap) draw ONE set of tasks per resample and
evaluate both arms on it, so the task-to-task spread cancels out of the difference.

Intervals are percentile intervals of the resampled statistic; the point estimate is the statistic
on the data as observed. Everything is deterministic for a given `seed` (numpy's PCG64), also across
dict orders: tasks of a mapping are taken in the order of `str(task_id)`.

The default statistic is the pooled mean over episodes (`mean`): it is computed for all resamples at
once from per-task sums and counts. Any other `stat(values) -> float` works, one resample at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

Stat = Callable[[np.ndarray], float]
ByTask = Mapping[Hashable, Sequence[float]] | Sequence[Sequence[float]]
"""Episode values grouped by task: {task_id: [values of its episodes]} or a list of lists."""


def mean(values: np.ndarray) -> float:
    """Pooled mean over episodes (every episode weighs the same): the default statistic."""
    return float(np.mean(values))


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap interval; `n_tasks` clusters holding `n` values."""

    estimate: float
    low: float
    high: float
    n_tasks: int
    n: int

    @property
    def width(self) -> float:
        return self.high - self.low


def _groups(values_by_task: ByTask) -> tuple[list[Hashable], list[np.ndarray]]:
    """(task keys, one float array per task); tasks without values are an error, not a silent drop."""
    if isinstance(values_by_task, Mapping):
        # a canonical task order, so the same data in another dict order gives the same interval
        keys = sorted(values_by_task, key=str)
        arrays = [np.asarray(values_by_task[k], dtype=float).ravel() for k in keys]
    else:
        arrays = [np.asarray(v, dtype=float).ravel() for v in values_by_task]
        keys = list(range(len(arrays)))
    if not arrays:
        raise ValueError("no tasks: a confidence interval needs at least one task")
    empty = [k for k, a in zip(keys, arrays, strict=True) if a.size == 0]
    if empty:
        raise ValueError(f"tasks without values: {empty[:5]}")
    return keys, arrays


def _check(n_resamples: int, level: float) -> None:
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")


def task_draws(n_tasks: int, n_resamples: int, seed: int) -> np.ndarray:
    """Task indices of every resample: (n_resamples, n_tasks). Paired intervals index every arm with the
    same rows."""
    return np.random.default_rng(seed).integers(0, n_tasks, size=(n_resamples, n_tasks))


def _resampled(arrays: list[np.ndarray], idx: np.ndarray, stat: Stat) -> np.ndarray:
    """The statistic on each resample: (n_resamples,)."""
    if stat is mean or stat is np.mean:
        # shifted by one observed value, so constant data gives exactly that value (no rounding)
        shift = arrays[0][0]
        sums = np.array([(a - shift).sum() for a in arrays])  # (T,)
        counts = np.array([a.size for a in arrays], dtype=float)  # (T,)
        return shift + sums[idx].sum(axis=1) / counts[idx].sum(axis=1)  # (R,)
    return np.array([float(stat(np.concatenate([arrays[i] for i in row]))) for row in idx])


def _observed(arrays: list[np.ndarray], stat: Stat) -> float:
    """The statistic on the data as observed (all tasks once), computed as a resample would be."""
    return float(_resampled(arrays, np.arange(len(arrays))[None, :], stat)[0])


def percentiles(boot: np.ndarray, level: float) -> tuple[float, float]:
    """The `level` percentile interval (low, high) of resampled statistics."""
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(boot, [alpha, 1.0 - alpha])
    return float(low), float(high)


def _interval(estimate: float, boot: np.ndarray, level: float, n_tasks: int, n: int) -> Interval:
    return Interval(float(estimate), *percentiles(boot, level), n_tasks, n)


def bootstrap_ci(values_by_task: ByTask, stat: Stat = mean, n_resamples: int = 2000, seed: int = 0,
                 level: float = 0.95) -> Interval:
    """`stat` over all episodes, with a percentile interval from resampling tasks (clusters)."""
    _check(n_resamples, level)
    _, arrays = _groups(values_by_task)
    boot = _resampled(arrays, task_draws(len(arrays), n_resamples, seed), stat)
    return _interval(_observed(arrays, stat), boot, level, len(arrays), sum(a.size for a in arrays))


def _pair(a_by_task: Mapping[Hashable, Sequence[float]], b_by_task: Mapping[Hashable, Sequence[float]]
          ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Both arms on the tasks they share, in one order; a task in only one arm cannot be paired."""
    if not isinstance(a_by_task, Mapping) or not isinstance(b_by_task, Mapping):
        raise TypeError("paired intervals need {task_id: values} mappings, so tasks can be matched")
    shared = [k for k in a_by_task if k in b_by_task]
    if not shared:
        raise ValueError("the two arms share no task: nothing to pair")
    _, a = _groups({k: a_by_task[k] for k in shared})
    _, b = _groups({k: b_by_task[k] for k in shared})
    return a, b


def paired_ci(a_by_task: Mapping[Hashable, Sequence[float]], b_by_task: Mapping[Hashable, Sequence[float]],
              combine: Callable[[np.ndarray, np.ndarray], np.ndarray], stat: Stat = mean,
              n_resamples: int = 2000, seed: int = 0, level: float = 0.95) -> Interval:
    """`combine(stat(a), stat(b))` on the tasks both arms ran, each resample drawing the same tasks
    for both arms. `n_tasks`/`n` count the shared tasks and the episodes of both arms on them."""
    _check(n_resamples, level)
    a, b = _pair(a_by_task, b_by_task)
    idx = task_draws(len(a), n_resamples, seed)
    boot = combine(_resampled(a, idx, stat), _resampled(b, idx, stat))
    est = combine(np.array([_observed(a, stat)]), np.array([_observed(b, stat)]))[0]
    n = sum(x.size for x in a) + sum(x.size for x in b)
    return _interval(float(est), np.asarray(boot, dtype=float), level, len(a), n)


def paired_diff_ci(a_by_task: Mapping[Hashable, Sequence[float]], b_by_task: Mapping[Hashable, Sequence[float]],
                   stat: Stat = mean, n_resamples: int = 2000, seed: int = 0, level: float = 0.95) -> Interval:
    """stat(a) - stat(b) on shared tasks, tasks resampled jointly (e.g. company minus single success)."""
    return paired_ci(a_by_task, b_by_task, np.subtract, stat, n_resamples, seed, level)


def _ratio(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(y != 0, x / np.where(y != 0, y, 1.0), np.nan)


def paired_ratio_ci(a_by_task: Mapping[Hashable, Sequence[float]], b_by_task: Mapping[Hashable, Sequence[float]],
                    stat: Stat = mean, n_resamples: int = 2000, seed: int = 0, level: float = 0.95) -> Interval:
    """stat(a) / stat(b) on shared tasks (e.g. company critical path / single total tokens).
    A resample whose denominator is 0 is dropped; if the observed denominator is 0, ValueError."""
    _check(n_resamples, level)
    a, b = _pair(a_by_task, b_by_task)
    if _observed(b, stat) == 0:
        raise ValueError("ratio with a zero denominator on the observed data")
    idx = task_draws(len(a), n_resamples, seed)
    boot = _ratio(_resampled(a, idx, stat), _resampled(b, idx, stat))
    est = _observed(a, stat) / _observed(b, stat)
    n = sum(x.size for x in a) + sum(x.size for x in b)
    return _interval(float(est), boot[np.isfinite(boot)], level, len(a), n)


__all__ = ["ByTask", "Interval", "Stat", "bootstrap_ci", "mean", "paired_ci", "paired_diff_ci", "paired_ratio_ci"]


def across_seeds(values: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """Spread of one figure over independent seeds (one value per seed): mean, a Student-t interval
    on n - 1 degrees of freedom (the seed-to-seed variation, which task resampling within one run
    cannot see), min, max and n. With one seed the interval is the value itself (no spread known)."""
    from scipy import stats as st

    x = np.asarray(list(values), dtype=float)
    if x.size == 0:
        raise ValueError("across_seeds needs at least one value")
    out = {"mean": float(x.mean()), "min": float(x.min()), "max": float(x.max()), "seeds": float(x.size)}
    if x.size == 1:
        return {**out, "ci_low": out["mean"], "ci_high": out["mean"]}
    half = float(st.t.ppf(0.5 + level / 2.0, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return {**out, "ci_low": out["mean"] - half, "ci_high": out["mean"] + half}
