"""benchmarks/rl_spread.py's --set parsing (the RL runs themselves are the benchmark's, not a test's)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load():
    spec = importlib.util.spec_from_file_location("rl_spread", ROOT / "benchmarks/rl_spread.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sets_parse_as_yaml_values_and_reach_load_params():
    from rlcr.config import load_params

    sets = load().parse_sets(["train.lr=3.0e-4", "train.std_normalise=false", "train.iterations=40"])
    assert sets == {"train.lr": 3.0e-4, "train.std_normalise": False, "train.iterations": 40}
    params = load_params(ROOT / "params.yaml", {"tracking.enabled": False, **sets})
    assert (params.train.lr, params.train.std_normalise, params.train.iterations) == (3.0e-4, False, 40)


@pytest.mark.parametrize("item", ["train.lr", "=3", ""])
def test_a_set_without_key_and_value_is_refused_by_name(item):
    with pytest.raises(SystemExit, match="key=value"):
        load().parse_sets([item])
