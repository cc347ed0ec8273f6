"""The `ablate` stage: the variant table resolves to the params each variant means, those params do
what the variant says in a real episode, and a real `dvc repro` of the matrix on the quick profile
writes what the report reads and nests its MLflow runs under one parent per sweep."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import dvc as _dvc

from rlcr import ablate
from rlcr.config import ABLATION_VARIANTS, ConfigError, resolve
from rlcr.org import run_episodes
from rlcr.org.scripted import Replay
from rlcr.tasks import build_family

dvc = functools.partial(_dvc, timeout=900)  # these stages train: more than prepare's 600 s
ROOT = Path(__file__).resolve().parents[1]
TASK = build_family("sum").generate(0, 1, 3)[0]  # 68+57+42+37 = 204


def raw_params() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def variant_params(variant: str, seed: int = 0):
    """(the default params, those of one run of `variant`); a known variant off the default list
    (`must_hire`) is added to it, as `dvc exp run -S ablate.variants=[...]` would."""
    raw = raw_params()
    base = run_base = resolve(raw)
    if variant not in base.ablate.variants:
        raw = {**raw, "ablate": {**raw["ablate"], "variants": [*raw["ablate"]["variants"], variant]}}
        run_base = resolve(raw)
    return base, resolve(raw, ablate.variant_overrides(run_base.ablate, variant, seed))


# ------------------------------------------------------------------------------- the variant table


def test_every_variant_resolves_to_the_params_it_means():
    for variant in ABLATION_VARIANTS:
        base, p = variant_params(variant, seed=0)
        assert p.train.iterations == base.ablate.iterations and p.train.seed == p.rollout.seed == p.seed == 0
        changed = {s for s in ("org", "reward", "model", "engine", "evaluate") if getattr(p, s) != getattr(base, s)}
        want = {"collective": set(), "individual": {"reward"}, "mixed": {"reward"}, "counterfactual": set(),
                "no_board": {"org"}, "no_hiring": {"org"}, "no_verifiers": {"org"}, "must_hire": {"org"}}[variant]
        assert changed == want, variant
        assert (p.train.counterfactual_hires > 0) == (variant == "counterfactual"), variant
        assert ablate.VARIANTS[variant].why and ablate.VARIANTS[variant].org_mode == (
            "single" if variant == "no_hiring" else "company")
    assert variant_params("individual")[1].reward.kind == "individual"
    mixed = variant_params("mixed")[1].reward
    assert (mixed.kind, mixed.alpha) == ("mixed", 0.5)
    assert variant_params("no_board")[1].org.board_posts_shown == 0
    assert variant_params("no_hiring")[1].org.single_agent is True
    assert variant_params("must_hire")[1].org.min_hires == 1 and variant_params("collective")[1].org.min_hires == 0
    base, no_verifiers = variant_params("no_verifiers")
    assert no_verifiers.org.roles == tuple(r for r in base.org.roles if r not in ("verifier", "tester"))
    raw = raw_params()
    seeds = resolve({**raw, "ablate": {**raw["ablate"], "seeds": [0, 3]}}).ablate
    assert {k: v for k, v in ablate.variant_overrides(seeds, "collective", 3).items() if "seed" in k} == {
        "seed": 3, "train.seed": 3, "rollout.seed": 3}


def test_a_seed_not_in_the_list_and_an_unknown_variant_name_the_key():
    raw = raw_params()
    with pytest.raises(ConfigError, match=r"ablate\.variants: unknown variant 'bogus'"):
        resolve({**raw, "ablate": {**raw["ablate"], "variants": ["collective", "bogus"]}})
    base = resolve({**raw, "ablate": {**raw["ablate"], "variants": ["collective"]}})
    with pytest.raises(ConfigError, match=r"ablate\.variants: 'no_board' is not in"):
        ablate.variant_overrides(base.ablate, "no_board", 0)
    with pytest.raises(ConfigError, match=r"ablate\.seeds"):
        ablate.variant_overrides(base.ablate, "collective", 99)
    proc = subprocess.run([sys.executable, "stages/ablate.py", "--variant", "bogus", "--seed", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "ablate.variants" in proc.stderr  # before any work or MLflow run


def test_no_verifiers_refuses_a_verifier_hire_as_a_malformed_turn():
    script = {(0, 1): "HIRE verifier: check 68+57+42+37=204\nHIRE tester: test it", (0, 2): "SUBMIT 204"}
    with_v = run_episodes([TASK], Replay(script), variant_params("collective")[1].org)[0]
    without = run_episodes([TASK], Replay(script), variant_params("no_verifiers")[1].org)[0]
    assert [m["role"] for m in with_v.episode.org()] == ["ceo", "verifier", "tester"]
    assert [m["role"] for m in without.episode.org()] == ["ceo"]
    turn = without.turns[0]
    assert turn.malformed and turn.n_actions == 0 and "unknown role 'verifier'" in turn.errors
    assert "roles you can hire: worker lead" in turn.prompt  # the policy is told what it may hire


def test_no_board_shows_no_post_of_any_agent():
    script = {(0, 1): "HIRE worker: add 68+57\nPOST ceo-note-alpha", (1, 2): "POST worker-result-beta @agent0",
              (0, 2): "POST ceo-note-gamma", (0, 4): "SUBMIT 204"}
    prompts = {}
    for variant in ("collective", "no_board"):
        pol = Replay(script, default="WAIT")
        run_episodes([TASK], pol, variant_params(variant)[1].org)
        prompts[variant] = "\n".join(r.prompt for reqs in pol.requests for r in reqs if r.round >= 3)
    assert "worker-result-beta" in prompts["collective"] and "ceo-note-alpha" in prompts["collective"]
    for post in ("ceo-note-alpha", "worker-result-beta", "ceo-note-gamma"):  # others' posts and its own
        assert post not in prompts["no_board"]


def test_sweep_status_follows_the_latest_run_of_each_variant_and_seed():
    s = ablate.sweep_status
    assert s([("a", "0", 1, "FINISHED"), ("b", "0", 2, "FINISHED")]) == "FINISHED"
    assert s([("a", "0", 1, "FINISHED"), ("b", "0", 2, "FAILED")]) == "FAILED"
    assert s([("b", "0", 1, "FAILED"), ("b", "0", 5, "FINISHED")]) == "FINISHED"  # rerun fixed it
    assert s([("a", "0", 1, "RUNNING"), ("b", "0", 2, "FINISHED")]) == "RUNNING"
    assert s([("a", "0", 1, "KILLED"), ("b", "0", 2, "RUNNING")]) == "KILLED"


def test_runs_of_one_sweep_share_one_parent_whose_status_follows_them(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from rlcr.tracking import stage_run

    params = resolve(raw_params(), {"tracking.uri": f"sqlite:///{tmp_path / 'mlflow.db'}"})
    # mlflow.set_tracking_uri (in stage_run) exports MLFLOW_TRACKING_URI: undone after the test, or the
    # subprocesses of later tests would log into this test's db
    monkeypatch.setenv("MLFLOW_TRACKING_URI", params.tracking.uri)

    def child(variant: str, fail: bool = False) -> str:
        with stage_run(f"ablate@{variant}-0", params, tmp_path) as tracker:
            with ablate.in_sweep(tracker, params, tmp_path, variant, 0) as parent:
                if fail:
                    raise RuntimeError("boom")
        return parent

    client = MlflowClient(tracking_uri=params.tracking.uri)
    parent = child("collective")
    assert client.get_run(parent).info.status == "FINISHED"
    with pytest.raises(RuntimeError):
        child("no_board", fail=True)
    assert client.get_run(parent).info.status == "FAILED"  # one variant's latest run failed
    assert child("no_board") == parent and client.get_run(parent).info.status == "FINISHED"  # its rerun did not
    runs = client.search_runs([client.get_run(parent).info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")
    assert sorted((r.data.tags["ablation"], r.data.tags["seed"]) for r in runs) == [
        ("collective", "0"), ("no_board", "0"), ("no_board", "0")]
    other = resolve(raw_params(), {"tracking.uri": params.tracking.uri, "train.lr": 0.5})
    with stage_run("ablate@collective-0", other, tmp_path) as tracker, ablate.in_sweep(tracker, other, tmp_path,
                                                                                      "collective", 0) as p2:
        assert p2 != parent  # another sweep (a param every run shares changed): another parent


def test_learning_curve_has_a_column_per_curve_metric_and_zeros_for_missing_ones():
    from rlcr.train.loop import CURVE_COLUMNS, curve_frame

    frame = curve_frame([{"reward/mean": 0.5, "rollout/success": 0.25, "org/hires_verifier": 2.0}, {}])
    assert list(frame.columns) == ["iteration", *(c.replace("/", "_") for c in CURVE_COLUMNS)]
    assert list(frame["iteration"]) == [1, 2] and frame.loc[0, "rollout_success"] == 0.25
    assert frame.loc[0, "org_hires_verifier"] == 2.0 and frame.loc[1, "org_hires_verifier"] == 0.0


# ------------------------------------------------------------------------------------ end to end


def mlflow_runs(root: Path):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlcr-collective-rewards")
    children = client.search_runs([exp.experiment_id], "tags.`rlcr.stage` LIKE 'ablate@%'")
    parents = client.search_runs([exp.experiment_id], "tags.`rlcr.sweep` LIKE '%'")
    return children, parents


@pytest.mark.slow
def test_repro_of_the_matrix_on_the_quick_profile(quick_pipeline):
    from conftest import QUICK_VARIANTS

    # conftest's quick_pipeline ran `dvc repro ablate`: prepare -> bootstrap -> ablate@collective-0, ablate@no_verifiers-0
    root, variants, stdout = quick_pipeline["root"], QUICK_VARIANTS, quick_pipeline["ablate_stdout"]
    for v in variants:
        assert f"Running stage 'ablate@{v}-0'" in stdout
        assert (root / f"ablations/{v}__s0/policy/config.json").is_file()
        assert (root / f"ablations/{v}__s0/rollout.turns.parquet").is_file()
        assert (root / f"ablations/{v}__s0/start.turns.parquet").is_file()
        m = json.loads((root / f"metrics/ablations/{v}__s0.json").read_text())
        assert m["variant"] == v and m["seed"] == 0 and m["train/iterations"] == 1
        keys = {"train/success_first", "train/success_last", f"{v}/success", f"{v}/success_ci_low",
                f"{v}/success_ci_high", f"{v}/accuracy_per_1k_tokens", f"{v}/tasks", "start/success", "rl/success_diff",
                "rl/success_diff_ci_low", "rl/tasks"}
        assert keys <= set(m) and all(isinstance(m[k], float) for k in keys)
        # the start is models/bootstrap rolled out on the same tasks: the change is end minus start, paired
        start = pd.read_parquet(root / f"ablations/{v}__s0/start.parquet")
        end = pd.read_parquet(root / f"ablations/{v}__s0/rollout.parquet")
        assert sorted(start["task_id"]) == sorted(end["task_id"]) and m["rl/tasks"] == m[f"{v}/tasks"]
        assert m["rl/success_diff"] == pytest.approx(m[f"{v}/success"] - m["start/success"])
        assert m["start/success"] == pytest.approx((start["outcome"] >= 1).mean())
        header = (root / f"plots/ablations/{v}__s0.csv").read_text().splitlines()[0]
        from rlcr.train.loop import CURVE_COLUMNS

        assert header == ",".join(["iteration", *(c.replace("/", "_") for c in CURVE_COLUMNS)])
    assert not list((root / "ablations").glob(".*.tmp"))

    # the report reads them: one row per run in its ablation table, the causal Q3 pair
    from rlcr import report

    sources = report.Sources.load(root, {"min_tasks_for_claim": 20, "noninferiority_margin": 0.05})
    table = report.ablation_table(sources)
    assert [r.split("|")[1].strip() for r in table[4:]] == [f"`{v}`" for v in variants]
    assert "Ablation (causal)" in "\n".join(report.q3(sources).body)

    # MLflow: one run per variant x seed, tagged, all nested under one parent run
    children, parents = mlflow_runs(root)
    assert sorted(r.data.tags["ablation"] for r in children) == variants
    assert {r.data.tags["seed"] for r in children} == {"0"} and {r.info.status for r in children} == {"FINISHED"}
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    from rlcr.tracking import HEADLINE_KEYS

    for r in children:  # the compare view's keys: the same few in every child, the curve under train/
        keys = set(r.data.metrics)
        assert {"eval/success", "eval/success_ci_low", "eval/tokens", "eval/critical_path_ratio"} <= keys, keys
        assert keys <= set(HEADLINE_KEYS) | {k for k in keys if k.startswith("train/")} | {"rollout/seconds"}, keys
        assert len(keys) <= 45 and "train/rollout/success" in keys and r.data.params["variant"] in variants
    assert "variant" in parents[0].data.tags["mlflow.note.content"] and "collective/success_mean" in parents[0].data.metrics

    # every rlcr module the stage imported is a declared dependency (docs/reliability.md, item 10)
    deps = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["ablate"]["deps"]
    imported = json.loads((root / "imports_ablate.json").read_text())
    missing = [m for m in imported if not any(m == d or m.startswith(d.rstrip("/") + "/") for d in deps)]
    assert "rlcr/ablate.py" in imported and not missing, f"stage imports modules dvc.yaml does not list: {missing}"

    again = dvc(root, "repro", "ablate")
    assert "Running stage" not in again.stdout and "didn't change, skipping" in again.stdout
    assert len(mlflow_runs(root)[0]) == 2
