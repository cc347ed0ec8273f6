"""benchmarks/rl_spread.py's --set parsing (the RL runs themselves are the benchmark's, not a test's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def test_sets_parse_as_yaml_values_and_reach_load_params():
    from rlcr.config import load_params

    sets = load_benchmark("rl_spread").parse_sets(["train.lr=3.0e-4", "train.std_normalise=false", "train.iterations=40"])
    assert sets == {"train.lr": 3.0e-4, "train.std_normalise": False, "train.iterations": 40}
    params = load_params(ROOT / "params.yaml", {"tracking.enabled": False, **sets})
    assert (params.train.lr, params.train.std_normalise, params.train.iterations) == (3.0e-4, False, 40)


@pytest.mark.parametrize("item", ["train.lr", "=3", ""])
def test_a_set_without_key_and_value_is_refused_by_name(item):
    with pytest.raises(SystemExit, match="key=value"):
        load_benchmark("rl_spread").parse_sets([item])
