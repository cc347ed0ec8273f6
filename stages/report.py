"""DVC stage `report`: metrics files -> reports/ (report.md answering Q1-Q5, its figure sources, PNGs).

Reads metrics/eval.json, metrics/train.json, metrics/bootstrap.json, metrics/ablations/*.json (each
only if it exists: a missing one is named in the report, never a crash), plots/train.csv and
plots/ablations/*.csv for the curves, the company episode tables in data/rollouts for org charts, and
every rollout in data/rollouts and ablations/*/ for the episode viewer (rlcr/viewer.py).

Outs (reports/):
    report.md                the report; every figure in it is filled from a metrics file (logged to
                             MLflow with it, and as `report/report.html`, one page with the figures inline)
    report_sources.json      for every figure: its span in report.md, file, key, format and value
    *.png                    learning curves, behaviour over training, success vs critical path, org charts
    viewer/                  the episode viewer (open viewer/index.html; viewer/standalone.html is the
                             same in one file), logged to the MLflow run as the artifact folder `viewer`
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's rlcr, not another installed copy

from rlcr.stage import run_stage  # noqa: E402


def body(params, tracker, root: Path) -> None:
    import dataclasses

    from rlcr.plots import report_html
    from rlcr.report import build_report
    from rlcr.viewer import project_viewer

    written = build_report(root, dataclasses.asdict(params.report), root / "reports")
    for path in written:
        tracker.log_artifact(path, "report")
    report_md = root / "reports/report.md"
    if report_md.is_file():  # the report with its figures inline: MLflow's artifact view shows it as a page
        tracker.log_text(report_html(report_md.read_text(), report_md.parent, params.report.title),
                         "report/report.html")
    viewer = project_viewer(root, root / "reports/viewer", params.report.title).parent
    tracker.log_artifact(viewer, "viewer")
    print(f"[report] wrote {', '.join(str(p.relative_to(root)) for p in written)} and {viewer.relative_to(root)}/")


if __name__ == "__main__":
    sys.exit(run_stage("report", body, ROOT))
