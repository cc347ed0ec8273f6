"""Process environment every entry point sets first: telemetry off, tool state inside the project.

Values already set by the user win (setdefault), so a researcher can point MLflow or Prefect
elsewhere. Call before importing torch, mlflow, prefect or great-expectations.
"""

from __future__ import annotations

import os
from pathlib import Path

QUIET = {
    "DO_NOT_TRACK": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "GX_ANALYTICS_ENABLED": "False",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # with 2 threads under load torch can be 10x slower with busy-waiting OpenMP workers
    "OMP_WAIT_POLICY": "PASSIVE",
}


def project_env(root: Path) -> dict[str, str]:
    """Variables that keep tool state under `root/.state` (Prefect home, caches)."""
    state = root / ".state"
    return {
        **QUIET,
        "PREFECT_HOME": str(state / "prefect"),
        "DVC_SITE_CACHE_DIR": str(state / "dvc-site-cache"),
        "TORCH_EXTENSIONS_DIR": str(state / "torch_extensions"),
        "MPLCONFIGDIR": str(state / "matplotlib"),
    }


def setup(root: Path) -> None:
    for key, value in project_env(root).items():
        os.environ.setdefault(key, value)
