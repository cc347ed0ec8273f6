"""The shared shell of every stage script: environment, params, one MLflow run, exit status.

A stage script is `run_stage("name", body)`, where `body(params, tracker, root)` does the work by
calling the library and writes the outs dvc.yaml declares. Params are loaded and checked before any
work; a bad params.yaml exits 2 with the key named. An exception marks the run FAILED and exits 1;
SIGTERM marks it KILLED and exits 143. Outs are written atomically by `rlcr.io`, so a failed stage
leaves no half-written file that a later stage could take for a good one.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlcr import env


def run_stage(stage: str, body: Callable[[Any, Any, Path], None], root: Path | None = None,
              overrides: dict[str, Any] | None = None) -> int:
    root = Path(root or Path.cwd()).resolve()
    env.setup(root, stage)  # before torch loads: its thread count is the stage's (env.STAGE_THREADS)
    from rlcr.config import ConfigError, load_params
    from rlcr.tracking import exit_code, stage_run

    try:
        params = load_params(root / "params.yaml", overrides)
    except ConfigError as e:
        print(f"[{stage}] {e}", file=sys.stderr)
        return 2
    try:
        with stage_run(stage, params, root) as tracker:
            body(params, tracker, root)
    except BaseException as e:  # noqa: BLE001 - every ending needs a status and an exit code
        if isinstance(e, SystemExit):
            raise
        traceback.print_exc()
        print(f"[{stage}] failed: {type(e).__name__}: {e}", file=sys.stderr)
        return exit_code(e)
    finally:
        _record_imports(root)
    return 0


def _record_imports(root: Path) -> None:
    """With $RLCR_IMPORTS_OUT set, write the rlcr source files this process imported (deps check)."""
    import json
    import os

    out = os.environ.get("RLCR_IMPORTS_OUT")
    if not out:
        return
    files = sorted(
        str(Path(m.__file__).resolve().relative_to(root))
        for name, m in list(sys.modules.items())
        if (name == "rlcr" or name.startswith("rlcr.")) and getattr(m, "__file__", None)
        and Path(m.__file__).resolve().is_relative_to(root)
    )
    Path(out).write_text(json.dumps(files))
