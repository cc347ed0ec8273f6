"""MLflow runs end FINISHED, FAILED or KILLED as the stage ends; lineage tags."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from rlcr.config import load_params
from rlcr.tracking import NullTracker, flatten, stage_run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """One sqlite store for the module: a new MLflow db costs seconds of migrations."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def params_for(uri: str, **over):
    return load_params(ROOT / "params.yaml", {"tracking.uri": uri, **over})


def runs(uri: str, stage: str):
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("rlcr-collective-rewards")
    return client.search_runs([exp.experiment_id], f"tags.`rlcr.stage` = '{stage}'",
                              order_by=["attributes.start_time DESC"])


def test_success_finished_with_params_metrics_and_lineage(db, tmp_path):
    with stage_run("unit_ok", params_for(db), ROOT) as tracker:
        tracker.log_metrics({"data/x": 1.5}, step=0)
    run = runs(db, "unit_ok")[0]
    assert run.info.status == "FINISHED"
    assert run.data.metrics["data/x"] == 1.5
    assert run.data.params["prepare.seed"] == "0" and run.data.params["profile"] == "tiny"
    tags = run.data.tags
    assert len(tags["git.commit"]) == 40 and tags["git.dirty"] in ("true", "false")
    assert tags["rlcr.profile"] == "tiny" and len(tags["rlcr.params_hash"]) == 12
    assert tags["rlcr.cpu_kernels"] == os.environ.get("ATEN_CPU_CAPABILITY", "native")  # which kernels computed it


def test_exception_failed_and_reraised(db):
    with pytest.raises(RuntimeError, match="boom"):
        with stage_run("unit_fail", params_for(db), ROOT):
            raise RuntimeError("boom")
    assert runs(db, "unit_fail")[0].info.status == "FAILED"


def test_dvc_dep_hashes_are_tagged(db):
    with stage_run("prepare", params_for(db), ROOT):
        pass
    tags = runs(db, "prepare")[0].data.tags
    assert "dvc.dep.stages/prepare.py" in tags and "dvc.dep.rlcr/tasks" in tags


def test_tracking_off_records_nothing(tmp_path):
    uri = f"sqlite:///{tmp_path / 'off.db'}"
    with stage_run("x", params_for(uri, **{"tracking.enabled": False}), ROOT) as tracker:
        assert isinstance(tracker, NullTracker)
        tracker.log_metrics({"a": 1.0})
    assert not (tmp_path / "off.db").exists()


def test_sigterm_marks_killed_and_exits_nonzero(db, tmp_path):
    script = tmp_path / "stage_sleep.py"
    ready = tmp_path / "ready"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from rlcr.stage import run_stage

        def body(params, tracker, root):
            Path({str(ready)!r}).write_text("x")
            time.sleep(120)

        sys.exit(run_stage("unit_sigterm", body, {str(ROOT)!r}, overrides={{"tracking.uri": {db!r}}}))
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not ready.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == 143
    assert runs(db, "unit_sigterm")[0].info.status == "KILLED"


def test_flatten_dotted_keys():
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": "x"}) == {"a.b": 1, "a.c": [1, 2], "d": "x"}
