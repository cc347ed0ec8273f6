"""Ablation sweeps across workers: variants x seeds as separate flow runs, each in its own checkout.

`sweep` (the controller, pool `rlcr-control`) starts one `rlcr-sweep-member` flow run per variant x
seed on the GPU pool (`rlcr-gpu`), so members run at the same time on as many workers as are free.
First one `base` member runs `prepare` and `bootstrap` once; every member then starts from its outs.

A member works in its own git checkout of the sweep's commit (`<worker checkout>/.state/sweep/<sweep
id>/<label>`), sets its params there (profile, `ablate.variants=[v]`, `ablate.seeds=[s]`, the sweep's
`set_params`), pulls its inputs from the DVC remote, runs `dvc repro ablate@<v>-<s>`, pushes its outs
and last uploads its small git-side files (dvc.lock, metrics, plots) to `<remote>/rlcr-sweeps/<sweep
id>/<label>/`, `done.json` last: that file is what "this member finished" means. The remote is a DVC
remote (by default this checkout's default remote, a local folder: .dvc/config), so members on other
machines share outs through it.

MLflow: every stage run is tagged with the member's flow run id, `rlcr.sweep_id` and
`rlcr.sweep_member`; `stages/ablate.py` nests the runs under one parent per sweep (rlcr/ablate.py).

Re-running a sweep (same profile, set_params and commit = same sweep id) skips every member whose
`done.json` is in the remote, so their MLflow runs are never duplicated. A member left RUNNING by a
worker died (its process is gone; members tag their runs with host and pid) is marked CRASHED in
Prefect and its MLflow run KILLED, then run again; a member still running is waited for, not
started twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.runtime import flow_run
from prefect.utilities.asyncutils import run_coro_as_sync

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ROOT,
    check_tracking,
    command_env,
    gpu_slot,
    mlflow_runs,
    prefect_logger,
    publish,
    run_command,
    runs_table,
    stage_env,
)

MEMBER_DEPLOYMENT = "rlcr-sweep-member/member"
BASE = "base"
BASE_STAGES = ["bootstrap"]  # and prepare, its upstream
BASE_FILES = ["dvc.lock", "metrics/prepare.json", "metrics/bootstrap.json"]
DONE = "done.json"


# ------------------------------------------------------------------------------- pure helpers


def sweep_id(profile: str, set_params: dict[str, Any] | None, commit: str) -> str:
    """What a rerun of the sweep shares: profile, the params set and the commit (not variants or
    seeds, so adding a seed reruns only the new members)."""
    data = json.dumps({"profile": profile, "set_params": set_params or {}, "commit": commit}, sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()[:12]


def member_label(variant: str, seed: int) -> str:
    """The member's name, as rlcr.ablate.run_label names its outs."""
    return f"{variant}__s{seed}"


def member_params(profile: str, set_params: dict[str, Any] | None, variant: str | None = None,
                  seed: int | None = None) -> dict[str, Any]:
    """Dotted params of one member: the sweep's, plus its variant and seed as one-entry matrix lists."""
    out: dict[str, Any] = {"profile": profile, **(set_params or {})}
    if variant is not None:
        out.update({"ablate.variants": [variant], "ablate.seeds": [seed]})
    return out


def apply_params(path: Path, dotted: dict[str, Any]) -> None:
    """Write dotted overrides into params.yaml (a key that does not exist there is an error)."""
    import yaml

    data = yaml.safe_load(path.read_text())
    for key, value in dotted.items():
        parts = key.split(".")
        node = data
        for p in parts[:-1]:
            if not isinstance(node, dict) or p not in node:
                raise KeyError(f"params.yaml: {key}: unknown key")
            node = node[p]
        if not isinstance(node, dict) or (parts[-1] not in node and key != "profile"):
            raise KeyError(f"params.yaml: {key}: unknown key")
        node[parts[-1]] = yaml.safe_load(value) if isinstance(value, str) else value
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


# -------------------------------------------------------------------------------- DVC remote


