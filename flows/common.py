"""What every RLCR flow shares: streamed commands, which failures are worth a retry, the GPU slot, the
MLflow runs of a flow run, and the markdown artifact a flow run leaves.

A command's output goes to the Prefect logs line by line while it runs (not at its end). A stage that
exits 2 has bad params (`rlcr.stage.run_stage`): `BadParams` is raised and no retry is attempted,
since the same params fail the same way. Anything else is `CommandFailed` and retried where the task
allows it, because DVC skips the work already done.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's rlcr

from rlcr.tracking import TAGS_ENV  # noqa: E402 - extra MLflow tags of every stage run: the flow run id


class CommandFailed(RuntimeError):
    """A command exited non-zero for a reason a retry may cure (a lock held, a crash)."""


class BadParams(CommandFailed):
    """A stage exited 2: params.yaml or a -S override is wrong. Retrying cannot help."""


def exited_with_bad_params(returncode: int, output: str) -> bool:
    """True when the command or the stage DVC ran exited 2 (rlcr.stage's code for bad params)."""
    return returncode == 2 or re.search(r"exited with 2\b", output) is not None


def retry_unless_bad_params(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect `retry_condition_fn`: retry every failure except bad params."""
    try:
        state.result()
    except BadParams:
        return False
    except BaseException:  # noqa: BLE001 - any other failure goes to the task's retry policy
        return True
    return True


def command_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a command: this interpreter's bin first (stage commands call `python`)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return {**env, **(extra or {})}


def run_command(cmd: list[str], cwd: Path, timeout_s: float, log: Callable[[str], None] | None = None,
                env: dict[str, str] | None = None, tail_lines: int = 200) -> str:
    """Run `cmd` in its own process group, passing each output line to `log` as it comes.

    Returns the last `tail_lines` lines. On timeout the whole group is killed and TimeoutError raised;
    exit 2 raises BadParams, any other non-zero exit CommandFailed (both with the output's tail)."""
    log = log or print
    proc = subprocess.Popen(cmd, cwd=cwd, env=env or command_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    tail: deque[str] = deque(maxlen=tail_lines)

    def pump() -> None:
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            log(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(timeout=5)
        raise TimeoutError(f"{' '.join(cmd)} ran past {timeout_s:.0f} s and was killed") from None
    except BaseException:  # the flow process is being stopped: do not leave the stage running
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        raise
    reader.join(timeout=30)
    out = "\n".join(tail)
    if proc.returncode != 0:
        kind = BadParams if exited_with_bad_params(proc.returncode, out) else CommandFailed
        raise kind(f"{' '.join(cmd)} exited {proc.returncode}:\n{out[-4000:]}")
    return out


def prefect_logger() -> Callable[[str], None]:
    """Log lines to the current Prefect run's logs (print outside a run)."""
    try:
        from prefect import get_run_logger

        logger = get_run_logger()
    except Exception:  # noqa: BLE001 - MissingContextError outside a run
        return print
    return logger.info


def flow_run_tags() -> dict[str, str]:
    """The MLflow tags that tie a stage's run to the current Prefect flow run."""
    from prefect.runtime import deployment, flow_run

    tags = {"prefect.flow_run_id": str(flow_run.id or ""), "prefect.flow_run_name": str(flow_run.name or "")}
    if deployment.id:
        tags["prefect.deployment"] = str(deployment.name)
    return {k: v for k, v in tags.items() if v}


def stage_env(extra_tags: dict[str, str] | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment stages run with: the flow run's MLflow tags in $RLCR_MLFLOW_TAGS."""
    return command_env({TAGS_ENV: json.dumps({**flow_run_tags(), **(extra_tags or {})}), **(extra or {})})


# ------------------------------------------------------------------------------- the GPU slot


def gpu_slot_name(host: str | None = None, devices: str | None = None) -> str:
    """One concurrency limit per GPU slot: `rlcr-gpu-<host>-<CUDA_VISIBLE_DEVICES>` (`all` when unset)."""
    host = host or socket.gethostname()
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "") if devices is None else devices
    clean = lambda s: re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")  # noqa: E731
    return f"rlcr-gpu-{clean(host)}-{clean(devices) or 'all'}"


def ensure_limit(name: str, limit: int = 1) -> None:
    """Create the global concurrency limit `name` (limit slots) if it is missing; never reset one."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            with suppress(ObjectAlreadyExists):
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=limit))


GPU_SLOT_LEASE_S = 60.0
"""The slot's lease, renewed every 45 s while the run lives: a run killed without a goodbye (SIGKILL, a
lost machine) frees its slot when the lease runs out, so the next run waits at most this plus the
server's 15-s sweep (measured: ~230 s of waiting with Prefect's default 300-s lease, ~60-75 s with this
one). 60 s is the shortest lease the Prefect server accepts."""


@contextmanager
def gpu_slot(timeout_s: float | None = None) -> Iterator[str]:
    """Hold this machine's GPU slot (CUDA_VISIBLE_DEVICES) for the block: two runs never share a GPU,
    even when two workers were started for one device. Yields the slot's name."""
    from prefect.concurrency.sync import concurrency

    name = gpu_slot_name()
    ensure_limit(name)
    prefect_logger()(f"holding GPU slot {name}")
    with concurrency(name, occupy=1, timeout_seconds=timeout_s, strict=True, lease_duration=GPU_SLOT_LEASE_S):
        yield name


# ------------------------------------------------------------------------- MLflow and artifacts


def check_tracking(root: Path) -> str:
    """The tracking URI the stages will use, checked reachable now (rlcr.tracking.require_reachable)."""
    from rlcr.config import ConfigError, load_params
    from rlcr.tracking import require_reachable, tracking_uri

    try:
        params = load_params(root / "params.yaml")
    except ConfigError:  # the stage itself reports it (exit 2, unretried)
        return tracking_uri_of_env(root)
    uri = tracking_uri(params.tracking, root)
    if params.tracking.enabled:
        require_reachable(uri)
    return uri


def tracking_uri_of_env(root: Path) -> str:
    """The tracking URI when params.yaml cannot be read: $MLFLOW_TRACKING_URI or the project's sqlite db."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(root / 'mlflow.db').resolve()}"


def mlflow_runs(uri: str, tag: str, values: list[str]) -> list[Any]:
    """Runs of every experiment whose tag `tag` is one of `values` (oldest first; one search per value,
    MLflow's filter has no OR)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()] if values else []
    if not experiments:
        return []
    runs = [r for v in values for r in client.search_runs(experiments, f"tags.`{tag}` = '{v}'", max_results=1000)]
    return sorted(runs, key=lambda r: r.info.start_time)


def run_link(uri: str, run: Any) -> str:
    """A markdown link to the run in the MLflow UI (http servers), else its id."""
    name = run.info.run_name or run.info.run_id
    if uri.startswith(("http://", "https://")):
        url = f"{uri.rstrip('/')}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
        return f"[{name}]({url})"
    return f"`{name}` (`{run.info.run_id}`)"


def runs_table(uri: str, runs: list[Any]) -> str:
    """Markdown table of MLflow runs: link, stage, status, variant, seed."""
    if not runs:
        return "No MLflow runs were recorded.\n"
    rows = ["| run | stage | status | variant | seed |", "|---|---|---|---|---|"]
    for r in runs:
        t = r.data.tags
        rows.append(f"| {run_link(uri, r)} | {t.get('rlcr.stage', '')} | {r.info.status} | "
                    f"{t.get('ablation', '')} | {t.get('seed', '')} |")
    return "\n".join(rows) + "\n"


def report_summary(root: Path) -> str:
    """The `## Summary` section of reports/report.md, or a line saying there is no report yet."""
    path = root / "reports/report.md"
    if not path.is_file():
        return "No report yet (`reports/report.md` is written by the `report` stage).\n"
    m = re.search(r"^## Summary\n(.*?)(?=^## |\Z)", path.read_text(), flags=re.S | re.M)
    return (m.group(1).strip() + "\n") if m else "The report has no Summary section.\n"


def artifact_key(text: str) -> str:
    """A valid Prefect artifact key (lowercase letters, digits and dashes)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:100]


def publish(key: str, markdown: str, description: str) -> None:
    """The flow run's markdown artifact (the UI's Artifacts tab); sync also inside an async flow."""
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(markdown=markdown, key=artifact_key(key), description=description, _sync=True)
