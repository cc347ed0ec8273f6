"""MLflow as the comparison tool: every ablation child logs the same few headline keys, the sweep's
parent summarises them per variant, and the MLflow UI's compare view (a real `mlflow server`, real
headless Chromium) shows `eval/success` of every variant in one row.

The runs are logged by the stage's own functions (`rlcr.tracking.stage_run`, `rlcr.ablate.in_sweep`,
`rlcr.ablate.log_variant`) from a real evaluation (`rlcr.evaluate`) of real episodes played by
scripted organisations, so no RL run is needed. Set RLCR_MLFLOW_SCREENSHOTS=<folder> to keep the
screenshot; else it goes to pytest's temporary folder and the test prints where.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

from rlcr.ablate import (
    CurveTracker,
    VariantRun,
    ablation_metrics,
    in_sweep,
    log_variant,
    summary_metrics,
    sweep_summary,
    variant_overrides,
)
from rlcr.config import OrgConfig, RewardConfig, load_params
from rlcr.evaluate import RunFrames, evaluate, spec_metrics
from rlcr.org.episode import run_episodes
from rlcr.org.scripted import ScriptedOrg
from rlcr.tasks import build_family
from rlcr.tracking import HEADLINE_KEYS, headline_from_held_out, select_metrics, stage_run, wilson_interval

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = load_params(ROOT / "params.yaml").ablate.variants  # the default sweep's, as `dvc repro` runs it
CHROMIUM = "/usr/bin/chromium"
SEEDS = (0, 1)
# a scripted organisation per variant, so the variants really differ in success, tokens and shape
STYLES = {"collective": ("verify", 0.1), "individual": ("delegate", 0.3), "mixed": ("delegate", 0.2),
          "counterfactual": ("verify", 0.2), "no_board": ("delegate", 0.4), "no_hiring": ("single", 0.3),
          "no_verifiers": ("delegate", 0.1)}


def variant_run(variant: str, seed: int, spec, org: OrgConfig) -> VariantRun:
    """A VariantRun of real episodes (scripted organisation) evaluated by rlcr.evaluate, with a 3-point curve."""
    style, error = STYLES[variant]
    tasks = [t for d in (1, 3) for t in build_family("sum").generate(seed, 6, d)]
    org = OrgConfig(single_agent=True) if style == "single" else org
    records = run_episodes(tasks, ScriptedOrg("solo" if style == "single" else style, error_rate=error, seed=seed),
                           org, RewardConfig())
    ev = evaluate({variant: RunFrames.from_records(records)}, spec, frozenset({"sum"}))
    history = [{"rollout/success": 0.3 + 0.1 * i + 0.02 * seed, "reward/mean": 0.3 + 0.1 * i} for i in range(3)]
    return VariantRun(history, None, records, {**spec_metrics(spec, 1), **ev.metrics}, {"train": 1.0, "rollout": 1.0})


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A sweep of every variant x 2 seeds logged into a fresh sqlite store as the ablate stage logs it."""
    root = tmp_path_factory.mktemp("sweep")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    over = {"tracking.uri": uri, "evaluate.n_resamples": 200}
    base = load_params(ROOT / "params.yaml", over)
    children = {}
    for variant in VARIANTS:
        for seed in SEEDS:
            params = load_params(ROOT / "params.yaml", {**over, **variant_overrides(base.ablate, variant, seed)})
            with stage_run(f"ablate@{variant}-{seed}", params, root) as tracker:
                with in_sweep(tracker, base, root, variant, seed) as parent:
                    run = variant_run(variant, seed, params.evaluate, params.org)
                    curve = CurveTracker(tracker)  # what rlcr.ablate.run_variant gives the RL loop
                    for i, h in enumerate(run.history):  # the learning curve, as rlcr.train.loop logs it
                        curve.log_metrics({**h, "charts/lr": 1e-4, "perf/rollout_seconds": 1.0}, step=i + 1)
                    metrics = ablation_metrics(variant, seed, run)
                    log_variant(tracker, variant, seed, params.profile, metrics)
                children[(variant, seed)] = (tracker.run_id, metrics)
    client = MlflowClient(tracking_uri=uri)
    return {"root": root, "uri": uri, "client": client, "parent": parent, "children": children,
            "experiment": client.get_run(parent).info.experiment_id}


