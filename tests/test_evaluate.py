"""Evaluation numbers checked against values computed by hand from real and synthetic rollouts."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from rlcr.behaviour import behaviour_metrics
from rlcr.config import OrgConfig
from rlcr.evaluate import TABLE_COLUMNS, EvalSpec, RunFrames, evaluate, form_decomposition, nest, org_form
from rlcr.org import run_episodes
from rlcr.org.records import EpisodeRecord, EpisodeRow, read_parquet, write_parquet
from rlcr.org.scripted import ScriptedOrg
from rlcr.stats import bootstrap_ci, paired_diff_ci
from rlcr.tasks import build_family

G = 3  # episodes per task
TASKS = (build_family("sum").generate(0, 6, 1) + build_family("sum").generate(0, 6, 3)
         + build_family("signed_sum").generate(1, 4, 3))


def rollout(style: str, error_rate: float, single: bool) -> list[EpisodeRecord]:
    tasks = [t for t in TASKS for _ in range(G)]
    ids = [f"{t.id}#{g}" for t in TASKS for g in range(G)]
    return run_episodes(tasks, ScriptedOrg(style, error_rate=error_rate, seed=1), OrgConfig(single_agent=single),
                        episode_ids=ids)


@pytest.fixture(scope="module")
def records() -> dict[str, list[EpisodeRecord]]:
    # a trained company that makes no mistakes; no trained single agent yet (absent, not an error)
    return {"bootstrap__company": rollout("verify", 0.15, False), "bootstrap__single": rollout("solo", 0.15, True),
            "trained__company": rollout("verify", 0.0, False)}


@pytest.fixture(scope="module")
def ev(records):
    return evaluate({k: RunFrames.from_records(v) for k, v in records.items()}, EvalSpec(n_resamples=500))


# hand computation, straight from the records (no frames, no pandas)
def difficulty(rec: EpisodeRecord) -> int:
    return json.loads(rec.episode.task)["difficulty"]


def success(rec: EpisodeRecord) -> float:
    return 1.0 if rec.episode.outcome >= 1 else 0.0


def avg(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


def per_task(recs, value) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in recs:
        out.setdefault(r.episode.task_id, []).append(value(r))
    return out


def test_scripted_rollouts_give_the_expected_shape(records):
    comp, single = records["bootstrap__company"], records["bootstrap__single"]
    assert len(comp) == len(single) == G * len(TASKS)
    assert all(r.episode.mode == "single" and r.episode.critical_path_tokens == r.episode.total_tokens for r in single)
    assert any(r.episode.n_agents > 1 for r in comp)
    assert 0 < avg(map(success, single)) < avg(map(success, comp)) < 1  # errors hurt, verifiers help
    assert avg(map(success, records["trained__company"])) == 1.0


def test_run_success_cost_and_time_match_hand_counts(records, ev):
    for run, recs in records.items():
        m = ev.metrics
        assert m[f"{run}/success"] == pytest.approx(avg(map(success, recs)))
        assert m[f"{run}/episodes"] == len(recs) and m[f"{run}/tasks"] == len(TASKS)
        assert m[f"{run}/tokens"] == pytest.approx(avg(r.episode.total_tokens for r in recs))
        assert m[f"{run}/critical_path_tokens"] == pytest.approx(avg(r.episode.critical_path_tokens for r in recs))
        assert m[f"{run}/seconds"] == pytest.approx(avg(r.episode.seconds for r in recs))
        assert m[f"{run}/accuracy_per_1k_tokens"] == pytest.approx(
            1000 * sum(map(success, recs)) / sum(r.episode.total_tokens for r in recs))
        ci = bootstrap_ci(per_task(recs, success), n_resamples=500, seed=0)
        assert (m[f"{run}/success_ci_low"], m[f"{run}/success_ci_high"]) == (ci.low, ci.high)
        assert m[f"{run}/success_ci_low"] <= m[f"{run}/success"] <= m[f"{run}/success_ci_high"]


def test_family_difficulty_and_length_groups(records, ev):
    recs, m = records["bootstrap__single"], ev.metrics
    for fam in ("sum", "signed_sum"):
        part = [r for r in recs if r.episode.family == fam]
        assert m[f"bootstrap__single/family/{fam}/success"] == pytest.approx(avg(map(success, part)))
        assert m[f"bootstrap__single/family/{fam}/episodes"] == len(part)
    for d in (1, 3):
        part = [r for r in recs if difficulty(r) == d]
        assert m[f"bootstrap__single/difficulty/{d}/success"] == pytest.approx(avg(map(success, part)))
        assert m[f"bootstrap__single/difficulty/{d}/tokens"] == pytest.approx(avg(r.episode.total_tokens for r in part))
    short = [r for r in recs if difficulty(r) <= 1]
    long = [r for r in recs if difficulty(r) >= 3]
    assert m["bootstrap__single/short/success"] == pytest.approx(avg(map(success, short)))
    assert m["bootstrap__single/long/success"] == pytest.approx(avg(map(success, long)))
    assert m["bootstrap__single/long/tasks"] == 10
    assert "bootstrap__single/difficulty/2/success" not in m


def test_behaviour_metrics_are_the_runs_aggregates(records, ev):
    beh = behaviour_metrics(records["bootstrap__company"])
    for key in ("org/hires_verifier", "behaviour/false_approval_rate", "behaviour/idle_share", "time/critical_path_ratio"):
        assert ev.metrics[f"bootstrap__company/{key}"] == pytest.approx(beh[key])
    assert ev.metrics["bootstrap__company/org/hires_verifier"] > 0 and ev.metrics["bootstrap__single/org/hires"] == 0


def test_company_vs_single_paired_by_task(records, ev):
    comp, single, m = records["bootstrap__company"], records["bootstrap__single"], ev.metrics
    key = "compare/company_vs_single/bootstrap"
    assert m[f"{key}/success_diff"] == pytest.approx(avg(map(success, comp)) - avg(map(success, single)))
    ci = paired_diff_ci(per_task(comp, success), per_task(single, success), n_resamples=500, seed=0)
    assert (m[f"{key}/success_diff_ci_low"], m[f"{key}/success_diff_ci_high"]) == (ci.low, ci.high)
    assert m[f"{key}/critical_path_ratio"] == pytest.approx(
        avg(r.episode.critical_path_tokens for r in comp) / avg(r.episode.total_tokens for r in single))
    assert m[f"{key}/critical_path_ratio_ci_low"] <= m[f"{key}/critical_path_ratio"] <= m[f"{key}/critical_path_ratio_ci_high"]
    assert m[f"{key}/tokens_ratio"] == pytest.approx(avg(r.episode.total_tokens for r in comp)
                                                     / avg(r.episode.total_tokens for r in single))
    # two-term tasks: the scripted CEO answers alone in both orgs, with the same seeded errors
    assert (m[f"{key}/short/success_diff"], m[f"{key}/short/success_diff_ci_low"], m[f"{key}/short/success_diff_ci_high"]) == (0, 0, 0)
    long_c = [r for r in comp if difficulty(r) >= 3]
    long_s = [r for r in single if difficulty(r) >= 3]
    assert m[f"{key}/long/success_diff"] == pytest.approx(avg(map(success, long_c)) - avg(map(success, long_s)))


def test_trained_vs_bootstrap_and_missing_runs_are_absent(records, ev):
    m = ev.metrics
    key = "compare/trained_vs_bootstrap/company"
    assert m[f"{key}/success_trained"] == 1.0
    assert m[f"{key}/success_diff"] == pytest.approx(1.0 - avg(map(success, records["bootstrap__company"])))
    assert m[f"{key}/success_diff_ci_low"] > 0  # the error-free company is better, and the interval says so
    assert not any(k.startswith(("trained__single", "compare/trained_vs_bootstrap/single",
                                 "compare/company_vs_single/trained")) for k in m)


def test_output_is_plain_floats_a_tidy_table_and_deterministic(records, ev):
    assert all(type(v) is float and math.isfinite(v) for v in ev.metrics.values())
    json.dumps(ev.metrics)
    nested = ev.nested()
    assert nested["bootstrap__company"]["family"]["sum"]["success"] == ev.metrics["bootstrap__company/family/sum/success"]
    t = ev.table
    assert list(t.columns) == list(TABLE_COLUMNS)
    assert set(t["run"]) == set(records) and set(t["group"]) == {"all", "family", "difficulty", "length", "verifiers", "form"}
    row = t[(t.run == "bootstrap__single") & (t.group == "family") & (t.value == "signed_sum")].iloc[0]
    assert row.success == ev.metrics["bootstrap__single/family/signed_sum/success"] and row.org == "single"
    again = evaluate({k: RunFrames.from_records(v) for k, v in records.items()}, EvalSpec(n_resamples=500))
    assert again.metrics == ev.metrics


def test_parquet_round_trip_gives_the_same_numbers(records, tmp_path):
    recs = records["bootstrap__company"]
    write_parquet(recs, tmp_path / "t.parquet", tmp_path / "e.parquet")
    back = RunFrames(episodes=pd.read_parquet(tmp_path / "e.parquet"), turns=pd.read_parquet(tmp_path / "t.parquet"))
    spec = EvalSpec(n_resamples=200)
    assert evaluate({"x__company": back}, spec).metrics == evaluate({"x__company": RunFrames.from_records(recs)}, spec).metrics
    assert len(read_parquet(tmp_path / "t.parquet", tmp_path / "e.parquet")) == len(recs)


def test_the_length_cut_is_a_parameter(records):
    runs = {"bootstrap__single": RunFrames.from_records(records["bootstrap__single"])}
    m = evaluate(runs, EvalSpec(short_max=1, long_min=4, n_resamples=100)).metrics
    assert "bootstrap__single/short/success" in m and "bootstrap__single/long/success" not in m
    m = evaluate(runs, EvalSpec(short_max=3, long_min=4, n_resamples=100)).metrics
    assert m["bootstrap__single/short/episodes"] == len(records["bootstrap__single"])
    with pytest.raises(ValueError, match="both short and long"):
        EvalSpec(short_max=2, long_min=2)


# ------------------------------------------------------------------------------- synthetic frames


def synthetic(rate_by_task: dict[int, float], episodes_per_task: int = 5, mode: str = "company") -> RunFrames:
    """Episodes whose outcomes are set directly: a task with rate r has round(r * n) successes."""
    task = build_family("sum").generate(9, 1, 2)[0].to_row()
    rows = []
    for i, rate in rate_by_task.items():
        wins = round(rate * episodes_per_task)
        for g in range(episodes_per_task):
            row = dict(task, id=f"t{i}")
            rows.append(EpisodeRow(episode_id=f"t{i}#{g}", task_id=f"t{i}", family="sum", task=json.dumps(row),
                                   mode=mode, outcome=1.0 if g < wins else 0.0, total_tokens=100,
                                   critical_path_tokens=40 if mode == "company" else 100, seconds=1.0))
    return RunFrames(episodes=RunFrames.from_records([EpisodeRecord(r) for r in rows]).episodes)  # no turns


def test_synthetic_runs_with_known_success_rates():
    company = synthetic({i: (0.8 if i % 2 else 0.4) for i in range(40)})  # 0.6 overall
    single = synthetic({i: (0.6 if i % 2 else 0.2) for i in range(40)}, mode="single")  # 0.4 overall
    m = evaluate({"p__company": company, "p__single": single}, EvalSpec(n_resamples=1000)).metrics
    assert m["p__company/success"] == pytest.approx(0.6) and m["p__single/success"] == pytest.approx(0.4)
    assert m["p__company/accuracy_per_1k_tokens"] == pytest.approx(6.0)
    key = "compare/company_vs_single/p"
    assert m[f"{key}/success_diff"] == pytest.approx(0.2)
    assert m[f"{key}/success_diff_ci_low"] < 0.2 < m[f"{key}/success_diff_ci_high"]
    # every task is 0.2 better, half the tasks one way, half the other: the paired CI stays tight
    assert m[f"{key}/success_diff_ci_high"] - m[f"{key}/success_diff_ci_low"] < 0.15
    assert (m[f"{key}/critical_path_ratio"], m[f"{key}/critical_path_ratio_ci_low"]) == (0.4, 0.4)
    assert not any("/org/" in k for k in m)  # no turn frames given: no behaviour metrics


def test_certain_success_has_a_zero_width_interval_and_empty_runs_are_harmless():
    m = evaluate({"p__company": synthetic({i: 1.0 for i in range(10)}),
                  "q__company": RunFrames(episodes=synthetic({}).episodes)}).metrics
    assert (m["p__company/success_ci_low"], m["p__company/success_ci_high"]) == (1.0, 1.0)
    assert m["q__company/episodes"] == 0.0 and "q__company/success" not in m
    assert evaluate({}).metrics == {} and evaluate({}).table.empty


def test_nest_refuses_clashing_keys():
    assert nest({"a/b": 1.0, "a/c": 2.0}) == {"a": {"b": 1.0, "c": 2.0}}
    with pytest.raises(ValueError, match="clashes"):
        nest({"a": 1.0, "a/b": 2.0})


def test_transfer_families_are_kept_apart_from_every_headline_figure(records):
    probe = build_family("rg/gcd").generate(0, 3, 1)
    runs = {}
    for run, recs in records.items():
        extra = run_episodes(probe, ScriptedOrg("solo", seed=1), OrgConfig(single_agent=run.endswith("single")),
                             episode_ids=[f"{t.id}#p" for t in probe])
        runs[run] = RunFrames.from_records(recs + extra)
    plain = evaluate({k: RunFrames.from_records(v) for k, v in records.items()}, EvalSpec(n_resamples=200))
    apart = evaluate(runs, EvalSpec(n_resamples=200), trained=frozenset({"sum", "signed_sum"}))
    mixed = evaluate(runs, EvalSpec(n_resamples=200))
    key = "bootstrap__company/success"
    assert apart.metrics[key] == plain.metrics[key] != mixed.metrics[key]  # probes do not dilute it
    assert apart.metrics["compare/company_vs_single/bootstrap/tasks"] == len(TASKS)
    assert apart.metrics["bootstrap__company/transfer/episodes"] == len(probe)
    assert "bootstrap__company/transfer/family/rg/gcd/success" in apart.metrics
    assert not any("/family/rg/" in k and "/transfer/" not in k for k in apart.metrics)


def test_company_vs_single_per_difficulty(records, ev):
    comp, single, m = records["bootstrap__company"], records["bootstrap__single"], ev.metrics
    key = "compare/company_vs_single/bootstrap"
    for d in sorted({difficulty(r) for r in comp}):
        c = [r for r in comp if difficulty(r) == d]
        s = [r for r in single if difficulty(r) == d]
        assert m[f"{key}/difficulty/{d}/success_diff"] == pytest.approx(avg(map(success, c)) - avg(map(success, s)))
        assert m[f"{key}/difficulty/{d}/tasks"] == len({r.episode.task_id for r in c})


def test_org_form_names_the_organisation_an_org_chart_describes():
    ceo = {"agent": 0, "role": "ceo", "parent": -1}
    assert org_form(json.dumps([ceo])) == "alone"
    assert org_form(json.dumps([ceo, {"agent": 1, "role": "worker", "parent": 0},
                                {"agent": 2, "role": "lead", "parent": 0}])) == "delegate"
    assert org_form(json.dumps([ceo, {"agent": 1, "role": "worker", "parent": 0},
                                {"agent": 2, "role": "tester", "parent": 1}])) == "verify"


def form_table(cells: list[tuple[str, int, int, int]], mode: str = "company") -> pd.DataFrame:
    """(form, difficulty, tasks, successes) -> one episode per task, task ids numbered per difficulty."""
    rows, seen = [], {}
    for form, d, n, wins in cells:
        for i in range(n):
            k = seen.get(d, 0)
            seen[d] = k + 1
            rows.append({"task_id": f"d{d}t{k}", "form": form, "difficulty": d, "success": float(i < wins), "mode": mode})
    return pd.DataFrame(rows)


def test_a_change_of_organisation_and_a_change_within_it_add_up_to_the_difference():
    spec = EvalSpec(n_resamples=400)
    # the baseline solves its 2-term tasks alone; on 4-term ones it works alone (8 of 10) or delegates (2 of 10);
    # the other company works every 4-term task alone, as well as the baseline did alone: all of the gain is the shift
    base = form_table([("alone", 1, 20, 20), ("alone", 3, 10, 8), ("delegate", 3, 10, 2)])
    other = form_table([("alone", 1, 20, 20), ("alone", 3, 20, 16)])
    m = form_decomposition(other, base, spec)
    assert m["form_shift"] == pytest.approx(0.15) and m["within_form"] == pytest.approx(0.0)
    for k in ("form_shift", "within_form"):
        assert m[f"{k}_ci_low"] <= m[k] <= m[f"{k}_ci_high"]
    # the same organisations, better in one of them: all of it is within
    better = form_table([("alone", 1, 20, 20), ("alone", 3, 10, 10), ("delegate", 3, 10, 2)])
    m = form_decomposition(better, base, spec)
    assert m["form_shift"] == pytest.approx(0.0) and m["within_form"] == pytest.approx(0.05)
    # an organisation the baseline never built counts as a shift, at its own success
    base = form_table([("alone", 1, 20, 20), ("alone", 3, 20, 16)])
    new = form_table([("alone", 1, 20, 20), ("alone", 3, 10, 8), ("verify", 3, 10, 10)])
    m = form_decomposition(new, base, spec)
    assert m["form_shift"] == pytest.approx(0.05) and m["within_form"] == pytest.approx(0.0)


def test_company_comparisons_carry_the_split_and_each_run_its_organisations(ev, records):
    m = ev.metrics
    # both scripted companies verify every sum of more than two terms: no change of organisation
    key = "compare/trained_vs_bootstrap/company"
    assert m[f"{key}/form_shift"] == 0.0
    assert m[f"{key}/within_form"] == pytest.approx(m[f"{key}/success_diff"])
    shares = {f: m.get(f"bootstrap__company/form/{f}/share", 0.0) for f in ("alone", "delegate", "verify")}
    assert sum(shares.values()) == pytest.approx(1.0) and shares["verify"] > 0
    hand = per_task(records["bootstrap__company"], success)
    assert m["bootstrap__company/form/verify/episodes"] == sum(
        len(json.loads(r.episode.org_chart)) > 1 for r in records["bootstrap__company"])
    assert len(hand) == len(TASKS)
    # company against single agent: no split (a single agent builds no organisation)
    assert not any(k.startswith("compare/company_vs_single/") and "form_shift" in k for k in m)
