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
        "rlcr.cpu_kernels": os.environ.get("ATEN_CPU_CAPABILITY", "native"),  # rlcr.env.cpu_kernels
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


# ------------------------------------------------------------------ headline metrics (comparison)
#
# Every run that evaluates a policy (the train run, each ablation variant x seed) logs the SAME few
# keys, so MLflow's compare view and DVC's `metrics show` put runs side by side on one row per key.
# The full tables stay in the metrics files and are logged as artifacts, not as thousands of metrics.

HEADLINE_KEYS = ("eval/success", "eval/success_ci_low", "eval/success_ci_high", "eval/tasks", "eval/tokens",
                 "eval/critical_path_ratio", "eval/malformed_rate", "behaviour/false_approval_rate",
                 "behaviour/idle_agents_per_hire", "behaviour/collective_thinking")
"""The headline of one evaluated policy, in this order: held-out success with its 95% interval and
number of tasks, generated tokens per episode, modelled time over tokens (critical path / total),
malformed turns, and the evaluation rollout's cover-up (false approvals per checked approval),
free-riding (idle hires per hire) and collective thinking. A key with no value (no checked approval,
no hire) is left out, never written as NaN. Few on purpose: MLflow's compare view lists metrics
alphabetically in a table that shows about six rows before it scrolls, and `eval/success` is sixth."""

_FROM_EVALUATE = {"eval/success": "success", "eval/success_ci_low": "success_ci_low",
                  "eval/success_ci_high": "success_ci_high", "eval/tasks": "tasks", "eval/tokens": "tokens",
                  "eval/critical_path_ratio": "time/critical_path_ratio",
                  "eval/malformed_rate": "behaviour/malformed_rate",
                  "behaviour/false_approval_rate": "behaviour/false_approval_rate",
                  "behaviour/idle_agents_per_hire": "behaviour/idle_agents_per_hire",
                  "behaviour/collective_thinking": "behaviour/collective_thinking"}


def headline_from_evaluation(metrics: dict[str, Any], run: str) -> dict[str, float]:
    """The headline of run `run` in `rlcr.evaluate` metrics (keys `<run>/success`, ...), in HEADLINE_KEYS order."""
    out = {}
    for key, src in _FROM_EVALUATE.items():
        value = metrics.get(f"{run}/{src}")
        if isinstance(value, (int, float)) and value == value:
            out[key] = float(value)
    return out


def wilson_interval(successes: float, n: float, level: float = 0.95) -> tuple[float, float]:
    """Binomial (Wilson score) interval of a success rate: for an eval of one episode per task, where
    no per-task resampling is at hand (the train stage's held-out check)."""
    from scipy.stats import norm

    if n <= 0:
        raise ValueError("wilson_interval needs n > 0")
    p, z = successes / n, float(norm.ppf(0.5 + level / 2.0))
    centre, half = p + z * z / (2 * n), z * ((p * (1 - p) + z * z / (4 * n)) / n) ** 0.5
    den = 1 + z * z / n
    return max(0.0, (centre - half) / den), min(1.0, (centre + half) / den)


def headline_from_held_out(metrics: dict[str, float], level: float = 0.95) -> dict[str, float]:
    """The headline of a `rlcr.train.loop.evaluate` result (`eval/success`, `eval/episodes`, ...): one
    episode per task, so the interval is Wilson's; keys it does not measure are left out."""
    if not metrics.get("eval/episodes"):
        return {}
    n, success = metrics["eval/episodes"], metrics["eval/success"]
    low, high = wilson_interval(success * n, n, level)
    out = {"eval/success": success, "eval/success_ci_low": low, "eval/success_ci_high": high, "eval/tasks": n}
    for key, src in (("eval/tokens", "eval/total_tokens"), ("eval/malformed_rate", "eval/malformed_rate")):
        if src in metrics:
            out[key] = float(metrics[src])
    return {k: out[k] for k in HEADLINE_KEYS if k in out}


def log_table(tracker: Tracker, table: dict[str, Any], artifact_file: str) -> None:
    """A whole metrics table as one JSON artifact (browsable in the UI, not thousands of metric columns)."""
    tracker.log_text(json.dumps(table, indent=1, sort_keys=True, default=str), artifact_file)


def describe_run(tracker: Tracker, markdown_text: str) -> None:
    """The run's description in the MLflow UI (tag `mlflow.note.content`, markdown)."""
    tracker.set_tags({"mlflow.note.content": markdown_text})


def tag_model_version(tracker: Tracker, model: str, tags: dict[str, str], description: str) -> str | None:
    """Tag and describe the version of registered model `model` that this run created, adding the
    source (`source.run_id`, `source.git_commit`, `source.stage`); the version, or None when tracking
    is off or the run registered none."""
    client = getattr(tracker, "client", None)
    if client is None or tracker.run_id is None:
        return None
    versions = client.search_model_versions(f"name='{model}' and run_id='{tracker.run_id}'")
    if not versions:
        return None
    version = max(versions, key=lambda v: int(v.version)).version
    run_tags = client.get_run(tracker.run_id).data.tags
    source = {"source.run_id": tracker.run_id, "source.git_commit": run_tags.get("git.commit", "unknown"),
              "source.stage": run_tags.get("rlcr.stage", "")}
    for k, v in {**tags, **source}.items():
        client.set_model_version_tag(model, version, k, str(v))
    client.update_model_version(model, version, description=description)
    return version


EVALUATE_LOGGED = ("*__*/success", "*__*/success_ci_low", "*__*/success_ci_high", "*__*/tokens",
                   "*__*/behaviour/malformed_rate", "*__*/transfer/success",
                   "compare/*/*/success_diff", "compare/*/*/success_diff_ci_low", "compare/*/*/success_diff_ci_high",
                   "compare/*/*/critical_path_ratio", "compare/*/*/tokens_ratio")
"""The `evaluate` run's MLflow metrics (fnmatch patterns over metrics/eval.json, `*` spanning no `/`):
per rollout its success with CI and cost, per comparison the paired difference and time ratio."""


def select_metrics(metrics: dict[str, Any], patterns: tuple[str, ...]) -> dict[str, float]:
    """The float entries of `metrics` whose key matches one of `patterns`; `*` matches within one
    path segment only, so `compare/*/*/success_diff` does not take `compare/a/b/short/success_diff`."""
    import re

    rx = re.compile("|".join(re.escape(p).replace(r"\*", "[^/]*") for p in patterns))
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and rx.fullmatch(k)}