def test_every_child_logs_the_same_few_headline_keys_with_variant_seed_profile(sweep):
    client = sweep["client"]
    keys_seen = set()
    for (variant, seed), (run_id, metrics) in sweep["children"].items():
        run = client.get_run(run_id)
        keys = set(run.data.metrics)
        keys_seen |= keys
        assert {"eval/success", "eval/success_ci_low", "eval/success_ci_high", "eval/tokens",
                "eval/critical_path_ratio", "eval/malformed_rate"} <= keys, (variant, sorted(keys))
        assert len(keys) <= 30, f"{variant}: {len(keys)} metrics, the compare view wants tens"
        assert not any(k.startswith(f"{variant}/") for k in keys), "variant names stay out of metric keys"
        assert run.data.metrics["eval/success"] == pytest.approx(metrics[f"{variant}/success"])
        assert run.data.params["variant"] == variant and run.data.params["seed"] == str(seed)
        assert run.data.params["profile"] == "tiny" and run.data.tags["rlcr.variant"] == variant
        assert run.data.tags["rlcr.policy_out"] == f"ablations/{variant}__s{seed}/policy"
        assert run.data.tags["mlflow.parentRunId"] == sweep["parent"]
        curve = client.get_metric_history(run_id, "train/rollout/success")
        assert [m.step for m in curve] == [1, 2, 3], "the learning curve is one metric over steps"
        table = json.loads(Path(client.download_artifacts(run_id, "metrics.json", str(sweep["root"]))).read_text())
        assert table == json.loads(json.dumps(metrics)), "the full table is an artifact"
    assert keys_seen <= set(HEADLINE_KEYS) | {"train/rollout/success", "train/reward/mean", "train/success_first",
                                             "train/success_last", "train/reward_last", "train/seconds",
                                             "rollout/seconds"}


def test_the_parent_has_a_description_the_sweep_params_and_a_summary_per_variant(sweep):
    parent = sweep["client"].get_run(sweep["parent"])
    assert parent.info.status == "FINISHED"
    note = parent.data.tags["mlflow.note.content"]
    assert "Ablation sweep" in note and all(f"| {v} |" in note for v in VARIANTS)
    iterations = load_params(ROOT / "params.yaml").ablate.iterations  # the sweep's, as params.yaml sets it
    assert parent.data.params["ablate.iterations"] == str(iterations) and parent.data.params["profile"] == "tiny"
    for variant in VARIANTS:
        values = [m[f"{variant}/success"] for (v, _), (_, m) in sweep["children"].items() if v == variant]
        mean = sum(values) / len(values)
        assert parent.data.metrics[f"{variant}/success_mean"] == pytest.approx(mean)
        low, high = parent.data.metrics[f"{variant}/success_ci_low"], parent.data.metrics[f"{variant}/success_ci_high"]
        assert low <= mean <= high
        assert parent.data.metrics[f"{variant}/seeds"] == len(SEEDS)


def test_sweep_summary_takes_the_latest_finished_run_of_each_variant_and_seed():
    rows = [("a", "0", 1, "FINISHED", {"eval/success": 0.2}), ("a", "0", 2, "FINISHED", {"eval/success": 0.4}),
            ("a", "1", 1, "FINISHED", {"eval/success": 0.6}), ("a", "2", 3, "FAILED", {"eval/success": 0.0}),
            ("b", "0", 1, "RUNNING", {})]
    summary = sweep_summary(rows)
    assert list(summary) == ["a"]
    s = summary["a"]["eval/success"]
    assert s["mean"] == pytest.approx(0.5) and s["seeds"] == 2 and s["ci_low"] < 0.5 < s["ci_high"]
    assert summary_metrics(summary)["a/success_mean"] == pytest.approx(0.5)


def test_held_out_headline_and_wilson_interval():
    low, high = wilson_interval(8, 10)
    assert 0.49 < low < 0.5 and 0.94 < high < 0.95  # the textbook 95% Wilson interval of 8/10
    head = headline_from_held_out({"eval/episodes": 10.0, "eval/success": 0.8, "eval/total_tokens": 12.0,
                                   "eval/size": 1.5, "eval/reward": 0.8})
    assert list(head) == ["eval/success", "eval/success_ci_low", "eval/success_ci_high", "eval/tasks",
                          "eval/tokens"]
    assert headline_from_held_out({}) == {}
    with pytest.raises(ValueError, match="n > 0"):
        wilson_interval(0, 0)


def test_select_metrics_matches_whole_segments_only():
    m = {"a__b/success": 1.0, "a__b/transfer/success": 2.0, "compare/x/y/success_diff": 3.0,
         "compare/x/y/short/success_diff": 4.0, "a__b/name": "text"}
    assert select_metrics(m, ("*__*/success", "compare/*/*/success_diff")) == {
        "a__b/success": 1.0, "compare/x/y/success_diff": 3.0}


