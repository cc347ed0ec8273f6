"""The whole pipeline, every stage of dvc.yaml, through real `dvc repro` on the `quick` profile (the
session fixture `quick_pipeline` of conftest.py, which tests/test_ablate.py reads too)."""

from __future__ import annotations

import json

import pytest
import yaml
from test_stage_prepare import dvc

pytestmark = pytest.mark.slow


def test_quick_profile_runs_every_stage_and_writes_the_report(quick_pipeline):
    root, seconds, proc_stdout = quick_pipeline["root"], quick_pipeline["seconds"], quick_pipeline["stdout"]
    stages = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    listed = dvc(root, "stage", "list", "--name-only").stdout.split()
    assert sorted(stages) == sorted(listed), proc_stdout[-3000:]
    print(f"quick pipeline: {len(stages)} stages in {seconds:.0f} s")

    report = (root / "reports/report.md").read_text()
    for q in ("Q1", "Q2", "Q3", "Q4", "Q5"):
        assert f"## {q}." in report
    sources = json.loads((root / "reports/report_sources.json").read_text())
    assert sources and all((root / s["file"]).is_file() for s in sources)
    metrics = json.loads((root / "metrics/eval.json").read_text())
    assert {"bootstrap__company/success", "trained__single/success"} <= set(metrics)
    assert "didn't change, skipping" in dvc(root, "repro", "report").stdout
