"""Prefect flows against a real local Prefect server: retries, bad params unretried, our own timeout, streamed
logs, artifacts, the flow run id on MLflow runs, MLflow unreachable, resume after the flow process is killed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from tests.test_stage_prepare import small_params

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    home = tmp_path_factory.mktemp("prefect_home")
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": ""}
    server = subprocess.Popen(["prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"
    deadline = time.time() + 120
    while True:
        try:
            if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert server.poll() is None and time.time() < deadline, "prefect server did not start"
        time.sleep(0.5)
    yield {"api": api, "home": str(home)}
    os.killpg(server.pid, 15)
    server.wait(timeout=30)


def run_flow(prefect_api, root: Path, args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(root)!r})
        from flows.pipeline import pipeline
        print("DONE", pipeline(root={str(root)!r}, {args}))
    """)
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=flow_env(prefect_api, root),
                          capture_output=True, text=True, timeout=timeout)


def flow_env(prefect_api, root: Path) -> dict[str, str]:
    return {**os.environ, "PREFECT_API_URL": prefect_api["api"], "PREFECT_HOME": prefect_api["home"],
            "DVC_SITE_CACHE_DIR": str(root / ".state/dvc"), "PYTHONUNBUFFERED": "1"}


def api_filter(prefect_api, what: str, body: dict | None = None) -> list[dict]:
    r = httpx.post(f"{prefect_api['api']}/{what}/filter", json=body or {}, timeout=10)
    r.raise_for_status()
    return r.json()


def task_runs(prefect_api) -> list[dict]:
    return api_filter(prefect_api, "task_runs")


def test_flow_runs_prepare_on_the_server_and_is_idempotent(prefect_api, project_copy):
    small_params(project_copy)
    proc = run_flow(prefect_api, project_copy, "stages=['prepare']")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "DONE ['prepare']" in proc.stdout
    assert (project_copy / "data/tasks/train.parquet").exists()
    flows = httpx.post(f"{prefect_api['api']}/flow_runs/filter", json={}, timeout=10).json()
    assert any(f["state_type"] == "COMPLETED" for f in flows)
    # a rerun (e.g. after the flow process was killed) resumes from the DVC outs: nothing redone
    lock = (project_copy / "dvc.lock").read_text()
    again = run_flow(prefect_api, project_copy, "stages=['prepare']")
    assert again.returncode == 0 and "didn't change, skipping" in again.stdout + again.stderr
    assert (project_copy / "dvc.lock").read_text() == lock


def test_transient_failure_is_retried(prefect_api, project_copy):
    import zc.lockfile

    small_params(project_copy)
    # another DVC process holding the repo lock is a real transient failure: dvc gives up after ~3 s.
    # Hold it until Prefect has scheduled a retry, then let go.
    (project_copy / ".dvc/tmp").mkdir(parents=True, exist_ok=True)
    lock = zc.lockfile.LockFile(str(project_copy / ".dvc/tmp/lock"))
    code = f"import sys; sys.path.insert(0, {str(project_copy)!r}); from flows.pipeline import pipeline; " \
           f"pipeline(root={str(project_copy)!r}, stages=['prepare'])"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=project_copy, env=flow_env(prefect_api, project_copy), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 180
        while not any(t["state_name"] == "AwaitingRetry" for t in task_runs(prefect_api)):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.time() < deadline, "no retry was scheduled"
            time.sleep(0.5)
    finally:
        lock.close()
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    runs = [t for t in task_runs(prefect_api) if t["name"] == "repro-prepare" and t["state_type"] == "COMPLETED"]
    assert max(t["run_count"] for t in runs) == 2
    assert (project_copy / "data/tasks/train.parquet").exists()


