"""Shared fixtures: quiet, single-threaded environment and throwaway copies of the project."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlcr import env  # noqa: E402

env.setup(ROOT)
os.environ.setdefault("OMP_NUM_THREADS", "1")
# stage commands in dvc.yaml call `python`: make it this interpreter
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
# tests never write to the project's own tracking db
os.environ.pop("MLFLOW_TRACKING_URI", None)

# what a copy of the project needs to run its stages (no generated data, models, state or venv)
PROJECT_FILES = ["rlcr", "stages", "flows", "configs", "data/raw", "dvc.yaml", "params.yaml", "prefect.yaml", "pyproject.toml",
                 ".dvc/config", ".dvcignore", ".gitignore"]


def copy_project(dest: Path) -> Path:
    """A fresh git + DVC checkout of the working tree in `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif src.exists():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    run = lambda *a: subprocess.run(a, cwd=dest, check=True, capture_output=True)  # noqa: E731
    run("git", "init", "-q")
    run("git", "-c", "user.email=t@t", "-c", "user.name=t", "add", "-A")
    run("git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "copy")
    return dest


LONGEST_FIRST = ("test_learning.py",)
"""Files started first: `make test` runs the suite on 2 workers (pytest-xdist `-n 2 --dist loadfile`: a
file's tests on one worker, so its module fixtures are built once; `--no-loadscope-reorder` keeps this
order), and the longest file (~13 min, the default bootstrap and RL run) would otherwise start late and
end last: with xdist's reorder (files with most tests first) it started after ~13 min and the other
worker then sat idle for ~10."""


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)  # stable: the rest keeps its order


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    return copy_project(tmp_path / "project")


@pytest.fixture(autouse=True)
def _mlflow_uri_stays_local():
    """Every test starts and ends without MLFLOW_TRACKING_URI (the suite's baseline, popped above).
    `mlflow.set_tracking_uri` (called by `rlcr.tracking.stage_run`) exports it, also from a module
    fixture's in-process stage run, which no per-test restore would undo: a later test's stage
    subprocess started with os.environ would then log into that fixture's db, not its project's (seen
    when pytest-xdist ran the files in another order). In-process MLflow calls keep mlflow's own
    tracking URI, which set_tracking_uri also sets."""
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    yield
    os.environ.pop("MLFLOW_TRACKING_URI", None)


QUICK_VARIANTS = ["collective", "no_verifiers"]


@pytest.fixture(scope="session")
def quick_pipeline(tmp_path_factory) -> dict:
    """The whole pipeline on the `quick` profile (ablation variants QUICK_VARIANTS, seed 0), run once for
    the tests that read it and change nothing in it: `dvc repro ablate` first (prepare, bootstrap, the
    ablation matrix; the imports record of its last stage kept as imports_ablate.json), then `dvc repro`
    (rollouts, train, evaluate, report, headline). -> root, ablate_stdout, stdout, seconds

    Once per pytest run, not per xdist worker: the workers of a run share the parent of their base temp
    folders; the first to get the lock runs the pipeline and leaves its result there, the others read it."""
    import json
    import tempfile

    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by this run's workers
    done = base / "quick_pipeline.json"
    with FileLock(str(base / "quick_pipeline.lock")):
        if not done.exists():
            result = _run_quick_pipeline(Path(tempfile.mkdtemp(prefix="quick_pipeline", dir=base)))
            done.write_text(json.dumps({**result, "root": str(result["root"])}))
    result = json.loads(done.read_text())
    return {**result, "root": Path(result["root"])}


def _run_quick_pipeline(folder: Path) -> dict:
    import time

    import yaml
    from helpers import dvc

    root = copy_project(folder / "project")
    path = root / "params.yaml"
    data = yaml.safe_load(path.read_text())
    data["profile"] = "quick"
    data["ablate"]["variants"] = QUICK_VARIANTS  # the matrix reads the top-level list (profiles cannot change it)
    data["ablate"]["seeds"] = [0]  # the 3-seed matrix: the default repro; the sweep test runs 2-3 seeds
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    t0 = time.perf_counter()
    first = dvc(root, "repro", "ablate", timeout=1800)  # a guard against a hang, not a speed test
    shutil.copy2(root / "imports.json", root / "imports_ablate.json")
    rest = dvc(root, "repro", timeout=1800)
    return {"root": root, "ablate_stdout": first.stdout, "stdout": first.stdout + rest.stdout,
            "seconds": time.perf_counter() - t0}
