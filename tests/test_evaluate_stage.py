"""The `evaluate` stage on real (scripted) rollout files, and the statistics it adds, on data whose
answer is known: CIs cover the truth, company vs single has the known sign, behaviour rates pool."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlcr import io
from rlcr.config import OrgConfig, load_params
from rlcr.evaluate import EvalSpec, RunFrames, evaluate, plot_frames, rate_diff_ci, read_run, run_table
from rlcr.org import run_episodes
from rlcr.org.records import EpisodeRecord, EpisodeRow, to_frames
from rlcr.org.scripted import ScriptedOrg
from rlcr.tasks import build_family
from rlcr.tracking import NullTracker

ROOT = Path(__file__).resolve().parents[1]
TASKS = build_family("sum").generate(0, 8, 1) + build_family("sum").generate(0, 8, 3)
# (style, worker error rate, verifier rubber-stamp rate, single agent)
SCRIPTS = {"bootstrap__company": ("verify", 0.2, 0.5, False), "bootstrap__single": ("solo", 0.2, 0.0, True),
           "trained__company": ("verify", 0.0, 0.0, False), "trained__single": ("solo", 0.1, 0.0, True)}


def scripted(run: str, tasks=TASKS, repeats: int = 2) -> list[EpisodeRecord]:
    style, err, stamp, single = SCRIPTS[run]
    tasks = [t for t in tasks for _ in range(repeats)]
    ids = [f"{t.id}#{k}" for t in tasks[::repeats] for k in range(repeats)]
    return run_episodes(tasks, ScriptedOrg(style, error_rate=err, rubber_stamp=stamp, seed=3), OrgConfig(single_agent=single),
                        episode_ids=ids)


def write_rollouts(root: Path, runs=tuple(SCRIPTS)) -> dict[str, list[EpisodeRecord]]:
    """data/rollouts/<run>.{parquet,turns.parquet,timing.parquet} as the rollout stage writes them, and
    data/tasks/train.parquet (the trained families the stage keeps apart from transfer probes)."""
    from rlcr.tasks.suite import to_frame

    io.write_parquet(to_frame(build_family("sum").generate(1, 8, 1), "train"), root / "data/tasks/train.parquet")
    out = {}
    for run in runs:
        records = scripted(run)
        turns, episodes = to_frames(records)
        timing = pd.DataFrame({"episode_id": episodes["episode_id"], "seconds": 0.01 * (1 + np.arange(len(episodes)))})
        io.write_parquet(episodes.assign(seconds=0.0), root / f"data/rollouts/{run}.parquet")
        io.write_parquet(turns, root / f"data/rollouts/{run}.turns.parquet")
        io.write_parquet(timing, root / f"data/rollouts/{run}.timing.parquet")
        out[run] = records
    return out


def run_stage_body(root: Path, **overrides) -> dict[str, float]:
    import sys

    sys.path.insert(0, str(ROOT / "stages"))
    import evaluate as stage  # stages/evaluate.py

    params = load_params(ROOT / "params.yaml", {"tracking.enabled": False, **overrides})
    stage.body(params, NullTracker(), root)
    return json.loads((root / "metrics/eval.json").read_text())


def frames(rates: dict[str, float], n: int, mode: str, tokens: int = 100, cp: int = 100) -> RunFrames:
    """n tasks x 4 episodes, task i succeeding in round(4 * rate) of its episodes."""
    row = build_family("sum").generate(9, 1, 2)[0].to_row()
    rows = []
    for i in range(n):
        wins = round(4 * rates[i % len(rates)])
        for g in range(4):
            rows.append(EpisodeRow(episode_id=f"t{i}#{g}", task_id=f"t{i}", family="sum", task=json.dumps(dict(row, id=f"t{i}")),
                                   mode=mode, outcome=float(g < wins), total_tokens=tokens, critical_path_tokens=cp))
    return RunFrames(episodes=to_frames([EpisodeRecord(r) for r in rows])[1])


# --------------------------------------------------------------------------------- statistics


def test_intervals_cover_the_true_rate_in_most_repetitions():
    # tasks with true success p drawn around 0.5: the 90% CI should cover the population mean ~90% of the time
    rng = np.random.default_rng(0)
    covered = 0
    for rep in range(40):
        p = rng.uniform(0.2, 0.8, size=30)
        rates = list(rng.binomial(4, p) / 4)
        m = evaluate({"x__company": frames(rates, 30, "company")}, EvalSpec(n_resamples=300, level=0.9, seed=rep)).metrics
        covered += m["x__company/success_ci_low"] <= 0.5 <= m["x__company/success_ci_high"]
    assert 30 <= covered <= 40


def test_company_vs_single_has_the_known_sign_and_time_ratio():
    company = frames([0.75, 0.5], 30, "company", tokens=200, cp=50)
    single = frames([0.25, 0.5], 30, "single", tokens=100, cp=100)
    m = evaluate({"p__company": company, "p__single": single}, EvalSpec(n_resamples=500)).metrics
    k = "compare/company_vs_single/p/"
    assert m[k + "success_diff"] == pytest.approx(0.25) and m[k + "success_diff_ci_low"] > 0
    assert m[k + "critical_path_ratio"] == pytest.approx(0.5) and m[k + "tokens_ratio"] == pytest.approx(2.0)
    # per 1k tokens: company 0.625 successes per 200 tokens, single 0.375 per 100
    assert m["p__company/accuracy_per_1k_tokens"] == pytest.approx(3.125)
    assert m["p__single/accuracy_per_1k_tokens_ci_low"] <= 3.75 <= m["p__single/accuracy_per_1k_tokens_ci_high"]
    # and the reverse comparison flips the sign (no company/single asymmetry in the code)
    m2 = evaluate({"p__company": frames([0.25, 0.5], 30, "company"), "p__single": frames([0.75, 0.5], 30, "single")},
                  EvalSpec(n_resamples=500)).metrics
    assert m2[k + "success_diff"] == pytest.approx(-0.25) and m2[k + "success_diff_ci_high"] < 0


def test_rate_difference_pools_counts_and_drops_empty_denominators():
    a = pd.DataFrame({"task_id": ["a", "a", "b", "c"], "num": [1, 1, 0, 0], "den": [2, 2, 0, 4]})
    b = pd.DataFrame({"task_id": ["a", "b", "c"], "num": [0, 0, 1], "den": [2, 1, 4]})
    d = rate_diff_ci(a, b, "num", "den", EvalSpec(n_resamples=400))
    assert d.estimate == pytest.approx(2 / 8 - 1 / 7) and d.low <= d.estimate <= d.high and d.n_tasks == 3
    assert rate_diff_ci(a, b.assign(den=0), "num", "den", EvalSpec(n_resamples=10)) is None


# --------------------------------------------------------------------------- real scripted files


@pytest.fixture(scope="module")
def rolled(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    return root, write_rollouts(root)


def test_read_run_takes_real_seconds_from_the_timing_table(rolled):
    root, records = rolled
    run = read_run(root / "data/rollouts", "bootstrap__company")
    assert run.turns is not None and len(run.episodes) == len(records["bootstrap__company"])
    assert run.episodes["seconds"].iloc[1] == pytest.approx(0.02)
    assert read_run(root / "data/rollouts", "nobody__company") is None
    timing = root / "data/rollouts/bootstrap__company.timing.parquet"
    broken = root / "broken"
    broken.mkdir()
    for suffix in (".parquet", ".turns.parquet"):
        (broken / f"x{suffix}").write_bytes((root / f"data/rollouts/bootstrap__company{suffix}").read_bytes())
    io.write_parquet(pd.read_parquet(timing).iloc[1:], broken / "x.timing.parquet")
    with pytest.raises(ValueError, match="lacks episodes"):
        read_run(broken, "x")


def test_behaviour_rates_with_intervals_and_the_verifier_cut(rolled):
    root, records = rolled
    table, beh = run_table(read_run(root / "data/rollouts", "bootstrap__company"))
    checked, false = table["approvals_checked"].sum(), table["false_approvals"].sum()
    assert checked > 0 and false > 0  # rubber-stamping verifiers approve wrong claims
    m = evaluate({"bootstrap__company": read_run(root / "data/rollouts", "bootstrap__company")},
                 EvalSpec(n_resamples=300)).metrics
    assert m["bootstrap__company/behaviour/false_approval_rate"] == pytest.approx(false / checked)
    assert m["bootstrap__company/behaviour/false_approval_rate_ci_low"] <= false / checked
    hired = int((table["verifiers"] > 0).sum())
    assert m["bootstrap__company/verifiers/hired/episodes"] == hired
    assert m["bootstrap__company/verifiers/hired/episodes"] + m["bootstrap__company/verifiers/none/episodes"] == len(table)


def test_stage_writes_metrics_table_and_plots_and_skips_missing_runs(rolled, tmp_path, capsys):
    root, records = rolled
    m = run_stage_body(root, **{"rollout.policies": ["bootstrap", "trained", "never"], "evaluate.n_resamples": 200})
    assert "never__company, never__single" in capsys.readouterr().out
    assert m["eval/runs"] == 4 and m["eval/level"] == 0.95 and m["eval/n_resamples"] == 200
    assert m["bootstrap__single/seconds"] > 0  # real seconds came from the timing table
    assert m["compare/company_vs_single/trained/success_diff_ci_low"] > 0  # error-free company vs erring single
    assert m["compare/trained_vs_bootstrap/company/false_approval_rate_diff_ci_high"] < 0  # no more rubber stamps
    for fam in ("sum",):
        assert f"trained__company/family/{fam}/success" in m
    table = pd.read_csv(root / "plots/eval/table.csv")
    assert set(table["run"]) == set(SCRIPTS)
    fam = pd.read_csv(root / "plots/eval/success_by_family.csv")
    assert list(fam.columns[:4]) == ["family_run", "family", "run", "success"] and len(fam) == 4
    cp = pd.read_csv(root / "plots/eval/success_vs_critical_path.csv")
    assert {"critical_path_tokens", "success", "difficulty"} <= set(cp.columns)
    # plot tables are what plot_frames gives for the same numbers
    ev = evaluate({r: read_run(root / "data/rollouts", r) for r in SCRIPTS}, EvalSpec(n_resamples=200))
    assert plot_frames(ev)["success_by_family"]["success"].tolist() == pytest.approx(fam["success"].tolist())


def test_stage_without_any_rollout_writes_an_empty_evaluation(tmp_path):
    write_rollouts(tmp_path, runs=())  # the train split only
    m = run_stage_body(tmp_path)
    assert m["eval/runs"] == 0 and not any("__" in k for k in m)
    assert (tmp_path / "plots/eval/table.csv").exists()


@pytest.mark.parametrize(("key", "value", "why"), [
    ("evaluate.long_min", 1, "both short and long"), ("evaluate.level", 1.5, "must be in"),
    ("evaluate.n_resamples", 0, ">= 1"), ("report.min_tasks_for_claim", 0, ">= 1"),
    ("report.noninferiority_margin", 1.0, "must be in"), ("report.colour", "red", "unknown key")])
def test_bad_evaluate_and_report_params_name_the_key(key, value, why):
    from rlcr.config import ConfigError

    with pytest.raises(ConfigError, match=f"{key}.*{why}"):
        load_params(ROOT / "params.yaml", {key: value})
