"""`train` end to end: real `dvc repro` in a throwaway copy of the project, and SIGTERM mid-training.

models/bootstrap is the out of the `bootstrap` stage when dvc.yaml has one (then the test runs the
real chain prepare -> bootstrap -> train with tiny bootstrap params); until then the test writes a
tiny policy folder there itself and reproduces prepare -> train.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import dvc as _dvc
from mlflow import MlflowClient

dvc = functools.partial(_dvc, timeout=900)  # these stages train: more than prepare's 600 s
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

TINY = {
    "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 128, "context": 160},
    "org": {"max_agents": 3, "max_depth": 1, "max_rounds": 2, "token_budget": 64, "max_turn_tokens": 24,
            "max_obs_tokens": 120, "context_tokens": 160, "allow_leads": False},
    "engine": {"max_new_tokens": 24},
    "train": {"iterations": 2, "tasks_per_iteration": 2, "group_size": 2, "checkpoint_every": 1, "keep_last": 2,
              "eval_tasks": 8, "lr": 1e-4},
}


def tiny_project(root: Path, **train) -> None:
    if not (root / "configs").exists():  # conftest's copy predates configs/ (the DeepSpeed config)
        shutil.copytree(ROOT / "configs", root / "configs")
    path = root / "params.yaml"
    data = yaml.safe_load(path.read_text())
    data["prepare"]["train"] = [{"name": "sum", "n": 20, "difficulties": [1], "options": {"digits": 1}}]
    data["prepare"]["eval"] = [{"name": "sum", "n": 8, "difficulties": [1], "options": {"digits": 1}}]
    for section, values in TINY.items():
        data.setdefault(section, {}).update(values)
    if "bootstrap" in data:  # the real bootstrap stage, a few SFT steps on a few scripted episodes
        data["bootstrap"].update({"steps": 3, "batch_size": 4, "episodes": 12, "warmup_steps": 0, "eval_tasks": 0,
                                  "drill_first": 2})  # not the default's 1000 drill steps
    data["train"].update(train)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def has_bootstrap_stage(root: Path) -> bool:
    return "bootstrap" in yaml.safe_load((root / "dvc.yaml").read_text())["stages"]


def write_bootstrap(root: Path) -> None:
    """A random tiny policy at models/bootstrap (what the bootstrap stage will write)."""
    code = ("import sys; sys.path.insert(0, '.'); from rlcr.config import load_params; "
            "from rlcr.policy.models import build_tiny, save_policy; p = load_params('params.yaml'); "
            "save_policy(*build_tiny(p.model, 0), 'models/bootstrap')")
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, capture_output=True, timeout=300)


def train_runs(root: Path):
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlcr-collective-rewards")
    runs = client.search_runs([exp.experiment_id], "tags.`rlcr.stage` = 'train'", order_by=["attributes.start_time ASC"])
    return client, runs


def test_repro_trains_registers_and_skips_when_nothing_changed(project_copy):
    root = project_copy
    tiny_project(root)
    if not has_bootstrap_stage(root):
        dvc(root, "repro", "prepare")
        write_bootstrap(root)
    proc = dvc(root, "repro", "train")  # with a bootstrap stage: prepare -> bootstrap -> train
    if has_bootstrap_stage(root):
        assert "Running stage 'bootstrap'" in proc.stdout and (root / "models/bootstrap/config.json").is_file()
    for out in ("models/trained/config.json", "models/trained/model.safetensors", "metrics/train.json",
                "plots/train.csv", "dvc.lock"):
        assert (root / out).exists(), out
    metrics = json.loads((root / "metrics/train.json").read_text())
    assert metrics["train/iterations"] == 2 and metrics["eval_before/episodes"] == 8
    assert {"eval_before/success", "eval_after/success", "eval/success_delta"} <= set(metrics)
    rows = (root / "plots/train.csv").read_text().splitlines()
    assert rows[0].startswith("iteration,reward_mean,rollout_success") and len(rows) == 3

    client, (run,) = train_runs(root)
    assert run.info.status == "FINISHED"
    assert {"reward/mean", "rollout/success", "adv/std", "train/turns", "eval/success_delta"} <= set(run.data.metrics)
    assert run.data.params["train.group_size"] == "2"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"policy", "checkpoints"} <= artifacts
    version = client.get_model_version_by_alias("rlcr-policy", "latest-trained")
    assert version.run_id == run.info.run_id and version.source.endswith("/policy")
    # the headline before RL at step 0 and after it at the last step; the version says how it scored
    history = client.get_metric_history(run.info.run_id, "eval/success")
    assert [m.step for m in history] == [0, 2]
    assert [m.value for m in history] == [metrics["eval_before/success"], metrics["eval_after/success"]]
    assert {"eval/success_ci_low", "eval/success_ci_high", "eval/tokens"} <= set(run.data.metrics)
    assert not any(k.startswith(("last/", "eval_after/")) for k in run.data.metrics)
    assert version.tags["eval.success"] == f"{metrics['eval_after/success']:.4f}"
    assert version.tags["rlcr.profile"] == run.data.params["profile"] and version.tags["source.run_id"] == run.info.run_id
    assert "Held-out company success" in version.description

    # every rlcr module the stage imported is a declared dependency (docs/reliability.md, item 10)
    deps = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["train"]["deps"]
    imported = json.loads((root / "imports.json").read_text())
    missing = [m for m in imported if not any(m == d or m.startswith(d.rstrip("/") + "/") for d in deps)]
    assert not missing, f"stage imports modules dvc.yaml does not list: {missing}"

    again = dvc(root, "repro", "train")
    assert "didn't change, skipping" in again.stdout and len(train_runs(root)[1]) == 1


def test_sigterm_mid_training_marks_the_run_killed_and_a_rerun_resumes(project_copy):
    root = project_copy
    tiny_project(root, iterations=500)
    dvc(root, "repro", "prepare")
    write_bootstrap(root)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "stages/train.py"], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    for line in proc.stdout:  # wait until a checkpoint exists (it 1), then stop it mid-training
        lines.append(line)
        if line.startswith("[train] it 2/"):
            break
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, "".join(lines) + out
    _, runs = train_runs(root)
    assert runs[-1].info.status == "KILLED"
    assert not (root / "models/trained").exists() and not (root / "metrics/train.json").exists()

    # started again (same run, a shorter schedule): resumes from the last checkpoint and finishes
    tiny_project(root, iterations=6)
    proc = subprocess.run([sys.executable, "stages/train.py"], cwd=root, capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    resumed = json.loads((root / "metrics/train.json").read_text())["train/resumed_from"]
    assert resumed >= 1 and f"at iteration {int(resumed)}" in proc.stdout
    assert train_runs(root)[1][-1].info.status == "FINISHED"
    # the finished run's checkpoints are gone: a later repro cannot resume a finished run from .state/
    assert not any((root / ".state/checkpoints/train").glob("*/*")), "checkpoints left after the outs were written"
