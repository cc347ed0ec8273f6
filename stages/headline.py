"""DVC stage `headline`: the metrics files -> the small, same-keyed views DVC shows (rlcr/headline.py).

Reads metrics/eval.json, metrics/train.json, metrics/ablations/*.json, plots/train.csv and
plots/ablations/*.csv (each only if it exists). Outs: metrics/headline/ (the files dvc.yaml's
top-level `metrics:` lists: `dvc metrics show`, `dvc metrics diff`, `dvc exp show`) and
plots/compare/ (the tables of its top-level `plots:`). Seconds: it only copies figures.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's rlcr, not another installed copy

from rlcr.stage import run_stage  # noqa: E402


def body(params, tracker, root: Path) -> None:
    import json

    import pandas as pd

    from rlcr import io
    from rlcr.headline import headline_files, learning_curves, runs_table

    def read(rel: str):
        path = root / rel
        return json.loads(path.read_text()) if path.is_file() else None

    ablations = {p.stem: json.loads(p.read_text()) for p in sorted((root / "metrics/ablations").glob("*.json"))}
    files = headline_files(read("metrics/eval.json"), read("metrics/train.json"), ablations)
    shutil.rmtree(root / "metrics/headline", ignore_errors=True)
    for rel, head in files.items():
        io.write_json(head, root / rel)
    curves = {p.stem: pd.read_csv(p) for p in sorted((root / "plots/ablations").glob("*.csv"))}
    if (root / "plots/train.csv").is_file():
        curves["train"] = pd.read_csv(root / "plots/train.csv")
    for name, frame in {"runs": runs_table(files), "learning_curves": learning_curves(curves)}.items():
        with io.atomic_path(root / f"plots/compare/{name}.csv") as tmp:
            frame.to_csv(tmp, index=False)
    if files:
        tracker.log_artifact(root / "metrics/headline", "headline")
    print(f"[headline] {len(files)} runs -> metrics/headline/, {len(curves)} curves -> plots/compare/")


if __name__ == "__main__":
    sys.exit(run_stage("headline", body, ROOT))
