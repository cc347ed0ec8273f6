"""`prepare` end to end through real `dvc repro` in a throwaway copy of the project."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers import dvc  # noqa: F401 - other test modules import it from here too
from mlflow import MlflowClient

pytestmark = pytest.mark.slow


def small_params(root: Path, **prepare) -> None:
    path = root / "params.yaml"
    data = yaml.safe_load(path.read_text())
    data["prepare"]["train"] = [{"name": "sum", "n": 60, "difficulties": [1, 3]}]
    data["prepare"]["eval"] = [{"name": "sum", "n": 10, "difficulties": [1, 3]}, {"name": "rg/gcd", "n": 4}]
    data["prepare"].update(prepare)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def stage_runs(root: Path):
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlcr-collective-rewards")
    return client.search_runs([exp.experiment_id], "tags.`rlcr.stage` = 'prepare'",
                              order_by=["attributes.start_time ASC"])


def test_repro_writes_outs_lock_and_run_then_skips_then_reruns(project_copy):
    root = project_copy
    small_params(root)
    dvc(root, "repro", "prepare")
    for out in ("data/tasks/train.parquet", "data/tasks/eval.parquet", "metrics/prepare.json", "dvc.lock"):
        assert (root / out).exists(), out
    lock = (root / "dvc.lock").read_text()
    metrics = json.loads((root / "metrics/prepare.json").read_text())
    assert metrics["data/train_tasks"] == 120 and metrics["data/eval_tasks"] == 24

    (run,) = stage_runs(root)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["data/train_tasks"] == 120
    assert run.data.params["prepare.seed"] == "0"
    assert run.data.tags["rlcr.stage"] == "prepare" and "dvc.dep.rlcr/config.py" in run.data.tags

    # every rlcr module the stage imported is a declared dependency
    deps = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["prepare"]["deps"]
    imported = json.loads((root / "imports.json").read_text())
    missing = [m for m in imported if not any(m == d or m.startswith(d.rstrip("/") + "/") for d in deps)]
    assert not missing, f"stage imports modules dvc.yaml does not list: {missing}"

    # nothing changed -> skipped, no new run
    again = dvc(root, "repro", "prepare")
    assert "didn't change, skipping" in again.stdout
    assert len(stage_runs(root)) == 1 and (root / "dvc.lock").read_text() == lock

    # a prepare param changed -> rerun, new data, new lock
    before = (root / "data/tasks/train.parquet").read_bytes()
    small_params(root, seed=1)
    dvc(root, "repro", "prepare")
    assert (root / "data/tasks/train.parquet").read_bytes() != before
    assert len(stage_runs(root)) == 2 and (root / "dvc.lock").read_text() != lock

    # a library module the stage imports changed -> rerun
    lock = (root / "dvc.lock").read_text()
    with open(root / "rlcr/tasks/base.py", "a") as f:
        f.write("\n# a comment is a change\n")
    rerun = dvc(root, "repro", "prepare")
    assert "Running stage 'prepare'" in rerun.stdout and len(stage_runs(root)) == 3


def test_failing_stage_marks_run_failed_and_keeps_lock(project_copy):
    root = project_copy
    small_params(root)
    dvc(root, "repro", "prepare")
    lock = (root / "dvc.lock").read_text()
    bad = root / "data/raw/bad.jsonl"
    bad.write_text("\n".join([json.dumps({"question": f"q{i}", "answer": "1"}) for i in range(20)] + ["{x"] * 5))
    data = yaml.safe_load((root / "params.yaml").read_text())
    data["prepare"]["train"].append({"name": "jsonl/user", "n": 5, "options": {"path": "data/raw/bad.jsonl"}})
    (root / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))

    proc = dvc(root, "repro", "prepare", check=False)
    assert proc.returncode != 0
    assert "family 'jsonl/user': 5 of 25 rows rejected" in proc.stderr + proc.stdout
    assert "jsonl/user:line21: bad JSON" in proc.stderr + proc.stdout
    assert (root / "dvc.lock").read_text() == lock
    assert not (root / "data/tasks/train.parquet").exists()  # no stale out a later stage could trust
    assert stage_runs(root)[-1].info.status == "FAILED"


def test_one_byte_change_to_a_data_file_reruns_prepare(project_copy):
    root = project_copy
    rows = [json.dumps({"question": f"What is {i} plus one?", "answer": str(i + 1)}) for i in range(20)]
    data_file = root / "data/raw/mine.jsonl"
    data_file.write_text("\n".join(rows) + "\n")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["profile"] = "quick"
    params["profiles"]["quick"]["prepare"] = {  # the quick profile on the user's file alone: seconds
        "train": [{"name": "jsonl/mine", "n": 20, "options": {"path": "data/raw/mine.jsonl"}}],
        "eval": [{"name": "sum", "n": 4, "difficulties": [1]}]}
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    dvc(root, "repro", "prepare")
    before = (root / "data/tasks/train.parquet").read_bytes()

    text = data_file.read_bytes()
    at = text.index(b'"answer": "1"') + len(b'"answer": "')
    data_file.write_bytes(text[:at] + b"7" + text[at + 1:])  # one byte: the answer 1 becomes 7
    rerun = dvc(root, "repro", "prepare")
    assert "Running stage 'prepare'" in rerun.stdout
    assert (root / "data/tasks/train.parquet").read_bytes() != before
