"""The whole pipeline, every stage of dvc.yaml, through one real `dvc repro` on the `quick` profile."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from test_stage_prepare import dvc

pytestmark = pytest.mark.slow


def test_quick_profile_runs_every_stage_and_writes_the_report(project_copy):
    root = project_copy
    path = root / "params.yaml"
    data = yaml.safe_load(path.read_text())
    data["profile"] = "quick"
    data["ablate"]["variants"] = ["collective", "no_verifiers"]  # the matrix reads the list as written
    data["ablate"]["seeds"] = [0]  # the 3-seed matrix: the default repro; the sweep test runs 2 seeds
    path.write_text(yaml.safe_dump(data, sort_keys=False))

    t0 = time.perf_counter()
    proc = dvc(root, "repro")
    seconds = time.perf_counter() - t0
    stages = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    listed = dvc(root, "stage", "list", "--name-only").stdout.split()
    assert sorted(stages) == sorted(listed), proc.stdout[-3000:]
    print(f"quick pipeline: {len(stages)} stages in {seconds:.0f} s")

    report = (root / "reports/report.md").read_text()
    for q in ("Q1", "Q2", "Q3", "Q4", "Q5"):
        assert f"## {q}." in report
    sources = json.loads((root / "reports/report_sources.json").read_text())
    assert sources and all((root / s["file"]).is_file() for s in sources)
    metrics = json.loads((root / "metrics/eval.json").read_text())
    assert {"bootstrap__company/success", "trained__single/success"} <= set(metrics)
    assert "didn't change, skipping" in dvc(root, "repro", "report").stdout