def remote_url(root: Path, dvc_remote: str = "") -> str:
    """`dvc_remote` if given, else the checkout's default DVC remote (a local path made absolute)."""
    if dvc_remote:
        return dvc_remote
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        name = repo.config["core"].get("remote")
        if not name:
            raise ValueError(f"{root}: no default DVC remote: `dvc remote add -d <name> <url>` or pass dvc_remote")
        url = str(repo.config["remote"][name]["url"])
    if "://" not in url and not Path(url).is_absolute():
        url = str((root / ".dvc" / url).resolve())
    return url


class SweepStore:
    """Files of a sweep under `<remote>/rlcr-sweeps/<sweep id>/`, through DVC's filesystem (any remote)."""

    def __init__(self, url: str, sid: str):
        from dvc.fs import get_cloud_fs

        cls, config, path = get_cloud_fs({}, url=url)
        self.fs, self.base = cls(**config), self._join(path, "rlcr-sweeps", sid)

    @staticmethod
    def _join(*parts: str) -> str:
        return "/".join(p.rstrip("/") for p in parts)

    def done(self, label: str) -> bool:
        return self.fs.exists(self._join(self.base, label, DONE))

    def upload(self, label: str, root: Path, files: list[str]) -> None:
        for rel in files:
            dest = self._join(self.base, label, rel)
            self.fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
            self.fs.put_file(str(root / rel), dest)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"files": files, "flow_run_id": str(flow_run.id or "")}, f)
        self.fs.put_file(f.name, self._join(self.base, label, DONE))
        Path(f.name).unlink()

    def download(self, label: str, root: Path, files: list[str]) -> None:
        for rel in files:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            self.fs.get_file(self._join(self.base, label, rel), str(root / rel))

    def read(self, label: str, rel: str) -> str | None:
        path = self._join(self.base, label, rel)
        return self.fs.cat_file(path).decode() if self.fs.exists(path) else None


def changed_files(root: Path) -> list[str]:
    """Files the run wrote on the git side (dvc.lock, uncached metrics and plots), params.yaml excluded."""
    lines = git(root, "status", "--porcelain", "--untracked-files=all").splitlines()
    files = sorted({ln[3:].strip() for ln in lines if ln[3:].strip() and not ln[3:].strip().startswith(".")})
    return [f for f in files if f != "params.yaml" and (root / f).is_file()]


# ------------------------------------------------------------------------------------ member


def member_checkout(root: Path, sid: str, label: str, commit: str) -> Path:
    """The member's own checkout of `commit` (cloned from the worker's checkout; kept across reruns so a
    killed stage resumes from its checkpoint)."""
    work = root / ".state/sweep" / sid / label
    if not (work / ".git").is_dir():
        shutil.rmtree(work, ignore_errors=True)
        work.parent.mkdir(parents=True, exist_ok=True)
        git(root, "clone", "--quiet", "--no-checkout", str(root), str(work))
    try:
        git(work, "checkout", "--quiet", "--force", commit)
    except subprocess.CalledProcessError as e:
        raise ValueError(f"{root} has no commit {commit}: fetch it on this worker first ({e.stderr.strip()})") from None
    return work


def close_stale_runs(uri: str, sid: str, label: str) -> int:
    """Mark KILLED the MLflow runs of this member left RUNNING by a run that died (SIGKILL, lost worker)."""
    from mlflow import MlflowClient

    stale = [r for r in mlflow_runs(uri, "rlcr.sweep_id", [sid])
             if r.data.tags.get("rlcr.sweep_member") == label and r.info.status == "RUNNING"]
    client = MlflowClient(tracking_uri=uri)
    for r in stale:
        client.set_terminated(r.info.run_id, status="KILLED")
    return len(stale)


