"""An ablation sweep through the deployments of prefect.yaml: a real Prefect server on loopback, a real
MLflow server, two GPU-pool process workers (each its own checkout, as on two machines) and a control
worker; a local-folder DVC remote shared by all. Then a worker is killed mid-run and the sweep rerun.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from tests.test_flows import free_port

pytestmark = pytest.mark.slow
VARIANTS = ["collective", "no_verifiers"]


def wait_for(what: str, check, timeout: float, procs=(), explain=lambda: "") -> object:
    deadline = time.time() + timeout
    while True:
        for p in procs:
            assert p.poll() is None, f"{p.args} exited {p.returncode} while waiting for {what}"
        value = check()
        if value:
            return value
        assert time.time() < deadline, f"timed out waiting for {what}{explain()}"
        time.sleep(1)


def start(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the process and every descendant (a machine that goes away)."""
    try:
        family = [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]
    except psutil.NoSuchProcess:
        return
    for p in family:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=30)


def ok(path: str) -> bool:
    try:
        return httpx.get(path, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from tests.conftest import copy_project

    base = tmp_path_factory.mktemp("cluster")
    origin = copy_project(base / "origin")
    git = lambda *a, cwd=origin: subprocess.run(["git", *a], cwd=cwd, check=True, capture_output=True)  # noqa: E731
    roots = {}
    for name in ("a", "b"):
        git("clone", "-q", str(origin), str(base / name), cwd=base)
        roots[name] = base / name
    remote = base / "remote"
    pport, mport = free_port(), free_port()
    api, mlflow_uri = f"http://127.0.0.1:{pport}/api", f"http://127.0.0.1:{mport}"
    env = {**os.environ, "PREFECT_HOME": str(base / "prefect_home"), "PREFECT_API_URL": api,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_TRACKING_URI": mlflow_uri,
           "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_WORKER_PREFETCH_SECONDS": "2"}
    procs: dict[str, subprocess.Popen] = {}
    try:
        bin_ = Path(sys.executable).parent
        procs["server"] = start([str(bin_ / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(pport)],
                                base, {**env, "PREFECT_API_URL": ""}, base / "server.log")
        procs["mlflow"] = start([str(bin_ / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{base / 'mlflow.db'}",
                                 "--artifacts-destination", str(base / "mlartifacts"), "--host", "127.0.0.1", "--port",
                                 str(mport), "--workers", "1"], base, env, base / "mlflow.log")
        t0 = time.time()
        wait_for("servers", lambda: ok(f"{api}/health") and ok(f"{mlflow_uri}/health"), 180, procs.values())
        deploy = subprocess.run([sys.executable, "flows/deploy.py", "--gpu-slots", "2"], cwd=origin, env=env,
                                capture_output=True, text=True, timeout=180)
        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        worker = [str(bin_ / "prefect"), "worker", "start", "--limit", "1", "--pool"]
        for i, name in enumerate(("a", "b")):
            procs[name] = start([*worker, "rlcr-gpu", "--name", f"gpu-{name}"], roots[name],
                                {**env, "RLCR_ROOT": str(roots[name]), "CUDA_VISIBLE_DEVICES": str(i)},
                                base / f"worker-{name}.log")
        procs["control"] = start([str(bin_ / "prefect"), "worker", "start", "--pool", "rlcr-control", "--name", "ctl"],
                                 origin, {**env, "RLCR_ROOT": str(origin)}, base / "worker-control.log")
        print(f"servers up and deployed in {time.time() - t0:.0f} s")
        yield {"api": api, "mlflow": mlflow_uri, "origin": origin, "roots": roots, "remote": remote, "procs": procs,
               "base": base}
    finally:  # also when the set-up failed half-way
        for p in procs.values():
            kill_tree(p)


def api(method: str, url: str, body: dict | None = None, attempts: int = 6) -> httpx.Response:
    """One request to the Prefect API, retried like Prefect's own client does on 429/502/503: its sqlite
    database answers 503 while another writer holds it (seen in CI: the rerun's create_flow_run)."""
    for attempt in range(attempts):
        r = httpx.request(method, url, json=body, timeout=30)
        if r.status_code not in (429, 502, 503) or attempt == attempts - 1:
            return r
        time.sleep(2 ** attempt)
    return r


def api_post(cluster, path: str, body: dict) -> object:
    r = api("POST", f"{cluster['api']}{path}", body)
    r.raise_for_status()
    return r.json()


def run_sweep(cluster, seeds: list[int]) -> str:
    dep = api("GET", f"{cluster['api']}/deployments/name/rlcr-sweep/on-demand").json()
    params = {"profile": "quick", "variants": VARIANTS, "seeds": seeds, "dvc_remote": str(cluster["remote"]),
              "tracking_uri": cluster["mlflow"]}
    return api_post(cluster, f"/deployments/{dep['id']}/create_flow_run", {"parameters": params})["id"]


def flow_run(cluster, run_id: str) -> dict:
    return api("GET", f"{cluster['api']}/flow_runs/{run_id}").json()


def finished(cluster, run_id: str) -> dict | None:
    run = flow_run(cluster, run_id)
    return run if run["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None


def members(cluster, sid: str) -> list[dict]:
    return api_post(cluster, "/flow_runs/filter", {"flow_runs": {"tags": {"all_": [f"rlcr-sweep-{sid}"]}}})


def ablate_runs(cluster, sid: str):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=cluster["mlflow"])
    exp = client.get_experiment_by_name("rlcr-collective-rewards")
    runs = client.search_runs([exp.experiment_id], f"tags.`rlcr.sweep_id` = '{sid}'", max_results=1000)
    return client, [r for r in runs if r.data.tags.get("rlcr.stage", "").startswith("ablate@")]


def when(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def test_sweep_fans_out_over_two_workers_and_survives_a_killed_worker(cluster):
    t0 = time.time()
    run_id = run_sweep(cluster, [0, 1])
    procs = [cluster["procs"][k] for k in ("server", "mlflow", "a", "b", "control")]
    done = wait_for("the sweep", lambda: finished(cluster, run_id), 400, procs)
    assert done["state_type"] == "COMPLETED", (cluster["base"], done["state"])
    print(f"sweep of 2 variants x 2 seeds: {time.time() - t0:.0f} s")
    from flows.common import artifact_key
    from flows.sweep import sweep_id

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cluster["origin"], capture_output=True, text=True)
    sid = sweep_id("quick", None, commit.stdout.strip())
    runs = {m["name"].removeprefix(f"sweep-{sid}-"): m for m in members(cluster, sid)}
    labels = [f"{v}__s{s}" for v in VARIANTS for s in (0, 1)]
    assert sorted(runs) == sorted(["base", *labels])
    assert all(runs[k]["state_type"] == "COMPLETED" for k in runs)

    # both workers ran members (each works under its own checkout), and two members overlapped in time
    where = {k: [n for n, r in cluster["roots"].items() if (r / ".state/sweep" / sid / k / "dvc.lock").is_file()]
             for k in labels}
    assert all(len(w) == 1 for w in where.values()), where
    assert {w[0] for w in where.values()} == {"a", "b"}, where
    spans = sorted((when(runs[k]["start_time"]), when(runs[k]["end_time"])) for k in labels)
    assert any(spans[i + 1][0] < spans[i][1] for i in range(len(spans) - 1)), spans

    # MLflow: one parent, four children tagged with variant, seed and their member's flow run id
    client, children = ablate_runs(cluster, sid)
    assert len(children) == 4 and all(r.info.status == "FINISHED" for r in children)
    assert len({r.data.tags["mlflow.parentRunId"] for r in children}) == 1
    assert sorted((r.data.tags["ablation"], r.data.tags["seed"]) for r in children) == \
        sorted((v, str(s)) for v in VARIANTS for s in (0, 1))
    for r in children:
        label = f"{r.data.tags['ablation']}__s{r.data.tags['seed']}"
        assert r.data.tags["prefect.flow_run_id"] == runs[label]["id"]

    # the outs are in the DVC remote: each member's ablations/<label> (a .dir object) by its dvc.lock hash
    for k in labels:
        lock = yaml.safe_load((cluster["roots"][where[k][0]] / ".state/sweep" / sid / k / "dvc.lock").read_text())
        out = next(o for s in lock["stages"].values() for o in s.get("outs", []) if o["path"] == f"ablations/{k}")
        md5 = out["md5"]
        assert (cluster["remote"] / "files/md5" / md5[:2] / md5[2:]).is_file(), out
        assert (cluster["remote"] / "rlcr-sweeps" / sid / k / "done.json").is_file()

    # the artifacts: the sweep's summary with links to the MLflow runs, and one per member
    arts = {a["key"]: a for a in api_post(cluster, "/artifacts/filter", {})}
    sweep_art = arts[f"rlcr-sweep-{sid}"]
    assert all(f"`{k}` | COMPLETED" in sweep_art["data"] for k in labels)
    assert f"{cluster['mlflow']}/#/experiments/" in sweep_art["data"]
    assert all(artifact_key(f"rlcr-sweep-{sid}-{k}") in arts for k in labels), sorted(arts)

    # a third seed; kill the worker that runs one of its members (whichever it is), then rerun the sweep
    t1 = time.time()
    first = run_sweep(cluster, [0, 1, 2])
    new = [f"{v}__s2" for v in VARIANTS]

    def running_somewhere():
        live = {m["name"].removeprefix(f"sweep-{sid}-") for m in members(cluster, sid) if m["state_type"] == "RUNNING"}
        return [(w, k) for k in new if k in live for w, root in cluster["roots"].items()
                if (root / ".state/sweep" / sid / k / "params.yaml").is_file()]

    def states():
        logs = {w: (cluster["base"] / f"worker-{w}.log").read_text()[-1500:] for w in cluster["roots"]}
        return f"; members: {[(m['name'], m['state_type']) for m in members(cluster, sid)]}; worker logs: {logs}"

    gone, victim = wait_for("a member of the new seed running on a worker", running_somewhere, 240, procs,
                            states)[0]
    time.sleep(4)  # mid-stage
    kill_tree(cluster["procs"][gone])
    second = run_sweep(cluster, [0, 1, 2])
    procs = [p for p in procs if p is not cluster["procs"][gone]]
    done = wait_for("the rerun", lambda: finished(cluster, second), 400, procs)
    assert done["state_type"] == "COMPLETED", (cluster["base"], done["state"])
    print(f"kill of worker {gone} running {victim} and rerun: {time.time() - t1:.0f} s")
    assert finished(cluster, first)["state_type"] in ("FAILED", "CRASHED")  # its member was superseded

    _, children = ablate_runs(cluster, sid)
    finished_runs = [(r.data.tags["ablation"], r.data.tags["seed"]) for r in children if r.info.status == "FINISHED"]
    assert sorted(finished_runs) == sorted((v, str(s)) for v in VARIANTS for s in (0, 1, 2))  # each exactly once
    others = [r for r in children if r.info.status != "FINISHED"]
    assert all(r.info.status == "KILLED" and r.data.tags["rlcr.sweep_member"] == victim for r in others), \
        [(r.data.tags.get("rlcr.sweep_member"), r.info.status) for r in others]
    assert len([r for r in children if r.data.tags["rlcr.sweep_member"] in labels]) == 4  # never rerun
    assert json.loads((cluster["remote"] / "rlcr-sweeps" / sid / victim / "done.json").read_text())["files"]
