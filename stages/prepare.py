"""DVC stage `prepare`: task splits -> data/tasks/{train,eval}.parquet, validated, stats to MLflow."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's rlcr, not another installed copy

from rlcr.stage import run_stage  # noqa: E402


def body(params, tracker, root: Path) -> None:
    from rlcr import io
    from rlcr.tasks.suite import build_splits, split_stats
    from rlcr.validation import report_json, require_valid, validate_tasks

    cfg = params.prepare
    train, evals, report = build_splits(cfg)
    for row_id, why in report.rejected:
        print(f"[prepare] rejected {row_id}: {why}", file=sys.stderr)
    stats = split_stats(train, evals, report)
    tracker.log_metrics(stats)
    family, share = report.worst_family()
    if share > cfg.max_bad_rows:
        raise ValueError(
            f"family {family!r}: {report.bad[family]} of {report.rows[family]} rows rejected "
            f"({share:.1%} > prepare.max_bad_rows {cfg.max_bad_rows:.1%}); see the rejected rows above"
        )
    families = [f.name for f in cfg.train + cfg.eval]
    validation = validate_tasks(train, evals, families, cfg.max_prompt_chars)
    tracker.log_text(report_json(validation), "validation/tasks.json")
    require_valid(validation)
    # outs only after validation passed: a failing suite leaves nothing behind
    io.write_parquet(train, root / "data/tasks/train.parquet")
    io.write_parquet(evals, root / "data/tasks/eval.parquet")
    io.write_json(stats, root / "metrics/prepare.json")
    print(f"[prepare] train {len(train)} tasks, eval {len(evals)} tasks, {len(report.rejected)} rejected")


if __name__ == "__main__":
    sys.exit(run_stage("prepare", body, ROOT))
