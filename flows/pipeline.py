"""Prefect orchestration of the DVC pipeline: schedule it, retry what is safe to retry, see it in the UI.

Orchestration only: each task shells out to `dvc repro <stage>` (or `dvc exp run`), so DVC decides what
is stale and the stages stay the single implementation. `dvc repro` is idempotent (a finished stage
is skipped), which is what makes retries safe; a stage that exits 2 (bad params) fails at once,
unretried. A hung stage is killed by our own timeout (Prefect's task timeout cannot interrupt a
blocking call in a worker thread), and a rerun after the flow process was killed resumes from the DVC
outs already there and from the stage's last checkpoint.

Each flow run holds its machine's GPU slot (flows.common.gpu_slot), checks the MLflow server answers
before any stage starts, streams the stages' output to its logs, tags the stages' MLflow runs with
its flow run id, and publishes a markdown artifact: the report's summary and links to its MLflow runs.
Deployments: prefect.yaml.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from prefect import flow, task
from prefect.runtime import flow_run

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ROOT,
    check_tracking,
    gpu_slot,
    mlflow_runs,
    prefect_logger,
    publish,
    report_summary,
    retry_unless_bad_params,
    run_command,
    runs_table,
    stage_env,
)


def pipeline_stages(root: Path) -> list[str]:
    """Stage names in dvc.yaml order (DVC resolves upstream deps itself)."""
    return list((yaml.safe_load((root / "dvc.yaml").read_text()) or {}).get("stages", {}))


def set_param_args(set_params: dict[str, str] | None, profile: str | None = None) -> list[str]:
    """`--set-param k=v` arguments, sorted, profile first when given (dvc exp run -S syntax)."""
    items = ([("profile", profile)] if profile else []) + sorted((set_params or {}).items())
    return [a for k, v in items for a in ("--set-param", f"{k}={v}")]


@task(retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=retry_unless_bad_params,
      task_run_name="repro-{stage}")
def repro_stage(root: str, stage: str, timeout_s: float) -> str:
    """`dvc repro <stage>`: idempotent, so a retry after a transient failure does no duplicate work."""
    return run_command(["dvc", "repro", stage], Path(root), timeout_s, prefect_logger(), stage_env())


@task(retries=1, retry_delay_seconds=10, retry_condition_fn=retry_unless_bad_params, task_run_name="exp-run")
def exp_run(root: str, args: list[str], timeout_s: float) -> str:
    """`dvc exp run <args>`: one experiment (a variant) of the whole pipeline."""
    return run_command(["dvc", "exp", "run", *args], Path(root), timeout_s, prefect_logger(), stage_env())


def publish_run(root: Path, uri: str, title: str, detail: str) -> None:
    """The flow run's artifact: what ran, the report's summary, and its MLflow runs."""
    runs = mlflow_runs(uri, "prefect.flow_run_id", [str(flow_run.id)]) if flow_run.id else []
    publish(f"rlcr-{flow_run.name or 'local'}",
            f"# {title}\n\n{detail}\n\n## Report summary\n\n{report_summary(root)}\n"
            f"## MLflow runs (tracking: `{uri}`)\n\n{runs_table(uri, runs)}",
            description=title)


@flow(name="rlcr-pipeline", log_prints=True)
def pipeline(root: str | None = None, stages: list[str] | None = None, set_params: dict[str, str] | None = None,
             stage_timeout_s: float = 6 * 3600) -> list[str]:
    """Run the DVC stages in order (all by default), or one `dvc exp run` when params are set."""
    if set_params:
        experiment(root=root, set_params=set_params, stage_timeout_s=stage_timeout_s)
        return ["exp"]
    path = Path(root or ROOT)
    root = str(path)
    uri = check_tracking(path)
    todo, done = stages or pipeline_stages(path), []
    try:
        with gpu_slot():
            for stage in todo:
                repro_stage(root, stage, stage_timeout_s)
                done.append(stage)
    finally:  # a failed run publishes too: what ran, and where it stopped
        left = [f"`{s}`" for s in todo if s not in done]
        publish_run(path, uri, "RLCR pipeline", f"Stages done: {', '.join(f'`{s}`' for s in done) or 'none'} "
                    f"(`dvc repro`)." + (f" Not done: {', '.join(left)}." if left else ""))
    return done


@flow(name="rlcr-experiment", log_prints=True)
def experiment(root: str | None = None, profile: str | None = None, set_params: dict[str, str] | None = None,
               name: str | None = None, temp: bool = True, stage_timeout_s: float = 6 * 3600) -> str:
    """One `dvc exp run -S k=v ...` (in a temporary copy of the checkout unless temp is false, so runs
    of other flows in the same checkout are not disturbed); `dvc exp show` lists it afterwards."""
    path = Path(root or ROOT)
    uri = check_tracking(path)
    name = name or f"rlcr-{flow_run.name or 'local'}"
    args = (["--temp"] if temp else []) + ["--name", name] + set_param_args(set_params, profile)
    with gpu_slot():
        exp_run(str(path), args, stage_timeout_s * max(len(pipeline_stages(path)), 1))
    publish_run(experiment_root(path, name), uri, "RLCR experiment", f"`dvc exp run {' '.join(args)}`")
    return name


def experiment_root(root: Path, name: str) -> Path:
    """A folder holding the experiment's reports/report.md (read from its git ref; the checkout itself
    when the experiment has no report)."""
    refs = subprocess.run(["git", "for-each-ref", "--format=%(refname)", "refs/exps"], cwd=root, capture_output=True,
                          text=True).stdout.split()
    ref = next((r for r in refs if r.rsplit("/", 1)[-1] == name), None)
    show = subprocess.run(["git", "show", f"{ref}:reports/report.md"], cwd=root, capture_output=True, text=True)
    if not ref or show.returncode != 0:
        return root
    folder = Path(tempfile.mkdtemp(prefix="rlcr-exp-"))
    (folder / "reports").mkdir()
    (folder / "reports/report.md").write_text(show.stdout)
    return folder


if __name__ == "__main__":
    pipeline()
