"""What DVC shows: `dvc metrics show` one narrow row per evaluated run with the same keys, and `dvc plots
show` rendering offline (vega inline, no CDN) with every ablation variant on one learning-curve plot,
in real headless Chromium with every non-file request refused.

The headline stage runs (`dvc repro -s headline`) on the project's committed metrics and curves.
Set RLCR_DVC_SCREENSHOTS=<folder> to keep the screenshot; else the test prints where it went.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, copy_project
from test_stage_prepare import dvc

from rlcr.headline import DVC_KEYS, headline_files, learning_curves, runs_table

CHROMIUM = "/usr/bin/chromium"
VARIANTS = sorted({p.stem.split("__s")[0] for p in (ROOT / "metrics/ablations").glob("*.json")})


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = copy_project(tmp_path_factory.mktemp("dvc_views") / "project")
    for rel in ("metrics", "plots"):
        shutil.copytree(ROOT / rel, root / rel)
    shutil.rmtree(root / "metrics/headline", ignore_errors=True)
    proc = dvc(root, "repro", "--single-item", "headline")
    assert "Running stage 'headline'" in proc.stdout, proc.stdout[-2000:]
    return root


def test_metrics_show_is_one_narrow_row_per_run_with_the_same_keys(project):
    files = sorted((project / "metrics/headline").rglob("*.json"))
    assert len(files) >= 1 + 4 + len(VARIANTS), files  # train, the rollouts, at least one seed per variant
    for f in files:
        keys = set(json.loads(f.read_text()))
        assert keys <= set(DVC_KEYS) and {"eval/success", "eval/success_ci_low", "eval/tokens"} <= keys, (f, keys)
    table = dvc(project, "metrics", "show").stdout
    lines = table.rstrip("\n").splitlines()
    print(f"\n[dvc] metrics show: {len(lines)} lines, {max(map(len, lines))} characters wide")
    assert max(map(len, lines)) < 200, table
    assert lines[0].split() == ["Path", *sorted(DVC_KEYS)]
    assert all(any(f"ablate/{v}__s" in line for line in lines) for v in VARIANTS)
    # every other metrics file is a plain out now: nothing else is listed
    assert len(lines) == 1 + len(files)


def test_plots_show_renders_offline_with_every_variant_on_one_plot(project, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    out = project / "dvc_plots"
    dvc(project, "plots", "show", "-o", str(out))
    page_html = (out / "index.html").read_text()
    assert "cdn.jsdelivr" not in page_html and "<script src=" not in page_html
    folder = Path(os.environ.get("RLCR_DVC_SCREENSHOTS") or tmp_path_factory.mktemp("dvc_screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    shot = folder / "dvc_plots_offline.png"
    refused, errors = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--disable-gpu", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:")
                   else (refused.append(r.request.url), r.abort()))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto((out / "index.html").as_uri())
        page.wait_for_selector(".vega-embed svg, .vega-embed canvas", timeout=30_000)
        page.wait_for_timeout(500)
        charts = page.locator(".vega-embed")
        n_charts = charts.count()
        texts = page.evaluate("() => [...document.querySelectorAll('.vega-embed svg text')].map(t => t.textContent)")
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    print(f"\n[dvc] plots show, offline: screenshot {shot}")
    assert not errors and not refused, (errors, refused)
    assert n_charts == 2, n_charts
    assert "Training success per RL iteration" in " ".join(texts), texts[:20]
    assert all(v in texts for v in [*VARIANTS, "train"]), (VARIANTS, texts[:60])  # the legend of ONE plot
    assert "trained company" in texts and "bootstrap single" in texts


def test_headline_files_copy_the_figures_and_leave_out_what_a_run_lacks():
    ev = {"trained__company/success": 0.5, "trained__company/success_ci_low": 0.4, "trained__company/success_ci_high": 0.6,
          "trained__company/tokens": 20.0, "trained__company/time/critical_path_ratio": 0.8, "eval/level": 0.95,
          "trained__company/family/sum/success": 0.1, "compare/a/b/success_diff": 0.1}
    ab = {"mixed__s1": {"variant": "mixed", "mixed/success": 0.25, "mixed/success_ci_low": 0.1,
                        "mixed/success_ci_high": 0.4, "mixed/tokens": 9.0, "mixed/behaviour/malformed_rate": 0.0}}
    tr = {"eval_after/success": 0.75, "eval_after/episodes": 8.0, "eval_after/total_tokens": 10.0, "eval_before/success": 0.1}
    files = headline_files(ev, tr, ab)
    assert sorted(files) == ["metrics/headline/ablate/mixed__s1.json", "metrics/headline/rollout/trained__company.json",
                             "metrics/headline/train.json"]
    assert files["metrics/headline/rollout/trained__company.json"] == {
        "eval/success": 0.5, "eval/success_ci_low": 0.4, "eval/success_ci_high": 0.6, "eval/tokens": 20.0,
        "eval/critical_path_ratio": 0.8}
    assert files["metrics/headline/train.json"]["eval/success"] == 0.75 and "eval/critical_path_ratio" not in files[
        "metrics/headline/train.json"]
    assert list(runs_table(files)["run"]) == ["train held-out", "trained company", "ablation mixed s1"]
    curve = pd.DataFrame({"iteration": [1, 2], "rollout_success": [0.1, 0.2], "reward_mean": [0.0, 0.1]})
    long = learning_curves({"mixed__s1": curve, "train": curve})
    assert list(long["run"]) == ["mixed s1"] * 2 + ["train"] * 2 and list(long["seed"]) == ["1", "1", "none", "none"]
