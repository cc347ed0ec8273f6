"""Policies as MLflow models (`mlflow.transformers` flavour): logged, registered, loadable anywhere.

    log_policy(tracker, folder, name)             an HF policy folder as a `text-generation` model
    log_adapter(tracker, adapter, base, name)     a LoRA adapter (peft) that references its base folder
    register_model(tracker, info)                 a new version of `rlcr-policy`, alias latest-trained

A logged policy opens in a fresh process with `mlflow.transformers.load_model(uri)` (a text
generation pipeline; `return_type="components"` gives the model and tokenizer), from the run
(`runs:/<run>/policy`: the run's artifact folder `policy`) or the registry (`models:/rlcr-policy@latest-trained`).
The folder is logged from disk (the model is not loaded to log it), and the pip requirements are
the installed versions of what loading needs, given explicitly: without them MLflow spends ~14 s
resolving them per model.

An adapter is logged without the base weights: the model records `base` (an absolute local path,
e.g. the project's models/bootstrap) and loading it applies the adapter to that folder, so it loads
only where that folder exists. The merged policy the train stage writes is the self-contained one.

With a tracker that records nothing (tracking disabled, `NullTracker`) every call is a no-op.
"""

from __future__ import annotations

import importlib.metadata
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REGISTERED_MODEL = "rlcr-policy"
ALIAS = "latest-trained"
TASK = "text-generation"
REQUIREMENTS = ("torch", "transformers", "safetensors", "accelerate")


def pip_requirements(*extra: str) -> list[str]:
    """`name==version` of the installed packages that loading a policy needs (plus `extra`)."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in (*REQUIREMENTS, *extra)]


def _client(tracker) -> Any | None:
    client = getattr(tracker, "client", None)
    return client if client is not None and getattr(tracker, "run_id", None) else None


def _log_saved(tracker, client, transformers_model, name: str, **kw):
    """`mlflow.transformers.save_model` into a temporary folder, then that folder as the run's
    artifact `name` (so `runs:/<run>/<name>` is the model and the run lists it) -> ModelInfo-like."""
    import mlflow.transformers
    from mlflow.models import Model

    with tempfile.TemporaryDirectory(prefix="rlcr-mlmodel-") as tmp:
        path = Path(tmp) / name
        mlflow.transformers.save_model(transformers_model, str(path), task=TASK, **kw)
        client.log_artifacts(tracker.run_id, str(path), name)
        model = Model.load(str(path / "MLmodel"))
    return LoggedPolicy(f"runs:/{tracker.run_id}/{name}", f"{client.get_run(tracker.run_id).info.artifact_uri}/{name}",
                        model.flavors)


@dataclass(frozen=True)
class LoggedPolicy:
    """Where a logged policy is: `model_uri` for `mlflow.transformers.load_model`, `source` for the registry."""

    model_uri: str
    source: str
    flavors: dict[str, Any]


def log_policy(tracker, folder: str | Path, name: str) -> LoggedPolicy | None:
    """Log the HF folder `folder` as the MLflow model `name` of the tracker's run (None without MLflow)."""
    client = _client(tracker)
    if client is None:
        return None
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} is not an HF policy folder (no config.json)")
    # a str is a checkpoint folder: copied as it is, never loaded into memory to be logged
    return _log_saved(tracker, client, str(folder), name, pip_requirements=pip_requirements())


def log_adapter(tracker, adapter: str | Path, base: str | Path, name: str) -> LoggedPolicy | None:
    """Log the LoRA adapter folder `adapter` (peft) on the base policy folder `base` as model `name`."""
    client = _client(tracker)
    if client is None:
        return None
    from peft import PeftModel

    from rlcr.policy.models import load_policy

    base = Path(base).resolve()
    model, tok = load_policy(base)
    model = PeftModel.from_pretrained(model, str(adapter))
    return _log_saved(tracker, client, {"model": model, "tokenizer": tok}, name, base_model_path=str(base),
                      pip_requirements=pip_requirements("peft"))


def log_trained(tracker, folder: str | Path, start: str | Path, register: bool = False):
    """The train loop's end: with `register` (the train stage), `folder` as the model `policy` (merged
    weights when LoRA-trained), registered as the newest `rlcr-policy@latest-trained`; its
    `lora_adapter/` (if any) as the model `lora_adapter` on the starting policy `start` -> the
    LoggedPolicy of the policy (else of the adapter, else None).

    An unregistered run (an ablation) logs its adapter only, and a fully fine-tuned one no model: the
    policy is the run's DVC out (an ablation's run tags it `rlcr.policy_out`). The merged folder is
    the start plus the adapter, 21 ablation runs of SmolLM2 would store 21 copies of 540 MB, and each
    `mlflow.transformers.save_model` of even the tiny policy costs ~5-7 s (measured on 2 cores)."""
    from rlcr.policy.models import ADAPTER_DIR

    adapter = Path(folder) / ADAPTER_DIR
    has_adapter = (adapter / "adapter_config.json").is_file()
    info = log_policy(tracker, folder, "policy") if register else None
    if has_adapter:
        adapter_info = log_adapter(tracker, adapter, start, "lora_adapter")
        info = info or adapter_info
    if register:
        register_model(tracker, info)
    return info


def register_model(tracker, info, name: str = REGISTERED_MODEL, alias: str = ALIAS) -> str | None:
    """Register the logged model `info` as a new version of `name` with `alias` -> the version."""
    client = _client(tracker)
    if client is None or info is None:
        return None
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, description="RLCR shared policy (mlflow.transformers, text-generation)")
    except MlflowException:
        pass  # already registered
    version = client.create_model_version(name, source=info.source, run_id=tracker.run_id)
    client.set_registered_model_alias(name, alias, version.version)
    return version.version


__all__ = ["ALIAS", "REGISTERED_MODEL", "TASK", "LoggedPolicy", "log_adapter", "log_policy", "log_trained", "pip_requirements", "register_model"]
