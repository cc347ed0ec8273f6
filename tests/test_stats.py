"""Task-resampled bootstrap intervals on synthetic data with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from rlcr.stats import bootstrap_ci, mean, paired_diff_ci, paired_ratio_ci

Z95 = 1.959964


def test_bernoulli_interval_covers_p_and_matches_the_normal_width():
    p, n = 0.3, 2000
    x = (np.random.default_rng(1).random(n) < p).astype(float)
    ci = bootstrap_ci([[v] for v in x], n_resamples=4000, seed=0)
    phat = x.mean()
    assert ci.estimate == pytest.approx(phat)
    assert ci.low < p < ci.high
    normal_width = 2 * Z95 * np.sqrt(phat * (1 - phat) / n)
    assert ci.width == pytest.approx(normal_width, rel=0.08)
    assert (ci.n_tasks, ci.n) == (n, n)


def test_coverage_of_the_true_mean_over_many_datasets():
    # 200 datasets of 60 tasks x 3 episodes, task success rates drawn around 0.4 (clustered data)
    rng = np.random.default_rng(7)
    n_sets, n_tasks, g, true_mean = 200, 60, 3, 0.4
    task_p = rng.beta(2, 3, size=(n_sets, n_tasks))  # mean 2/5 = 0.4
    data = (rng.random((n_sets, n_tasks, g)) < task_p[..., None]).astype(float)
    covered = 0
    for s in range(n_sets):
        ci = bootstrap_ci(data[s], n_resamples=800, seed=s)
        covered += ci.low <= true_mean <= ci.high
    assert 0.90 <= covered / n_sets <= 0.99


def test_clusters_move_together():
    # every task's 4 episodes agree: the data carry only n_tasks independent draws, so the interval
    # must be as wide as with one episode per task, not half as wide as 4x the episodes would suggest
    rng = np.random.default_rng(3)
    per_task = (rng.random(400) < 0.5).astype(float)
    one = bootstrap_ci([[v] for v in per_task], seed=0)
    four = bootstrap_ci([[v] * 4 for v in per_task], seed=0)
    assert four.estimate == pytest.approx(one.estimate)
    assert four.width == pytest.approx(one.width, rel=1e-9)
    assert four.n == 1600 and four.n_tasks == 400


def test_unequal_cluster_sizes_weigh_episodes_equally():
    ci = bootstrap_ci({"a": [1, 1, 1], "b": [0]}, n_resamples=200)
    assert ci.estimate == pytest.approx(0.75)


def test_constant_data_gives_a_zero_width_interval():
    ci = bootstrap_ci({f"t{i}": [0.1] * (1 + i % 3) for i in range(50)}, n_resamples=500)
    assert (ci.estimate, ci.low, ci.high, ci.width) == (0.1, 0.1, 0.1, 0.0)


def test_same_seed_same_interval_other_seed_other_interval():
    data = [[float(i % 3 == 0), float(i % 5 == 0)] for i in range(40)]
    assert bootstrap_ci(data, seed=5) == bootstrap_ci(data, seed=5)
    assert bootstrap_ci(data, seed=5) != bootstrap_ci(data, seed=6)


def test_custom_statistic():
    data = {i: [float(i)] for i in range(101)}
    ci = bootstrap_ci(data, stat=lambda v: float(np.median(v)), n_resamples=300)
    assert ci.estimate == 50.0 and ci.low < 50.0 < ci.high


def test_paired_diff_of_identical_arms_is_exactly_zero():
    rng = np.random.default_rng(0)
    a = {f"t{i}": list((rng.random(3) < 0.6).astype(float)) for i in range(80)}
    ci = paired_diff_ci(a, dict(a))
    assert (ci.estimate, ci.low, ci.high) == (0.0, 0.0, 0.0)


def test_paired_diff_recovers_a_known_gap_and_pairing_narrows_it():
    # both arms share a large task effect; arm a is better by 0.2 on every task
    rng = np.random.default_rng(11)
    base = rng.random(300) * 0.6
    a = {i: (rng.random(4) < base[i] + 0.2).astype(float) for i in range(300)}
    b = {i: (rng.random(4) < base[i]).astype(float) for i in range(300)}
    ci = paired_diff_ci(a, b, n_resamples=3000, seed=1)
    assert ci.low < 0.2 < ci.high and ci.low > 0
    assert ci.estimate == pytest.approx(np.mean(np.concatenate(list(a.values())))
                                        - np.mean(np.concatenate(list(b.values()))))
    # the unpaired interval of the difference (independent resamples) is wider
    ia, ib = bootstrap_ci(a, n_resamples=3000, seed=2), bootstrap_ci(b, n_resamples=3000, seed=3)
    assert ci.width < np.hypot(ia.width, ib.width)


def test_paired_uses_only_shared_tasks():
    ci = paired_diff_ci({"x": [1.0], "y": [1.0], "only_a": [0.0]}, {"x": [0.0], "y": [1.0], "only_b": [5.0]})
    assert ci.estimate == pytest.approx(0.5) and ci.n_tasks == 2 and ci.n == 4
    with pytest.raises(ValueError, match="share no task"):
        paired_diff_ci({"a": [1.0]}, {"b": [1.0]})


def test_paired_ratio():
    a = {i: [2.0 * (1 + i % 4)] for i in range(40)}
    b = {i: [1.0 + i % 4] for i in range(40)}
    ci = paired_ratio_ci(a, b)
    assert (ci.estimate, ci.low, ci.high) == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError, match="zero denominator"):
        paired_ratio_ci(a, {i: [0.0] for i in range(40)})


def test_bad_inputs_fail_with_the_reason():
    with pytest.raises(ValueError, match="no tasks"):
        bootstrap_ci({})
    with pytest.raises(ValueError, match="without values"):
        bootstrap_ci({"a": [1.0], "b": []})
    with pytest.raises(ValueError, match="level"):
        bootstrap_ci([[1.0]], level=1.5)
    with pytest.raises(ValueError, match="n_resamples"):
        bootstrap_ci([[1.0]], n_resamples=0)
    assert mean(np.array([1.0, 2.0])) == 1.5


def test_task_order_of_a_mapping_does_not_change_the_interval():
    data = {f"t{i}": [float(i % 3 == 0), float(i % 7 == 0)] for i in range(30)}
    shuffled = dict(reversed(list(data.items())))
    assert bootstrap_ci(data, seed=4) == bootstrap_ci(shuffled, seed=4)
    other = {k: [1.0 - v[0]] for k, v in data.items()}
    assert paired_diff_ci(data, other, seed=4) == paired_diff_ci(shuffled, dict(reversed(list(other.items()))), seed=4)


def test_across_seeds_gives_a_t_interval_over_seeds():
    from scipy import stats as st

    from rlcr.stats import across_seeds

    s = across_seeds([0.30, 0.40, 0.35])
    half = st.t.ppf(0.975, 2) * np.std([0.30, 0.40, 0.35], ddof=1) / np.sqrt(3)
    assert s["mean"] == pytest.approx(0.35) and s["ci_high"] - s["mean"] == pytest.approx(half)
    assert (s["min"], s["max"], s["seeds"]) == (0.30, 0.40, 3.0)
    assert across_seeds([0.2])["ci_low"] == across_seeds([0.2])["ci_high"] == 0.2  # one seed: no spread known
    assert across_seeds([0.1, 0.1, 0.1])["ci_low"] == pytest.approx(0.1)
    with pytest.raises(ValueError):
        across_seeds([])
