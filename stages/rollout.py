"""DVC stage `rollout` (one instance per policy x org): eval episodes -> data/rollouts/<policy>__<org>.*

    python stages/rollout.py --policy bootstrap --org company

Outs (records.py's schema, written only after the great-expectations suite passed):
    data/rollouts/<name>.parquet         episode table (one row per episode)
    data/rollouts/<name>.turns.parquet   turn table (one row per agent turn, token ids and logprobs)
    data/rollouts/<name>.timing.parquet  real wall seconds per episode (the only non-deterministic out;
                                         in the two tables above the wall-clock columns are 0.0)
    metrics/rollout/<name>.json          rollout/*, perf/*, org/*, behaviour/*, time/* (also in MLflow)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's rlcr, not another installed copy

from rlcr.stage import run_stage  # noqa: E402


def body(params, tracker, root: Path, policy: str, org: str) -> None:
    import pandas as pd

    from rlcr import io
    from rlcr.policy.bridge import token_length_fn
    from rlcr.policy.engine import make_engine
    from rlcr.rollout import (
        rollout_frames,
        rollout_metrics,
        rollout_policy,
        run_name,
        select_tasks,
        write_rollout,
    )
    from rlcr.tasks.suite import from_frame
    from rlcr.validation import report_json, require_valid, validate_rollouts

    cfg, name = params.rollout, run_name(policy, org)
    folder = root / cfg.policy(policy).path
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} is not an HF policy folder (no config.json): run the stage that writes it")
    tasks = select_tasks(from_frame(pd.read_parquet(root / "data/tasks/eval.parquet")), cfg.max_tasks_per_family)
    tracker.set_tags({"rlcr.policy": policy, "rlcr.org": org, "rlcr.rollout": name})
    print(f"[rollout] {name}: {len(tasks)} tasks x {cfg.samples_per_task} samples, budget "
          f"{params.org.token_budget} tokens, engine {params.engine.kind} on {params.engine.device}")

    engine = make_engine(params.engine, folder, params.model)
    t0 = time.perf_counter()
    records = rollout_policy(tasks, folder, org, params, cfg.seed, engine=engine, progress=True)
    seconds = time.perf_counter() - t0
    metrics = rollout_metrics(records, seconds, token_length_fn(engine.tokenizer))
    tracker.log_metrics(metrics)

    episodes, turns, timing = rollout_frames(records)
    validation = validate_rollouts(episodes, turns, params.org, params.reward, org)
    tracker.log_text(report_json(validation), f"validation/{name}.json")
    require_valid(validation)
    # outs only after validation passed: a failing suite leaves nothing behind
    write_rollout((episodes, turns, timing), root / "data/rollouts", name)
    io.write_json(metrics, root / f"metrics/rollout/{name}.json")
    print(f"[rollout] {name}: {len(records)} episodes, success {metrics['rollout/success']:.3f}, "
          f"{metrics['rollout/tokens_mean']:.0f} tokens/episode, {metrics['perf/tokens_per_s']:.0f} tokens/s, "
          f"{seconds:.1f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", required=True, help="a name in rollout.policies")
    ap.add_argument("--org", required=True, choices=["company", "single"])
    args = ap.parse_args()
    return run_stage(f"rollout@{args.policy}-{args.org}",
                     lambda p, t, r: body(p, t, r, args.policy, args.org), ROOT)


if __name__ == "__main__":
    sys.exit(main())
