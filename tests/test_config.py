"""Bad params fail before any work, naming the key and the reason."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlcr.config import ConfigError, load_params, resolve

ROOT = Path(__file__).resolve().parents[1]
RAW = yaml.safe_load((ROOT / "params.yaml").read_text())


def raw(**changes):
    data = copy.deepcopy(RAW)
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for p in parents:
            node = node[p]
        node[last] = value
    return data


def test_default_params_load():
    p = load_params(ROOT / "params.yaml")
    assert p.profile == "tiny"
    assert len([f for f in p.prepare.eval if f.name.startswith("rg/")]) == 12


def test_unknown_top_level_key_is_named():
    with pytest.raises(ConfigError, match=r"params.yaml: trian: unknown key"):
        resolve({**RAW, "trian": {}})


def test_unknown_nested_key_is_named():
    with pytest.raises(ConfigError, match=r"tracking\.enabeld: unknown key"):
        resolve(raw(tracking={"enabeld": True}))


def test_wrong_type_is_named():
    with pytest.raises(ConfigError, match=r"prepare\.seed: expected an integer"):
        resolve(raw(prepare__seed="zero"))


def test_bool_is_not_an_int():
    with pytest.raises(ConfigError, match=r"prepare\.max_prompt_chars: expected an integer"):
        resolve(raw(prepare__max_prompt_chars=True))


def test_impossible_combination_says_why():
    with pytest.raises(ConfigError, match=r"prepare\.max_bad_rows: must be in \[0, 1\)"):
        resolve(raw(prepare__max_bad_rows=1.5))


def test_family_listed_twice_is_refused_for_the_same_difficulty_only():
    fam = RAW["prepare"]["train"][0]
    with pytest.raises(ConfigError, match=r"prepare\.train: family and difficulty listed twice"):
        resolve(raw(prepare__train=[fam, fam]))
    longer = {**fam, "n": 2, "difficulties": [7]}
    assert [f.n for f in resolve(raw(prepare__train=[fam, longer])).prepare.train] == [fam["n"], 2]


def test_unknown_profile_is_named():
    with pytest.raises(ConfigError, match=r"profile: must be one of"):
        resolve(raw(profile="huge"))


def test_profile_overrides_apply_and_explicit_overrides_win():
    data = raw(profile="gpu")
    data["profiles"]["gpu"] = {"prepare": {"seed": 7}}
    assert resolve(data).prepare.seed == 7
    assert resolve(data, {"prepare.seed": 9}).prepare.seed == 9
    assert resolve(raw()).prepare.seed == RAW["prepare"]["seed"]


def test_stage_exits_2_naming_the_key_before_work(project_copy):
    params = project_copy / "params.yaml"
    params.write_text(params.read_text().replace("max_bad_rows: 0.01", "max_bad_rows: 0.01\n  shuffle: true"))
    proc = subprocess.run([sys.executable, "stages/prepare.py"], cwd=project_copy, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "prepare.shuffle: unknown key" in proc.stderr
    assert not (project_copy / "data/tasks").exists()
    assert not (project_copy / "mlflow.db").exists()


def test_bf16_is_autocast_on_the_torch_backend_and_needs_zero_on_deepspeed():
    assert resolve(raw(), {"train.bf16": True}).train.bf16  # torch backend: bf16 autocast, fp32 weights
    with pytest.raises(ConfigError, match=r"train\.bf16: needs train\.zero_stage >= 1"):
        resolve(raw(), {"train.bf16": True, "train.backend": "deepspeed"})
    with pytest.raises(ConfigError, match=r"train\.gradient_checkpointing: is a DeepSpeed backend option"):
        resolve(raw(), {"train.gradient_checkpointing": True})


def test_cross_section_invariants_are_named():
    with pytest.raises(ConfigError, match=r"org\.max_turn_tokens: .* exceeds engine\.max_new_tokens"):
        resolve(raw(), {"engine.max_new_tokens": 8})
    with pytest.raises(ConfigError, match=r"org\.context_tokens: .* exceeds model\.context"):
        resolve(raw(), {"model.context": 128, "org.max_obs_tokens": 64, "org.max_turn_tokens": 32,
                        "org.context_tokens": 256})


@pytest.mark.parametrize("key, value, match", [
    ("rollout.orgs", ["company", "team"], r"rollout\.orgs: must be distinct values"),
    ("rollout.orgs", [], r"rollout\.orgs: must be distinct values"),
    ("rollout.samples_per_task", 0, r"rollout\.samples_per_task: must be >= 1"),
    ("rollout.batch_episodes", 0, r"rollout\.batch_episodes: must be >= 1"),
    ("rollout.max_tasks_per_family", -1, r"rollout\.max_tasks_per_family: must be >= 0"),
    ("engine.sampler", "gumbel", r"engine\.sampler: must be one of"),
    ("engine.row_threads", 0, r"engine\.row_threads: must be >= 1"),
])
def test_rollout_values_are_checked_when_loading(key, value, match):
    with pytest.raises(ConfigError, match=match):
        resolve(raw(), {key: value})


def test_quick_profile_shrinks_the_pipeline():
    p, q = resolve(raw()), resolve(raw(profile="quick"))
    assert q.bootstrap.steps < p.bootstrap.steps and q.train.iterations < p.train.iterations
    assert len(q.prepare.eval) < len(p.prepare.eval)