# ------------------------------------------------------------------------- the UI, in Chromium


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(sweep):
    """`mlflow server` on the sweep's store (what `make mlflow-ui` runs on the project's)."""
    port = free_port()
    log = open(sweep["root"] / "server.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", sweep["uri"],
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"mlflow server did not start: {(sweep['root'] / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)
    yield url
    os.killpg(proc.pid, signal.SIGTERM)  # the server and the workers it started (its own session)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("RLCR_MLFLOW_SCREENSHOTS") or tmp_path_factory.mktemp("mlflow_screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


ROW = """name => {
  // the compare view's metrics table is two virtualised grids side by side, the keys and the values,
  // whose cells of one row share the key cell's `top`: that row's value cells left to right, where
  // each is on the screen, and the visible box of the values grid
  const a = [...document.querySelectorAll('a[title="Plot chart"]')].find(e => e.textContent.trim() === name);
  if (!a) return null;
  const cell = a.parentElement;
  for (let anc = cell.parentElement; anc; anc = anc.parentElement) {
    const row = [...anc.querySelectorAll('div')].filter(d => d.style.position === 'absolute'
      && d.style.top === cell.style.top && !d.contains(a) && !d.querySelector('div'));
    if (row.length) {
      const box = r => ({x: r.x, y: r.y, bottom: r.bottom, right: r.right});
      row.sort((x, y) => parseFloat(x.style.left) - parseFloat(y.style.left));
      return {key: box(a.getBoundingClientRect()), section: box(anc.getBoundingClientRect()),
              grid: box(row[0].closest('.ReactVirtualized__Grid').getBoundingClientRect()),
              cells: row.map(d => ({text: d.innerText.trim(), ...box(d.getBoundingClientRect())}))};
    }
  }
  return null;
}"""


def test_mlflow_compare_view_shows_eval_success_of_every_variant_in_one_row(sweep, server, shots):
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: `make setup` installs it"
    runs = [run_id for (variant, seed), (run_id, _) in sweep["children"].items() if seed == 0]
    url = (f"{server}/#/compare-runs?runs={json.dumps(runs, separators=(',', ':'))}"
           f"&experiments={json.dumps([sweep['experiment']])}")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--disable-gpu", "--no-first-run"])
        # wide enough that the virtualised grid renders all 7 run columns next to the UI's side panel,
        # tall enough that the metrics table is on the screen without scrolling anything
        page = browser.new_page(viewport={"width": 2700, "height": 3200})
        page.goto(url)
        page.get_by_role("link", name="eval/success", exact=True).wait_for(timeout=60_000)
        page.wait_for_timeout(500)  # let the grid settle
        row = page.evaluate(ROW, "eval/success")
        names = page.get_by_text("Run Name:").locator("xpath=..").inner_text()
        shot = shots / "mlflow_compare_ablations.png"
        sec = row["section"]
        page.screenshot(path=str(shot), clip={"x": 0, "y": max(0, sec["y"] - 420), "width": 2700,
                                              "height": sec["bottom"] - max(0, sec["y"] - 420) + 20})
        print(f"\n[mlflow] compare view of {len(runs)} ablation children: screenshot {shot}")
        browser.close()
    expected = [f"{sweep['children'][(v, 0)][1][f'{v}/success']:.3f}" for v in VARIANTS]
    cells, grid = row["cells"], row["grid"]
    assert [f"{float(c['text']):.3f}" for c in cells] == expected, (cells, expected)  # in the runs' order
    for c in cells:  # one row on the screen: beside the key, inside the table's visible area
        assert abs(c["y"] - row["key"]["y"]) < 20 and grid["y"] <= c["y"] and c["bottom"] <= grid["bottom"] + 1, c
        assert c["right"] <= grid["right"] + 1, c
    assert all(f"ablate@{v}-0" in names for v in VARIANTS), names


def test_a_registered_version_carries_its_scores_profile_and_source(sweep):
    from rlcr.tracking import tag_model_version

    params = load_params(ROOT / "params.yaml", {"tracking.uri": sweep["uri"]})
    with stage_run("train", params, sweep["root"]) as tracker:
        assert tag_model_version(tracker, "rlcr-test-policy", {"eval.success": "0.5"}, "x") is None  # none yet
        client = tracker.client
        client.create_registered_model("rlcr-test-policy")
        client.create_model_version("rlcr-test-policy", source=f"{sweep['root']}/policy", run_id=tracker.run_id)
        version = tag_model_version(tracker, "rlcr-test-policy", {"eval.success": "0.5", "rlcr.profile": "tiny"},
                                    "held-out success 0.5")
    mv = client.get_model_version("rlcr-test-policy", version)
    assert mv.tags["eval.success"] == "0.5" and mv.tags["rlcr.profile"] == "tiny"
    assert mv.tags["source.run_id"] == tracker.run_id and mv.tags["source.stage"] == "train"
    assert mv.description == "held-out success 0.5"


def test_report_html_inlines_its_figures_and_escapes_nothing_it_should_not(tmp_path):
    from rlcr.plots import report_html

    (tmp_path / "fig.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 16)
    (tmp_path.parent / "outside.png").write_bytes(b"\x89PNG")
    page = report_html("# T\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n![f](fig.png) ![o](../outside.png) ![m](missing.png)",
                       tmp_path, "Title <x>")
    assert page.count("data:image/png;base64,") == 1 and "<table>" in page and "Title &lt;x&gt;" in page
    assert 'src="../outside.png"' in page and 'src="missing.png"' in page  # never reads outside its folder


def test_ablation_rollouts_show_a_bar_on_a_terminal_only(monkeypatch):
    from rlcr.ablate import show_progress

    class Tty:
        def isatty(self):
            return True

    monkeypatch.delenv("CI", raising=False)
    with open(os.devnull, "w") as log_file:
        assert show_progress(Tty()) and not show_progress(log_file)
    monkeypatch.setenv("CI", "true")
    assert not show_progress(Tty())
