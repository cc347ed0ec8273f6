"""Prefect orchestration of the DVC pipeline: schedule it, retry what is safe to retry, see it in the UI.

Orchestration only: each task shells out to `dvc repro <stage>`, so DVC decides what is stale and the
stages stay the single implementation. `dvc repro` is idempotent (a finished stage is skipped), which
is what makes retries safe. A hung stage is killed by our own timeout (Prefect's task timeout cannot
interrupt a blocking call in a worker thread), and a rerun after the flow process was killed resumes
from the DVC outs already there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml
from prefect import flow, task

ROOT = Path(__file__).resolve().parents[1]


def pipeline_stages(root: Path) -> list[str]:
    """Stage names in dvc.yaml order (DVC resolves upstream deps itself)."""
    return list((yaml.safe_load((root / "dvc.yaml").read_text()) or {}).get("stages", {}))


def run_command(cmd: list[str], cwd: Path, timeout_s: float) -> str:
    """Run in its own process group; on timeout the whole group is killed and TimeoutError raised."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise TimeoutError(f"{' '.join(cmd)} ran past {timeout_s:.0f} s and was killed") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{out[-4000:]}")
    return out


@task(retries=2, retry_delay_seconds=[5, 30], task_run_name="repro-{stage}")
def repro_stage(root: str, stage: str, timeout_s: float) -> str:
    """`dvc repro <stage>`: idempotent, so a retry after a transient failure does no duplicate work."""
    out = run_command(["dvc", "repro", stage], Path(root), timeout_s)
    print(out.strip()[-2000:])
    return out


@task(retries=1, retry_delay_seconds=10, task_run_name="exp-run")
def exp_run(root: str, set_params: dict[str, str], timeout_s: float) -> str:
    """`dvc exp run --set-param k=v ...`: one experiment (a variant) of the whole pipeline."""
    args = [a for k, v in sorted(set_params.items()) for a in ("--set-param", f"{k}={v}")]
    out = run_command(["dvc", "exp", "run", *args], Path(root), timeout_s)
    print(out.strip()[-2000:])
    return out


@flow(name="rlcr-pipeline", log_prints=True)
def pipeline(root: str = str(ROOT), stages: list[str] | None = None, set_params: dict[str, str] | None = None,
             stage_timeout_s: float = 6 * 3600) -> list[str]:
    """Run the DVC stages in order (all by default), or one `dvc exp run` when params are set."""
    if set_params:
        exp_run(root, set_params, stage_timeout_s * max(len(pipeline_stages(Path(root))), 1))
        return ["exp"]
    done = []
    for stage in stages or pipeline_stages(Path(root)):
        repro_stage(root, stage, stage_timeout_s)
        done.append(stage)
    return done


if __name__ == "__main__":
    pipeline()