@flow(name="rlcr-sweep-member", log_prints=True)
def sweep_member(sweep: str, label: str, stages: list[str], params: dict[str, Any], commit: str, dvc_remote: str,
                 root: str | None = None, stage_timeout_s: float = 6 * 3600) -> str:
    """One member of a sweep (see the module docstring): its checkout, `dvc repro <stages>`, outs pushed."""
    path, log = Path(root or ROOT), prefect_logger()
    uri = check_tracking(path)
    store = SweepStore(dvc_remote, sweep)
    run_coro_as_sync(tag_own_run())
    with gpu_slot():
        work = member_checkout(path, sweep, label, commit)
        apply_params(work / "params.yaml", params)
        env = command_env()
        run_command(["dvc", "remote", "add", "--local", "--force", "--default", "rlcr-sweep", dvc_remote], work, 60,
                    log, env)
        if label != BASE:
            store.download(BASE, work, BASE_FILES)
            run_command(["dvc", "pull", *BASE_STAGES, "prepare"], work, stage_timeout_s, log, env)
        if closed := close_stale_runs(uri, sweep, label):
            log(f"marked {closed} MLflow run(s) of {label} KILLED (left RUNNING by a run that died)")
        tags = {"rlcr.sweep_id": sweep, "rlcr.sweep_member": label}
        run_command(["dvc", "repro", *stages], work, stage_timeout_s, log, stage_env(tags))
        run_command(["dvc", "push"], work, stage_timeout_s, log, env)
        store.upload(label, work, changed_files(work))
    runs = mlflow_runs(uri, "prefect.flow_run_id", [str(flow_run.id)]) if flow_run.id else []
    publish(f"rlcr-sweep-{sweep}-{label}",
            f"# Sweep {sweep}: {label}\n\n`dvc repro {' '.join(stages)}` in `{work}`; outs pushed to "
            f"`{dvc_remote}`.\n\n## MLflow runs (tracking: `{uri}`)\n\n{runs_table(uri, runs)}",
            description=f"sweep {sweep} member {label}")
    return str(work)


# -------------------------------------------------------------------------------- controller


def process_gone(tags: list[str], host: str) -> bool:
    """True when a run's tags (`rlcr-host-<host>`, `rlcr-pid-<pid>`, set by the member) name a process of
    this host that no longer exists. A run on another host, or one not started yet, is not judged."""
    pid = next((t.removeprefix("rlcr-pid-") for t in tags if t.startswith("rlcr-pid-")), None)
    if f"rlcr-host-{host}" not in tags or not pid or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