def test_hung_step_is_killed_by_our_timeout(tmp_path):
    from flows.pipeline import run_command

    start = time.time()
    with pytest.raises(TimeoutError, match="was killed"):
        run_command([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path, timeout_s=1)
    assert time.time() - start < 15


def flow_runs(prefect_api) -> list[dict]:
    return api_filter(prefect_api, "flow_runs", {"sort": "START_TIME_DESC"})


def test_stage_runs_carry_the_flow_run_id_and_the_run_publishes_an_artifact(prefect_api, project_copy):
    from mlflow import MlflowClient

    small_params(project_copy)
    proc = run_flow(prefect_api, project_copy, "stages=['prepare']")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = next(f for f in flow_runs(prefect_api) if f["state_type"] == "COMPLETED")
    client = MlflowClient(tracking_uri=f"sqlite:///{project_copy / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlcr-collective-rewards")
    [stage_run] = client.search_runs([exp.experiment_id], f"tags.`prefect.flow_run_id` = '{run['id']}'")
    assert stage_run.data.tags["rlcr.stage"] == "prepare"
    # the stage's own output reached the flow run's logs
    logs = api_filter(prefect_api, "logs", {"logs": {"flow_run_id": {"any_": [run["id"]]}}})
    assert any("Running stage 'prepare'" in entry["message"] for entry in logs)
    arts = api_filter(prefect_api, "artifacts", {"artifacts": {"flow_run_id": {"any_": [run["id"]]}}})
    [art] = [a for a in arts if a["type"] == "markdown"]
    assert "## Report summary" in art["data"] and stage_run.info.run_id in art["data"]


def test_bad_params_fail_at_once_without_retries(prefect_api, project_copy):
    small_params(project_copy, shuffle=True)  # prepare.shuffle: unknown key -> the stage exits 2
    start = time.time()
    proc = run_flow(prefect_api, project_copy, "stages=['prepare']")
    seconds = time.time() - start
    assert proc.returncode != 0 and "prepare.shuffle: unknown key" in proc.stdout + proc.stderr
    runs = [t for t in task_runs(prefect_api) if t["name"] == "repro-prepare" and t["state_type"] == "FAILED"]
    assert runs and max(t["run_count"] for t in runs) == 1  # retries=2 with 5 s + 30 s delays were not used
    print(f"bad params: flow failed in {seconds:.1f} s")


def test_output_is_streamed_while_the_command_runs(tmp_path):
    from flows.common import run_command

    seen: list[tuple[float, str]] = []
    start = time.time()
    code = "import time; print('first', flush=True); time.sleep(3); print('second', flush=True)"
    run_command([sys.executable, "-c", code], tmp_path, 30, lambda line: seen.append((time.time() - start, line)))
    assert [line for _, line in seen] == ["first", "second"]
    assert seen[0][0] < seen[1][0] - 2  # the first line arrived before the command ended


def test_exit_2_is_bad_params_and_other_failures_are_retryable(tmp_path):
    from flows.common import BadParams, CommandFailed, run_command

    with pytest.raises(BadParams):
        run_command([sys.executable, "-c", "import sys; sys.exit(2)"], tmp_path, 30, lambda _: None)
    with pytest.raises(CommandFailed) as failed:
        run_command([sys.executable, "-c", "import sys; sys.exit(1)"], tmp_path, 30, lambda _: None)
    assert not isinstance(failed.value, BadParams)


def test_unreachable_mlflow_is_a_clear_error_within_10_s(project_copy):
    """Connection refused (nothing listens) and a server that accepts but never answers."""
    small_params(project_copy)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (backlog), never reads or answers
    try:
        for uri in (f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{silent.getsockname()[1]}"):
            env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
            start = time.time()
            proc = subprocess.run([sys.executable, "stages/prepare.py"], cwd=project_copy, env=env,
                                  capture_output=True, text=True, timeout=120)
            seconds = time.time() - start
            assert proc.returncode == 1, proc.stderr[-2000:]
            assert f"MLflow tracking server {uri} is unreachable" in proc.stderr, proc.stderr[-2000:]
            assert seconds < 10, f"{uri}: {seconds:.1f} s"
            assert not (project_copy / "data/tasks/train.parquet").exists()
            print(f"{uri}: clear error in {seconds:.1f} s")
    finally:
        silent.close()


def test_flow_killed_mid_stage_then_rerun_resumes_from_outs_and_checkpoint(prefect_api, project_copy):
    from tests.test_train_stage import tiny_project

    root = project_copy
    tiny_project(root, iterations=6)
    code = (f"import sys; sys.path.insert(0, {str(root)!r}); from flows.pipeline import pipeline; "
            f"pipeline(root={str(root)!r}, stages=['prepare', 'bootstrap', 'train'])")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=root, env=flow_env(prefect_api, root), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    for line in proc.stdout:  # a checkpoint exists once iteration 2 is logged: kill flow, dvc and stage
        lines.append(line)
        if "[train] it 2/" in line:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert "[train] it 2/" in lines[-1], "".join(lines[-50:])
    assert not (root / "models/trained").exists()

    again = run_flow(prefect_api, root, "stages=['prepare', 'bootstrap', 'train']", timeout=600)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-4000:]
    assert "Stage 'prepare' didn't change, skipping" in out and "Stage 'bootstrap' didn't change, skipping" in out
    assert json.loads((root / "metrics/train.json").read_text())["train/resumed_from"] >= 1
