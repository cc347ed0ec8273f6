"""DVC stage `bootstrap`: scripted traces on the train tasks -> SFT warm start -> models/bootstrap/,
plus a quick held-out check -> metrics/bootstrap.json (instruct profiles: the base model, linked)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's rlcr, not another installed copy

from rlcr.stage import run_stage  # noqa: E402

LOG_EVERY = 10


def body(params, tracker, root: Path) -> None:
    import pandas as pd

    from rlcr import io
    from rlcr.policy.mlflow_model import log_policy
    from rlcr.tasks.suite import from_frame
    from rlcr.train.bootstrap import bootstrap_policy

    train = from_frame(pd.read_parquet(root / "data/tasks/train.parquet"))
    evals = from_frame(pd.read_parquet(root / "data/tasks/eval.parquet"))
    folder = root / "models/bootstrap"

    def on_step(step: int, metrics: dict[str, float]) -> None:
        if step % LOG_EVERY == 0 or step == params.bootstrap.steps - 1:
            tracker.log_metrics(metrics, step=step)
            print(f"[bootstrap] step {step} loss {metrics['losses/sft']:.3f} "
                  f"tokens/s {metrics['perf/tokens_per_s']:.0f}", flush=True)

    result = bootstrap_policy(params, train, evals, folder, on_step=on_step)
    tracker.log_metrics(result.metrics)
    if result.base:
        tracker.set_tags({"rlcr.bootstrap.base": result.base})
    log_policy(tracker, folder, "bootstrap")  # an mlflow.transformers model (rlcr/policy/mlflow_model.py)
    io.write_json(result.metrics, root / "metrics/bootstrap.json")
    m = result.metrics
    print("[bootstrap] held-out success: " + ", ".join(
        f"{k.removeprefix('bootstrap/')} {v:.2f}" for k, v in m.items()
        if k.startswith("bootstrap/") and k.count("/") == 3 and k.endswith(("d1", "d3"))))


if __name__ == "__main__":
    sys.exit(run_stage("bootstrap", body, ROOT))
