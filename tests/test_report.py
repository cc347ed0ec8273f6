"""The report: every figure in report.md traces to a metrics file, verdicts follow the intervals,
missing inputs are said rather than crashed on, and `report` through real `dvc repro` reruns alone
when only a report param changes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_evaluate_stage import SCRIPTS, run_stage_body, scripted, write_rollouts

from rlcr import io
from rlcr.config import ReportConfig
from rlcr.report import PLOTS, Sources, build_report, fill, format_value, untraced_figures
from rlcr.rollout import rollout_frames, write_rollout

REPORT = dataclasses.asdict(ReportConfig())
VARIANTS = {"collective": (0.8, 40.0), "no_verifiers": (0.6, 20.0), "individual": (0.5, 15.0)}


def upstream(root: Path, ablations: bool = True) -> None:
    """What the stages before `report` write, made up where a real run would take minutes."""
    io.write_json({"eval_before/success": 0.25, "eval_after/success": 0.5, "eval/success_delta": 0.25,
                   "train/iterations": 3.0}, root / "metrics/train.json")
    io.write_json({"bootstrap/company/sampled": 0.3, "bootstrap/single/sampled": 0.2}, root / "metrics/bootstrap.json")
    curve = pd.DataFrame({"iteration": [1, 2, 3], "reward_mean": [0.2, 0.3, 0.5], "rollout_success": [0.2, 0.3, 0.5],
                          "org_size": [2.0, 3.0, 3.5], "behaviour_idle_share": [0.1, 0.05, 0.0]})
    with io.atomic_path(root / "plots/train.csv") as tmp:
        curve.to_csv(tmp, index=False)
    if not ablations:
        return
    for variant, (success, acc) in VARIANTS.items():
        for seed in (0, 1):
            m = {"variant": variant, "seed": seed, "train/success_first": 0.2, "train/success_last": success,
                 f"{variant}/success": success, f"{variant}/success_ci_low": success - 0.1,
                 f"{variant}/success_ci_high": success + 0.1, f"{variant}/accuracy_per_1k_tokens": acc + seed,
                 f"{variant}/accuracy_per_1k_tokens_ci_low": acc - 4, f"{variant}/accuracy_per_1k_tokens_ci_high": acc + 4,
                 f"{variant}/behaviour/false_approval_rate": 0.1, f"{variant}/behaviour/false_approval_rate_ci_low": 0.0,
                 f"{variant}/behaviour/false_approval_rate_ci_high": 0.2}
            io.write_json(m, root / f"metrics/ablations/{variant}__s{seed}.json")
            with io.atomic_path(root / f"plots/ablations/{variant}__s{seed}.csv") as tmp:
                curve.assign(rollout_success=curve["rollout_success"] * success).to_csv(tmp, index=False)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("report")
    write_rollouts(root)
    run_stage_body(root, **{"rollout.policies": ["bootstrap", "trained"], "evaluate.n_resamples": 300})
    upstream(root)
    return root


def report(root: Path, **params) -> tuple[str, list[dict]]:
    build_report(root, {**REPORT, **params}, root / "reports")
    return (root / "reports/report.md").read_text(), json.loads((root / "reports/report_sources.json").read_text())


def summary(text: str) -> dict[str, str]:
    """{Q1: answer, ...} from the summary table."""
    rows = [r for r in text.split("## Summary")[1].split("## Runs")[0].splitlines() if r.startswith("| Q")]
    return {r[2:4]: r.split("|")[2].strip().strip("*") for r in rows}


def test_every_figure_in_the_report_comes_from_a_metrics_file(project):
    text, spans = report(project)
    assert spans and not untraced_figures(text, spans)
    for s in spans:
        assert text[s["start"]:s["end"]] == s["text"]
        if s["file"] == "params.yaml":
            assert REPORT[s["key"].removeprefix("report.")] == s["value"]
        else:
            assert json.loads((project / s["file"]).read_text())[s["key"]] == s["value"], s
        assert format_value(s["value"], s["format"]) == s["text"]
    files = {s["file"] for s in spans}
    assert {"metrics/eval.json", "metrics/train.json", "metrics/bootstrap.json", "params.yaml"} <= files
    assert any(f.startswith("metrics/ablations/") for f in files)
    # a figure typed into the template is refused, not rendered
    with pytest.raises(ValueError, match="hand-written figures"):
        fill("success was 0.93", Sources({"params.yaml": {}}))


def test_summary_sections_plots_and_verdicts(project):
    text, _ = report(project, min_tasks_for_claim=1)
    answers = summary(text)
    assert set(answers) == {"Q1", "Q2", "Q3", "Q4", "Q5"}
    # the error-free trained company beats the erring bootstrap company on the same tasks
    m = json.loads((project / "metrics/eval.json").read_text())
    assert m["compare/trained_vs_bootstrap/company/success_diff_ci_low"] > 0 and answers["Q4"] == "yes"
    q4 = text.split("## Q4.")[1].split("\n## ")[0]  # and says what organisation each company was
    assert f"`trained__company` hires {m['trained__company/org/hires']:.2f} agents per episode" in q4
    # both scripted companies verify: the same organisation, so the whole difference is within it
    assert m["compare/trained_vs_bootstrap/company/form_shift"] == 0.0
    row = next(r for r in q4.splitlines() if r.startswith("| `trained__company` | "))
    assert row.count("1.00 [1.00, 1.00]") == 2  # alone and verify, all right
    assert "| run | alone: share, success | verify: share, success |" in q4  # no company delegated: no column
    assert "success in each) +0.00 [+0.00, +0.00]; from doing better within the same organisation +" in q4
    # scripted companies take longer (modelled time) than the one-line single agent: not faster
    assert m["compare/company_vs_single/trained/critical_path_ratio_ci_low"] > 1 and answers["Q1"] == "no"
    # ablation: collective's interval [36, 44] lies above no_verifiers' [16, 24] in both seeds
    assert answers["Q3"] == "yes"
    for name in PLOTS:
        assert (project / f"reports/{name}.png").stat().st_size > 1000 and f"]({name}.png)" in text
    assert "## Q5." in text and "| `collective` |" in text
    q5 = text.split("## Q5.")[1].split("\n## ")[0]  # sums only: the cheating counters say so plainly
    assert "Cheating counters: no code tasks in this run." in q5 and "tampering" not in q5


def test_too_few_tasks_means_no_claim(project):
    text, _ = report(project, min_tasks_for_claim=1000)
    answers = summary(text)
    assert answers["Q1"] == answers["Q4"] == "cannot say" and "fewer than 1000 tasks: no claim" in text


def test_missing_inputs_are_said_not_crashed_on(tmp_path):
    text, spans = report(tmp_path)
    assert not untraced_figures(text, spans)
    assert set(summary(text).values()) == {"no data"}
    assert "**Missing inputs**: `metrics/eval.json`, `metrics/train.json`, `metrics/bootstrap.json`." in text
    assert "No ablations yet" in text and "No evaluation yet" in text
    assert not list((tmp_path / "reports").glob("*.png"))

    # only the baseline rolled out, no ablations, no training: Q4 says there is no trained policy
    write_rollouts(tmp_path, runs=("bootstrap__company", "bootstrap__single"))
    run_stage_body(tmp_path, **{"evaluate.n_resamples": 100})
    text, spans = report(tmp_path)
    assert not untraced_figures(text, spans)
    answers = summary(text)
    assert answers["Q4"] == "no data" and "No trained policy has been rolled out yet" in text
    assert answers["Q1"] == "cannot say" and (tmp_path / "reports/org_charts.png").exists()


# -------------------------------------------------------------------------------- the DVC stages


@pytest.mark.slow
def test_evaluate_and_report_through_dvc_repro(project_copy):
    from mlflow import MlflowClient
    from test_stage_prepare import dvc

    root = project_copy
    # keep only evaluate and report, exactly as declared: their upstream outs are placed by hand
    spec = yaml.safe_load((root / "dvc.yaml").read_text())
    spec["stages"] = {k: spec["stages"][k] for k in ("evaluate", "report")}
    (root / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["rollout"]["policies"] = ["bootstrap", "trained"]
    params["evaluate"]["n_resamples"] = 200
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    write_rollouts(root)
    upstream(root)  # metrics/ablations and plots/ablations are deps of the report stage too
    write_rollout(rollout_frames(scripted("trained__company")), root / "ablations/collective__s0", "rollout")  # and ablations

    imported = {}
    for stage in ("evaluate", "report"):
        dvc(root, "repro", stage)
        imported[stage] = json.loads((root / "imports.json").read_text())
    m = json.loads((root / "metrics/eval.json").read_text())
    assert m["eval/runs"] == len(SCRIPTS) and "trained__company/success" in m
    text = (root / "reports/report.md").read_text()
    spans = json.loads((root / "reports/report_sources.json").read_text())
    assert not untraced_figures(text, spans) and (root / "reports/org_charts.png").exists()

    # every rlcr module each stage imported is a declared dependency
    for stage, files in imported.items():
        deps = spec["stages"][stage]["deps"]
        missing = [f for f in files if not any(f == d or f.startswith(d.rstrip("/") + "/") for d in deps)]
        assert f"rlcr/{stage}.py" in files and not missing, (stage, missing)

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlcr-collective-rewards")
    (run,) = client.search_runs([exp.experiment_id], "tags.`rlcr.stage` = 'report'")
    assert run.info.status == "FINISHED"
    assert {"report/report.md", "report/org_charts.png"} <= {a.path for a in client.list_artifacts(run.info.run_id, "report")}
    assert {"viewer/index.html", "viewer/standalone.html"} <= {a.path for a in client.list_artifacts(run.info.run_id, "viewer")}

    # nothing changed -> both skip; only a report param changed -> only report reruns
    assert "didn't change, skipping" in dvc(root, "repro", "report").stdout
    params["report"]["title"] = "Collective rewards, second look"
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    proc = dvc(root, "repro", "report")
    assert "Running stage 'report'" in proc.stdout and "Running stage 'evaluate'" not in proc.stdout
    assert (root / "reports/report.md").read_text().startswith("# Collective rewards, second look")
    # an evaluate param reruns evaluate, and report after it
    params["evaluate"]["level"] = 0.9
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    proc = dvc(root, "repro", "report")
    assert "Running stage 'evaluate'" in proc.stdout and "Running stage 'report'" in proc.stdout
    assert "90% confidence intervals" in (root / "reports/report.md").read_text()


def _seed_files(diffs: dict[int, float]) -> Sources:
    files = {}
    for seed, d in diffs.items():
        for variant, acc in (("collective", 10.0 + d), ("no_verifiers", 10.0)):
            files[f"metrics/ablations/{variant}__s{seed}.json"] = {
                "variant": variant, "seed": seed, f"{variant}/success": acc / 20, f"{variant}/accuracy_per_1k_tokens": acc,
                f"{variant}/accuracy_per_1k_tokens_ci_low": acc - 5, f"{variant}/accuracy_per_1k_tokens_ci_high": acc + 5}
    return Sources(files)


def test_ablation_answers_use_the_spread_across_seeds():
    from scipy import stats as st

    from rlcr.report import SEEDS, ablation_summary, q3

    # three seeds that agree: the per-seed intervals overlap, the across-seed t-interval does not include 0
    s = _seed_files({0: 2.0, 1: 2.5, 2: 3.0})
    s.files[SEEDS] = ablation_summary(s)
    key = "collective_vs_no_verifiers/accuracy_per_1k_tokens_diff"
    half = st.t.ppf(0.975, 2) * 0.5 / 3 ** 0.5
    assert s.files[SEEDS][f"{key}/mean"] == pytest.approx(2.5)
    assert s.files[SEEDS][f"{key}/ci_low"] == pytest.approx(2.5 - half)
    assert s.files[SEEDS]["collective/success/seeds"] == 3
    assert q3(s).answer == "yes"
    # seeds that disagree: no answer, whatever one seed says
    s = _seed_files({0: 6.0, 1: -4.0, 2: 1.0})
    s.files[SEEDS] = ablation_summary(s)
    assert q3(s).answer == "cannot say" and "includes zero" in q3(s).body[-1]


def test_the_rl_change_of_each_seed_and_across_seeds_reaches_q4_and_the_ablation_table():
    from rlcr.report import SEEDS, ablation_summary, ablation_table, q4_seeds

    files = {}
    for seed, (start, diff) in {0: (0.60, 0.10), 1: (0.55, 0.15), 2: (0.62, 0.08)}.items():
        files[f"metrics/ablations/collective__s{seed}.json"] = {
            "variant": "collective", "seed": seed, "train/iterations": 20.0, "train/success_first": 0.6,
            "train/success_last": 0.7, "collective/success": start + diff, "collective/success_ci_low": start + diff - 0.1,
            "collective/success_ci_high": start + diff + 0.1, "start/success": start, "start/success_ci_low": start - 0.1,
            "start/success_ci_high": start + 0.1, "rl/success_diff": diff, "rl/success_diff_ci_low": diff - 0.05,
            "rl/success_diff_ci_high": diff + 0.05, "rl/tasks": 128.0,
            # the change split: mostly from building other organisations
            "rl/form_shift": diff - 0.02, "rl/form_shift_ci_low": diff - 0.07, "rl/form_shift_ci_high": diff + 0.03,
            "rl/within_form": 0.02, "rl/within_form_ci_low": -0.03, "rl/within_form_ci_high": 0.07}
    s = Sources(files)
    s.files[SEEDS] = ablation_summary(s)
    assert s.files[SEEDS]["collective/rl_change/mean"] == pytest.approx(0.11)
    assert s.files[SEEDS]["collective/rl_change/min"] == pytest.approx(0.08) and s.files[SEEDS]["collective/rl_change/seeds"] == 3
    lines, evidence = q4_seeds(s)
    text = fill("\n".join(lines) + evidence, s)[0]
    assert sum(r.startswith("| `") for r in lines) == 3
    assert ("| `1` | 0.55 [0.45, 0.65] | 0.70 [0.60, 0.80] | +0.15 [+0.10, +0.20] | +0.13 [+0.08, +0.18] | "
            "+0.02 [-0.03, +0.07] | 128 |") in text
    assert "over 3 seeds (20 iterations): +0.11 [" in text
    assert s.files[SEEDS]["collective/rl_form_shift/mean"] == pytest.approx(0.09)
    assert "; from other organisations +0.09 [" in text and "within the same +0.02 [+0.02, +0.02]" in text
    table = fill("\n".join(ablation_table(s)), s)[0]
    assert "| `collective` | 0 | 0.60 | 0.70 | 0.60 [0.50, 0.70] | 0.70 [0.60, 0.80] | +0.10 [+0.05, +0.15] |" in table
    assert "| `collective` | 3 | 0.70 [0.70, 0.70] | 0.70 | 0.70 | +0.11 [+0.02, +0.20] | n/a |" in table
    # runs without a start rollout (older metrics): n/a in the table, nothing in Q4
    old = Sources({f: {k: v for k, v in d.items() if not k.startswith(("start/", "rl/"))} for f, d in files.items()})
    old.files[SEEDS] = ablation_summary(old)
    assert q4_seeds(old) == ([], "") and "| n/a | 0.70 [" in fill("\n".join(ablation_table(old)), old)[0]


def _q1_files(per_seed: dict[int, tuple[float, float, float, float]]) -> Sources:
    """Ablation files of `collective` and `no_hiring`: {seed: (company success, single success, company
    critical path, single tokens)}."""
    files = {}
    for seed, (sc, ss, pc, ps) in per_seed.items():
        for variant, success, path in (("collective", sc, pc), ("no_hiring", ss, ps)):
            files[f"metrics/ablations/{variant}__s{seed}.json"] = {
                "variant": variant, "seed": seed, f"{variant}/success": success, f"{variant}/success_ci_low": success - 0.1,
                f"{variant}/success_ci_high": success + 0.1, f"{variant}/critical_path_tokens": path}
    s = Sources({**files, "params.yaml": {f"report.{k}": v for k, v in REPORT.items()}})
    from rlcr.report import SEEDS, ablation_summary
    s.files[SEEDS] = ablation_summary(s)
    return s


def test_q1_is_answered_by_the_equally_trained_company_and_single_agent_across_seeds():
    from rlcr.report import SEEDS, q1_ablation

    # the company as good and faster on every seed: yes; its per-seed time ratio is the path over the single's tokens
    s = _q1_files({0: (0.70, 0.70, 10.0, 20.0), 1: (0.72, 0.70, 11.0, 20.0), 2: (0.71, 0.70, 9.0, 20.0)})
    assert s.files[SEEDS]["collective_vs_no_hiring/critical_path_ratio/mean"] == pytest.approx(0.5)
    answer, evidence, body = q1_ablation(s)
    assert answer == "yes" and "3 seeds" in fill(evidence, s)[0]
    assert sum(r.startswith("| `") for r in body) == 3  # a row per seed
    # slower on every seed: no, whatever the success
    assert q1_ablation(_q1_files({k: (0.8, 0.7, 30.0 + k, 20.0) for k in range(3)}))[0] == "no"
    # lower on every seed: no
    assert q1_ablation(_q1_files({k: (0.5 + k / 100, 0.7, 10.0, 20.0) for k in range(3)}))[0] == "no"
    # seeds that disagree on time: cannot say
    assert q1_ablation(_q1_files({0: (0.7, 0.7, 10.0, 20.0), 1: (0.7, 0.7, 30.0, 20.0), 2: (0.7, 0.7, 20.0, 20.0)}))[0] \
        == "cannot say"
    # one seed: no across-seed answer, the rollouts answer Q1 as before
    assert q1_ablation(_q1_files({0: (0.7, 0.7, 10.0, 20.0)})) is None


def test_organisation_table_gives_each_role_its_counts_and_n_a_without_any():
    from rlcr.report import EVAL, organisation_table

    run = {"success": 0.5, "org/hires": 1.25, "org/hires_total": 160.0, "org/hires_verifier": 0.45,
           "org/hires_tester": 0.0, "org/depth": 0.39}
    skills = {"ceo": (221.0, 277.0, 4.0, 48.0), "worker": (101.0, 108.0, 0.0, 0.0), "verifier": (0.0, 0.0, 0.0, 0.0)}
    for role, (right, n, c_right, c_n) in skills.items():
        run |= {f"skill/{role}/correct_turns_total": right, f"skill/{role}/turns_total": n,
                f"skill/{role}/turn_correct": right / n if n else 0.0, f"skill/{role}/combines_correct_total": c_right,
                f"skill/{role}/combines_total": c_n, f"skill/{role}/combine_correct": c_right / c_n if c_n else 0.0}
    s = Sources({EVAL: {f"bootstrap__company/{k}": v for k, v in run.items()} | {"bootstrap__single/success": 0.7}})
    text, spans = fill("\n".join(organisation_table(s)), s)
    header, _, row = text.splitlines()  # the single agent hires nobody: no row
    assert header.count("|") == row.count("|") and untraced_figures(text, spans) == []
    assert row == ("| `bootstrap__company` | 1.25 (160) | 0.45 / 0.00 | 0.39 | 0.80 (221 of 277) | 0.08 (4 of 48) | "
                   "0.94 (101 of 108) | n/a |")  # no verifier turn: n/a, not 0.00


def _q2_files(per_seed: dict[int, tuple[float, float, float, float]]) -> Sources:
    """Ablation files of `collective` and `no_hiring` with short and long tasks: {seed: (company short path,
    single short tokens, company long path, single long tokens)}."""
    from rlcr.report import SEEDS, ablation_summary

    files = {}
    for seed, (cs, ss, cl, sl) in per_seed.items():
        for variant, short, long in (("collective", cs, cl), ("no_hiring", ss, sl)):
            files[f"metrics/ablations/{variant}__s{seed}.json"] = {
                "variant": variant, "seed": seed, f"{variant}/success": 0.7, f"{variant}/short/success": 0.8,
                f"{variant}/long/success": 0.6, f"{variant}/short/critical_path_tokens": short,
                f"{variant}/long/critical_path_tokens": long}
    s = Sources({**files, "params.yaml": {f"report.{k}": v for k, v in REPORT.items()}})
    s.files[SEEDS] = ablation_summary(s)
    return s


def test_q2_is_answered_by_the_equally_trained_agents_short_tasks_across_seeds():
    from rlcr.report import SEEDS, q2_ablation

    # slower on short tasks on every seed: the overhead eats the gain, whatever the long tasks do
    s = _q2_files({0: (12.0, 10.0, 20.0, 40.0), 1: (13.0, 10.0, 21.0, 40.0), 2: (12.5, 10.0, 19.0, 40.0)})
    assert s.files[SEEDS]["collective_vs_no_hiring/short/critical_path_ratio/mean"] == pytest.approx(1.25)
    assert s.files[SEEDS]["collective_vs_no_hiring/long/critical_path_ratio/mean"] == pytest.approx(0.5)
    answer, evidence, body = q2_ablation(s)
    assert answer == "yes" and "3 seeds" in fill(evidence, s)[0]
    text, spans = fill("\n".join(body), s)
    assert sum(r.startswith("| `") for r in body) == 3 and untraced_figures(text, spans) == []
    # faster on every seed: no; seeds that disagree: cannot say; one seed: the rollouts answer
    assert q2_ablation(_q2_files({k: (8.0 + k / 10, 10.0, 20.0, 40.0) for k in range(3)}))[0] == "no"
    assert q2_ablation(_q2_files({0: (8.0, 10.0, 1, 1), 1: (12.0, 10.0, 1, 1), 2: (10.0, 10.0, 1, 1)}))[0] == "cannot say"
    assert q2_ablation(_q2_files({0: (8.0, 10.0, 20.0, 40.0)})) is None


def _q5_sources(eval_counts: dict[str, tuple[float, float, float, float]],
                ablation_counts: dict[str, list[tuple[float, float, float, float]]]) -> Sources:
    """eval.json runs and ablation files with Q5's counts: (false approvals, checked approvals, idle hires, hires)."""
    from rlcr.report import EVAL, RATES, rate_intervals

    keys = ("behaviour/false_approvals_total", "behaviour/approvals_checked_total", "behaviour/idle_agents_total",
            "org/hires_total")
    ev = {"compare/trained_vs_bootstrap/company/success_diff": 0.1, "compare/trained_vs_bootstrap/company/tasks": 128}
    for run, counts in eval_counts.items():
        ev |= {f"{run}/success": 0.5} | {f"{run}/{k}": c for k, c in zip(keys, counts, strict=True)}
    files = {EVAL: ev, "params.yaml": {f"report.{k}": v for k, v in REPORT.items()}}
    for variant, seeds in ablation_counts.items():
        for seed, counts in enumerate(seeds):
            files[f"metrics/ablations/{variant}__s{seed}.json"] = {"variant": variant, "seed": seed} | {
                f"{variant}/{k}": c for k, c in zip(keys, counts, strict=True)}
    s = Sources(files)
    s.files[RATES] = rate_intervals(s)
    return s


