"""Eval rollouts: task selection, determinism of the files, single vs company, the GE suite, and the
`rollout` stage through real `dvc repro` in a throwaway project copy."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from rlcr import io
from rlcr.config import PROJECT_ROOT, ModelConfig, load_params
from rlcr.policy.models import build_tiny, save_policy
from rlcr.rollout import chunk_seed, org_for, rollout_frames, rollout_policy, select_tasks
from rlcr.tasks import Task, build_family

SMALL = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128)
OVERRIDES = {"org.token_budget": 96, "org.max_rounds": 4, "rollout.batch_episodes": 3, "tracking.enabled": False}


def make_policy(folder: Path) -> Path:
    """A random-init small tiny-architecture policy, saved as an HF folder."""
    model, tok = build_tiny(SMALL, 0)
    return save_policy(model, tok, folder)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_policy(tmp_path_factory.mktemp("policy") / "bootstrap")


@pytest.fixture(scope="module")
def params():
    return load_params(PROJECT_ROOT / "params.yaml", OVERRIDES)


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return [*build_family("sum").generate(0, 2, 1), *build_family("signed_sum").generate(0, 2, 3),
            *build_family("sum").generate(1, 1, 3)]


@pytest.fixture(scope="module")
def company(tasks, folder, params):
    return rollout_policy(tasks, folder, "company", params, seed=0)


def written(records, tmp: Path) -> dict[str, bytes]:
    episodes, turns, timing = rollout_frames(records)
    io.write_parquet(episodes, tmp / "e.parquet")
    io.write_parquet(turns, tmp / "t.parquet")
    return {n: (tmp / n).read_bytes() for n in ("e.parquet", "t.parquet")}


# ------------------------------------------------------------------------------------------ pure


def test_select_tasks_caps_each_family_round_robin_over_difficulties():
    sums = [*build_family("sum").generate(0, 3, 1), *build_family("sum").generate(0, 3, 3)]
    gcd = [Task(id=f"g{i}", family="rg/gcd", kind="math", difficulty=1, prompt=f"gcd {i}", answer="1") for i in range(2)]
    picked = select_tasks(sums + gcd, 3)
    assert [t.difficulty for t in picked if t.family == "sum"] == [1, 1, 3]  # file order, both levels kept
    assert [t.id for t in picked if t.family == "rg/gcd"] == ["g0", "g1"]
    assert select_tasks(sums + gcd, 0) == sums + gcd


def test_single_is_the_same_org_and_budget_with_one_agent(params):
    single, company = org_for(params.org, "single"), org_for(params.org, "company")
    assert single.single_agent and not company.single_agent
    assert single.token_budget == company.token_budget == params.org.token_budget
    with pytest.raises(ValueError, match="org mode"):
        org_for(params.org, "committee")


def test_chunk_seeds_differ():
    assert len({chunk_seed(s, c) for s in range(3) for c in range(50)}) == 150


# --------------------------------------------------------------------------------- real rollouts


def test_same_seed_writes_identical_bytes_other_seed_does_not(tasks, folder, params, company, tmp_path):
    again = rollout_policy(tasks, folder, "company", params, seed=0)
    other = rollout_policy(tasks, folder, "company", params, seed=1)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir(), (tmp_path / "c").mkdir()
    assert written(company, tmp_path / "a") == written(again, tmp_path / "b")
    assert written(company, tmp_path / "a")["t.parquet"] != written(other, tmp_path / "c")["t.parquet"]


def test_rollout_frames_keep_real_seconds_apart(company):
    episodes, turns, timing = rollout_frames(company)
    assert (episodes["seconds"] == 0).all() and (turns["batch_seconds"] == 0).all() and (turns["env_seconds"] == 0).all()
    assert list(timing.columns) == ["episode_id", "seconds"] and (timing["seconds"] > 0).all()
    assert timing["episode_id"].tolist() == episodes["episode_id"].tolist()


def test_samples_and_modes(tasks, folder, params, company):
    assert [r.episode.episode_id for r in company] == [f"{t.id}#0" for t in tasks]
    assert all(r.episode.mode == "company" for r in company)
    twice = dataclasses.replace(params, rollout=dataclasses.replace(params.rollout, samples_per_task=2))
    single = rollout_policy(tasks[:2], folder, "single", twice, seed=0)
    assert [r.episode.episode_id for r in single] == [f"{t.id}#{k}" for k in range(2) for t in tasks[:2]]
    for r in single + company:
        assert r.episode.budget_used <= params.org.token_budget
    for r in single:
        assert r.episode.mode == "single" and r.episode.n_agents == 1 and {t.role for t in r.turns} == {"ceo"}
        assert all("POST" not in t.prompt.split("actions:")[1].splitlines()[0] for t in r.turns)


# ----------------------------------------------------------------------------------- the GE suite


def test_suite_passes_a_real_rollout_and_names_each_corruption(company, params):
    from rlcr.validation import DataValidationError, require_valid, validate_rollouts

    episodes, turns, _ = rollout_frames(company)
    assert validate_rollouts(episodes, turns, params.org, params.reward, "company").success

    bad_e, bad_t = episodes.copy(), turns.copy()
    ep0, ep1 = bad_e.loc[0, "episode_id"], bad_e.loc[1, "episode_id"]
    bad_e.loc[0, "outcome"] = 1.5
    lps = json.loads(bad_t.loc[2, "logprobs"])
    bad_t.loc[2, "logprobs"] = json.dumps([float("nan"), *lps[1:]])
    bad_t.loc[3, "role"] = "intruder"
    bad_t.loc[4, "completion_tokens"] = 0
    turn2 = f"{bad_t.loc[2, 'episode_id']}/r{bad_t.loc[2, 'round']}/a{bad_t.loc[2, 'agent']}"
    turn3 = f"{bad_t.loc[3, 'episode_id']}/r{bad_t.loc[3, 'round']}/a{bad_t.loc[3, 'agent']}"
    bad_e = pd.concat([bad_e, bad_e.iloc[[1]]], ignore_index=True)  # episode 1 twice: two outcomes

    report = validate_rollouts(bad_e, bad_t, params.org, params.reward, "company")
    text = report.describe()
    by = {(f.expectation, f.column): f for f in report.failures}
    assert ep0 in by[("expect_column_values_to_be_between", "episodes.outcome")].row_ids
    assert ep1 in by[("expect_column_values_to_be_unique", "episodes.episode_id")].row_ids
    assert turn2 in by[("expect_column_values_to_be_in_set", "turns.logprobs_finite")].row_ids
    assert turn3 in by[("expect_column_values_to_be_in_set", "turns.role")].row_ids
    turn4 = f"{bad_t.loc[4, 'episode_id']}/r{bad_t.loc[4, 'round']}/a{bad_t.loc[4, 'agent']}"
    # 0 tokens: out of range, and no longer the number of logprobs the turn holds
    assert turn4 in by[("expect_column_values_to_be_between", "turns.completion_tokens")].row_ids
    assert turn4 in by[("expect_column_pair_values_to_be_equal", "turns.n_logprobs,completion_tokens")].row_ids
    assert "turns.role" in text and turn3 in text
    with pytest.raises(DataValidationError, match="expect_column_values_to_be_between\\[episodes.outcome\\]"):
        require_valid(report)


def test_suite_rejects_a_turn_table_that_lost_an_episodes_turns(company, params):
    from rlcr.validation import validate_rollouts

    episodes, turns, _ = rollout_frames(company)
    gone = episodes.loc[0, "episode_id"]
    report = validate_rollouts(episodes, turns[turns["episode_id"] != gone], params.org, params.reward, "company")
    (f,) = [f for f in report.failures if f.column == "episodes.n_turns,turns_found"]
    assert f.expectation == "expect_column_pair_values_to_be_equal" and gone in f.row_ids
    # and a single-mode table may not hold a hire
    report = validate_rollouts(episodes, turns, params.org, params.reward, "single")
    assert ("expect_column_values_to_be_in_set", "episodes.mode") in {(f.expectation, f.column) for f in report.failures}


# -------------------------------------------------------------------------------- the DVC stage


def rollout_params(root: Path, **rollout) -> None:
    from test_stage_prepare import small_params

    small_params(root)
    path = root / "params.yaml"
    data = yaml.safe_load(path.read_text())
    data["org"].update({"token_budget": 128, "max_rounds": 4})
    data["rollout"].update({"max_tasks_per_family": 2, **rollout})
    # the real bootstrap stage runs upstream: a few SFT steps on a few scripted episodes
    data["bootstrap"].update({"steps": 3, "batch_size": 4, "episodes": 12, "warmup_steps": 0, "eval_tasks": 0,
                              "drill_first": 2})  # the default's 1000 drill steps alone took minutes here
    path.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.mark.slow
def test_rollout_stage_through_dvc_repro(project_copy):
    from mlflow import MlflowClient
    from test_stage_prepare import dvc

    root = project_copy
    rollout_params(root)
    dvc(root, "repro", "rollout@bootstrap-single")  # runs prepare and bootstrap first: their outs are deps
    name = "bootstrap__single"
    outs = [f"data/rollouts/{name}.parquet", f"data/rollouts/{name}.turns.parquet", f"data/rollouts/{name}.timing.parquet"]
    for out in [*outs, f"metrics/rollout/{name}.json", "data/tasks/eval.parquet"]:
        assert (root / out).exists(), out
    episodes = pd.read_parquet(root / outs[0])
    assert len(episodes) == 4 and set(episodes["mode"]) == {"single"}  # sum x2 + rg/gcd x2
    metrics = json.loads((root / f"metrics/rollout/{name}.json").read_text())
    for key in ("rollout/success", "rollout/reward_mean", "rollout/tokens_mean", "rollout/critical_path_mean",
                "perf/tokens_per_s", "perf/seconds", "behaviour/malformed_rate", "org/size"):
        assert key in metrics, key

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlcr-collective-rewards")
    (run,) = client.search_runs([exp.experiment_id], "tags.`rlcr.stage` = 'rollout@bootstrap-single'")
    assert run.info.status == "FINISHED" and run.data.tags["rlcr.rollout"] == name
    assert run.data.metrics["rollout/tokens_mean"] == pytest.approx(metrics["rollout/tokens_mean"])
    assert "dvc.dep.rlcr/rollout.py" in run.data.tags

    # every rlcr module the stage imported is a declared dependency
    deps = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["rollout"]["deps"]
    imported = json.loads((root / "imports.json").read_text())
    missing = [m for m in imported if not any(m == d or m.startswith(d.rstrip("/") + "/") for d in deps)]
    assert "rlcr/rollout.py" in imported and not missing, f"stage imports modules dvc.yaml does not list: {missing}"

    # nothing changed -> skipped; forced rerun -> byte-identical episode and turn tables (docs/reliability.md, item 13)
    assert "didn't change, skipping" in dvc(root, "repro", "rollout@bootstrap-single").stdout
    before = {o: (root / o).read_bytes() for o in outs[:2]}
    dvc(root, "repro", "-f", "-s", "rollout@bootstrap-single")
    assert {o: (root / o).read_bytes() for o in outs[:2]} == before

    # the company instance is its own stage with its own outs; a rollout param reruns both
    dvc(root, "repro", "rollout@bootstrap-company")
    assert set(pd.read_parquet(root / "data/rollouts/bootstrap__company.parquet")["mode"]) == {"company"}
    rollout_params(root, seed=1)
    proc = dvc(root, "repro", "rollout@bootstrap-single", "rollout@bootstrap-company")  # not the trained ones: no train
    assert "Running stage 'rollout@bootstrap-single'" in proc.stdout
    assert "Running stage 'rollout@bootstrap-company'" in proc.stdout
    assert {o: (root / o).read_bytes() for o in outs[:2]} != before
