"""Prefect flows against a real local Prefect server (retries, our own timeout, resume after a kill)."""

from __future__ import annotations

import os
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
    env = {**os.environ, "PREFECT_API_URL": prefect_api["api"], "PREFECT_HOME": prefect_api["home"],
           "DVC_SITE_CACHE_DIR": str(root / ".state/dvc")}
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                          timeout=timeout)


def task_runs(prefect_api) -> list[dict]:
    r = httpx.post(f"{prefect_api['api']}/task_runs/filter", json={}, timeout=10)
    r.raise_for_status()
    return r.json()


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
    env = {**os.environ, "PREFECT_API_URL": prefect_api["api"], "PREFECT_HOME": prefect_api["home"],
           "DVC_SITE_CACHE_DIR": str(project_copy / ".state/dvc")}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=project_copy, env=env, stdout=subprocess.PIPE,
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