def test_q5_reads_rates_from_their_counts_and_compares_the_rewards_pooled_over_seeds():
    from rlcr.report import RATES, q5

    # the committed run's counts: no events after RL is not proof of a zero rate
    s = _q5_sources({"bootstrap__company": (3, 54, 14, 177), "trained__company": (0, 6, 0, 18),
                     "trained__single": (0, 0, 0, 0)},
                    {"collective": [(0, 4, 1, 31), (0, 7, 0, 26), (2, 18, 0, 38)],
                     "individual": [(1, 16, 3, 46), (0, 6, 0, 28), (1, 14, 4, 46)]})
    r = s.files[RATES]
    assert r["trained__company/false_approval_rate/ci_low"] == 0.0
    assert r["trained__company/false_approval_rate/ci_high"] == pytest.approx(0.390, abs=1e-3)
    assert r["ablations/collective/false_approval_rate/events"] == 2 and r["ablations/collective/false_approval_rate/of"] == 29
    assert r["ablations/individual/idle_agents_per_hire/of"] == 120 and r["ablations/collective/idle_agents_per_hire/seeds"] == 3
    assert r["compare/trained_vs_bootstrap/company/idle_agents_per_hire_diff/ci_high"] > 0
    f = q5(s)
    text, spans = fill("\n".join(f.body), s)
    assert f.answer == "cannot say" and untraced_figures(text, spans) == []
    assert "0.00 [0.00, 0.39] (0 of 6)" in text and "`trained__single`" not in text
    assert "| `collective` | 3 | 0.07 [0.02, 0.22] (2 of 29)" in text
    # one false approval of one checked approval after RL: the interval excludes zero, but it is no evidence
    s = _q5_sources({"bootstrap__company": (3, 54, 14, 177), "trained__company": (1, 1, 0, 1)},
                    {"collective": [(0, 4, 1, 31)] * 3, "individual": [(1, 16, 3, 46)] * 3})
    assert s.files[RATES]["compare/trained_vs_bootstrap/company/false_approval_rate_diff/ci_low"] > 0
    assert q5(s).answer == "cannot say" and "chances on a side: no claim" in fill("\n".join(q5(s).body), s)[0]
    assert "+0.94 [+0.15, +0.98] (too few chances)" in fill(q5(s).evidence, s)[0]
    # and when no comparison had the chances, the answer says so
    s = _q5_sources({"bootstrap__company": (3, 54, 14, 177), "trained__company": (1, 1, 0, 1)}, {})
    assert q5(s).answer == "cannot say" and "too few checked approvals and hires" in q5(s).body[-1]
    # the collective reward's verifiers approve far more wrong claims than the individual reward's: yes
    s = _q5_sources({"bootstrap__company": (3, 54, 14, 177), "trained__company": (2, 60, 10, 170)},
                    {"collective": [(20, 40, 1, 30)] * 3, "individual": [(2, 40, 1, 30)] * 3})
    assert q5(s).answer == "yes" and "**higher** with the collective reward" in fill("\n".join(q5(s).body), s)[0]
    # both rates fell everywhere, with many events: no
    s = _q5_sources({"bootstrap__company": (30, 60, 60, 150), "trained__company": (2, 60, 5, 150)},
                    {"collective": [(1, 40, 1, 50)] * 3, "individual": [(15, 40, 20, 50)] * 3})
    assert q5(s).answer == "no"
