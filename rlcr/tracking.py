"""MLflow tracking: one run per stage execution, lineage tags, and honest run status.

`stage_run(...)` opens a run and yields a `Tracker`. The run ends FINISHED on success, FAILED on an
exception (re-raised), and KILLED on SIGTERM (turned into `Terminated`, which exits the process
with 143). With `tracking.enabled: false` the same code gets a `NullTracker` that records nothing.

Lineage tags on every run: `rlcr.stage`, `rlcr.profile`, `rlcr.params_hash`, `git.commit`,
`git.dirty`, and `dvc.dep.<path>` = md5 of each dependency the stage declares in dvc.yaml (for a
folder: md5 over its files' relative paths and md5s, not DVC's own `.dir` hash).

Covers: status on exception and SIGTERM in the main thread. Does not cover: SIGKILL (the run stays
RUNNING; nothing in-process can observe it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from rlcr.config import Params, TrackingConfig

MLFLOW_PARAM_MAX = 6000
TAGS_ENV = "RLCR_MLFLOW_TAGS"
"""JSON object of extra tags for every run (the Prefect flows set it: `prefect.flow_run_id`, ...)."""


class TrackingUnavailable(RuntimeError):
    """The MLflow tracking server does not answer: fail at once instead of MLflow's minutes of retries."""


class Terminated(BaseException):
    """Raised in the main thread when SIGTERM arrives, so cleanup runs and the run is marked KILLED."""


class Tracker(Protocol):
    run_id: str | None

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...
    def log_params(self, params: dict[str, Any]) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...
    def log_text(self, text: str, artifact_file: str) -> None: ...


class NullTracker:
    """Tracking off: every call does nothing."""

    run_id = None

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        pass

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def set_tags(self, tags: dict[str, str]) -> None:
        pass

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        pass

    def log_text(self, text: str, artifact_file: str) -> None:
        pass


class MlflowTracker:
    """Thin wrapper over MlflowClient bound to one run (no global active-run state)."""

    def __init__(self, client: Any, run_id: str):
        self.client, self.run_id = client, run_id

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step or 0) for k, v in metrics.items() if v is not None]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, _param_value(v)) for k, v in flatten(params).items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)


# ------------------------------------------------------------------------------- pure helpers


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists stay whole (logged as JSON)."""
    if dataclasses.is_dataclass(data):
        data = dataclasses.asdict(data)
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(flatten(v, key) if isinstance(v, dict) else {key: v})
    return out


def _param_value(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
    return s if len(s) <= MLFLOW_PARAM_MAX else s[: MLFLOW_PARAM_MAX - 20] + "...<truncated>"


def tracking_uri(cfg: TrackingConfig, root: Path) -> str:
    """params > $MLFLOW_TRACKING_URI > sqlite db at the project root (the file store errors out)."""
    return cfg.uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(root / 'mlflow.db').resolve()}"


def git_state(root: Path) -> dict[str, str]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"git.commit": commit, "git.dirty": str(bool(dirty)).lower()}


def file_md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def path_md5(path: Path) -> str:
    if path.is_file():
        return file_md5(path)
    if path.is_dir():
        h = hashlib.md5()
        for p in sorted(q for q in path.rglob("*") if q.is_file()):
            h.update(f"{p.relative_to(path)}:{file_md5(p)}\n".encode())
        return h.hexdigest()
    return "missing"


def stage_deps(root: Path, stage: str) -> list[str]:
    """The deps dvc.yaml declares for a stage (for foreach stages, the template's deps)."""
    import yaml

    dvc_file = root / "dvc.yaml"
    if not dvc_file.exists():
        return []
    stages = (yaml.safe_load(dvc_file.read_text()) or {}).get("stages", {})
    spec = stages.get(stage.split("@")[0], {})
    spec = spec.get("do", spec)
    return [d if isinstance(d, str) else next(iter(d)) for d in spec.get("deps", [])]


def lineage_tags(root: Path, stage: str, params: Params) -> dict[str, str]:
    tags = {
        "rlcr.stage": stage,
        "rlcr.profile": params.profile,
        "rlcr.params_hash": params.section_hash(),
        **git_state(root),
    }
    for dep in stage_deps(root, stage):
        if "${" not in dep:
            tags[f"dvc.dep.{dep}"] = path_md5(root / dep)[:12]
    return tags


def env_tags() -> dict[str, str]:
    """Tags from $RLCR_MLFLOW_TAGS (a JSON object); malformed JSON is an error naming the variable."""
    raw = os.environ.get(TAGS_ENV, "")
    try:
        tags = json.loads(raw) if raw else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"${TAGS_ENV} is not a JSON object: {e}") from None
    if not isinstance(tags, dict):
        raise ValueError(f"${TAGS_ENV} is not a JSON object: {raw[:80]}")
    return {str(k): str(v) for k, v in tags.items()}


def require_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """For an http(s) tracking URI, one GET of the server's /health within timeout_s, else
    TrackingUnavailable naming the URI and what to do (MLflow's own client retries for minutes)."""
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    url = f"{uri.rstrip('/')}/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            if resp.status == 200:
                return
            why = f"HTTP {resp.status}"
    except (urllib.error.URLError, OSError) as e:
        why = str(getattr(e, "reason", e))
    raise TrackingUnavailable(f"MLflow tracking server {uri} is unreachable ({why}): start it, or point "
                              "tracking.uri / $MLFLOW_TRACKING_URI at a running one, or set tracking.enabled: "
                              "false to run without tracking")


# --------------------------------------------------------------------------------- the run


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM -> Terminated in the main thread, so `finally` blocks and run status updates happen."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def stage_run(
    stage: str,
    params: Params,
    root: Path,
    run_name: str | None = None,
    tags: dict[str, str] | None = None,
    parent_run_id: str | None = None,
) -> Iterator[Tracker]:
    """One MLflow run for one stage execution; status FINISHED / FAILED / KILLED as it ends."""
    with _sigterm_raises():
        if not params.tracking.enabled:
            yield NullTracker()
            return
        uri = tracking_uri(params.tracking, root)
        require_reachable(uri)  # before importing mlflow (seconds): the answer comes fast
        import mlflow
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        mlflow.set_tracking_uri(uri)
        experiment = client.get_experiment_by_name(params.tracking.experiment)
        exp_id = experiment.experiment_id if experiment else client.create_experiment(
            params.tracking.experiment, artifact_location=(root / "mlartifacts").resolve().as_uri()
        )
        name = run_name or f"{stage}__{params.profile}__{params.seed}__{time.strftime('%Y%m%d-%H%M%S')}"
        all_tags = {**lineage_tags(root, stage, params), **env_tags(), **(tags or {})}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = client.create_run(exp_id, run_name=name, tags=all_tags)
        tracker = MlflowTracker(client, run.info.run_id)
        status = "FAILED"
        try:
            tracker.log_params(params)
            yield tracker
            status = "FINISHED"
        except (Terminated, KeyboardInterrupt):
            status = "KILLED"
            raise
        finally:
            client.set_terminated(run.info.run_id, status=status)


def exit_code(exc: BaseException) -> int:
    """143 for SIGTERM (the shell convention), 1 for anything else."""
    return 128 + signal.SIGTERM if isinstance(exc, Terminated) else 1