async def settle_earlier(sid: str, label: str, poll_s: float = 5.0) -> None:
    """Earlier runs of this member that have not ended: mark CRASHED those whose process is gone (its
    worker died), wait for the others to end (a run on a lost machine of another host ends when it is
    marked Crashed, by Prefect's zombie detection or in the UI)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    live = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING]
    host, waited = socket.gethostname(), False
    async with get_client() as client:
        while True:
            runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[f"rlcr-sweep-{sid}", f"rlcr-member-{label}"]),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=live))))
            alive = []
            for r in runs:
                if process_gone(r.tags, host):
                    await client.set_flow_run_state(r.id, Crashed(message=f"its process is gone; sweep rerun "
                                                                          f"{flow_run.id} runs {label} again"), force=True)
                    prefect_logger()(f"{label}: earlier run {r.name} has no process left: marked CRASHED")
                else:
                    alive.append(r)
            if not alive:
                return
            if not waited:
                prefect_logger()(f"{label}: waiting for the earlier run(s) {[r.name for r in alive]} to end")
                waited = True
            await asyncio.sleep(poll_s)


async def tag_own_run() -> None:
    """Tag this flow run with its host and pid, so a rerun of the sweep can tell whether it died."""
    from prefect.client.orchestration import get_client

    if not flow_run.id:
        return
    async with get_client() as client:
        run = await client.read_flow_run(flow_run.id)
        tags = [*run.tags, f"rlcr-host-{socket.gethostname()}", f"rlcr-pid-{os.getpid()}"]
        await client.update_flow_run(flow_run.id, tags=tags)


async def run_member(sid: str, label: str, stages: list[str], params: dict[str, Any], commit: str, url: str,
                     deployment: str, job_variables: dict[str, Any], stage_timeout_s: float) -> str:
    """One member as its own flow run of `deployment` (on whichever worker is free); its final state
    (`skipped` when an earlier run of it finished meanwhile)."""
    from prefect.deployments import run_deployment

    await settle_earlier(sid, label)
    if SweepStore(url, sid).done(label):
        return "skipped"
    run = await run_deployment(
        deployment, parameters={"sweep": sid, "label": label, "stages": stages, "params": params, "commit": commit,
                                "dvc_remote": url, "stage_timeout_s": stage_timeout_s},
        flow_run_name=f"sweep-{sid}-{label}", tags=[f"rlcr-sweep-{sid}", f"rlcr-member-{label}"],
        job_variables=job_variables, timeout=None, as_subflow=True)
    prefect_logger()(f"{label}: {run.state.type.value} (flow run {run.id})")
    return run.state.type.value


@flow(name="rlcr-sweep", log_prints=True)
async def sweep(profile: str = "quick", variants: list[str] | None = None, seeds: list[int] | None = None,
                set_params: dict[str, str] | None = None, dvc_remote: str = "", tracking_uri: str = "",
                root: str | None = None, member_deployment: str = MEMBER_DEPLOYMENT,
                stage_timeout_s: float = 6 * 3600) -> dict[str, str]:
    """Ablation sweep: `variants` x `seeds` (default: ablate.variants and ablate.seeds of params.yaml)
    as separate member flow runs; returns each member's final state (or `skipped`: done before)."""
    import yaml

    path, log = Path(root or ROOT), prefect_logger()
    ablate = yaml.safe_load((path / "params.yaml").read_text())["ablate"]
    variants, seeds = list(variants or ablate["variants"]), list(seeds or ablate["seeds"])
    commit = git(path, "rev-parse", "HEAD")
    sid, url = sweep_id(profile, set_params, commit), remote_url(path, dvc_remote)
    uri = tracking_uri or check_tracking(path)
    job_variables = {"env": {"MLFLOW_TRACKING_URI": tracking_uri}} if tracking_uri else {}
    store = SweepStore(url, sid)
    log(f"sweep {sid}: {len(variants)} variants x {len(seeds)} seeds at {commit[:10]}, remote {url}")
    member = lambda label, stages, params: run_member(  # noqa: E731
        sid, label, stages, params, commit, url, member_deployment, job_variables, stage_timeout_s)

    states: dict[str, str] = {}
    if store.done(BASE):
        states[BASE] = "skipped"
    else:
        states[BASE] = await member(BASE, BASE_STAGES, member_params(profile, set_params))
    todo = []
    for v in variants:
        for s in seeds:
            label = member_label(v, s)
            if store.done(label):
                states[label] = "skipped"
            elif states[BASE] in ("skipped", "COMPLETED"):
                todo.append((label, [f"ablate@{v}-{s}"], member_params(profile, set_params, v, s)))
            else:
                states[label] = "NOT_RUN"
    for (label, _, _), state in zip(todo, await asyncio.gather(*(member(*t) for t in todo)), strict=True):
        states[label] = state
    publish(f"rlcr-sweep-{sid}", sweep_markdown(sid, commit, url, uri, states, store), f"sweep {sid}")
    failed = {k: v for k, v in states.items() if v not in ("COMPLETED", "skipped")}
    if failed:
        raise RuntimeError(f"sweep {sid}: members did not finish: {failed}")
    return states


def sweep_markdown(sid: str, commit: str, url: str, uri: str, states: dict[str, str], store: SweepStore) -> str:
    """The sweep's artifact: each member's state and evaluation, the report-like summary, its MLflow runs."""
    rows = ["| member | state | eval success | train success first -> last |", "|---|---|---|---|"]
    for label, state in states.items():
        text = store.read(label, f"metrics/ablations/{label}.json") if label != BASE else None
        m = json.loads(text) if text else {}
        variant = m.get("variant", "")
        success = m.get(f"{variant}/success")
        first, last = m.get("train/success_first"), m.get("train/success_last")
        rows.append(f"| `{label}` | {state} | {'' if success is None else f'{success:.3f}'} | "
                    f"{'' if first is None else f'{first:.2f} -> {last:.2f}'} |")
    runs = [r for r in mlflow_runs(uri, "rlcr.sweep_id", [sid]) if r.info.status != "KILLED"]
    return (f"# Ablation sweep {sid}\n\nCommit `{commit[:10]}`; outs in the DVC remote `{url}` "
            f"(`rlcr-sweeps/{sid}/` holds each member's dvc.lock and metrics).\n\n## Summary\n\n"
            + "\n".join(rows) + f"\n\n## MLflow runs (tracking: `{uri}`)\n\n{runs_table(uri, runs)}")
