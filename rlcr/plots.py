"""PNG figures for the report (matplotlib, Agg): learning curves, behaviour over training, success vs
critical path, and org charts of sample episodes.

Each function takes plain data (frames, dicts) and a path, writes one PNG atomically and returns
True, or returns False and writes nothing when there is nothing to draw, so the report can say so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from rlcr.io import atomic_path  # noqa: E402

SUCCESS_COLUMNS = ("rollout_success", "success")
"""Per-iteration success in plots/train.csv (train writes `rollout/success` as `rollout_success`)."""
BEHAVIOUR_PREFIXES = ("org_", "behaviour_")
"""Columns of the training curves drawn as behaviour over training (hires by role, depth, idle, ...)."""


def _save(fig, path: Path) -> bool:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return True


def success_column(curve: pd.DataFrame) -> str | None:
    return next((c for c in SUCCESS_COLUMNS if c in curve.columns), None)


def behaviour_columns(curves: Mapping[str, Sequence[pd.DataFrame]]) -> list[str]:
    cols = {c for frames in curves.values() for f in frames for c in f.columns if c.startswith(BEHAVIOUR_PREFIXES)}
    return sorted(cols)


def _curve_lines(ax, curves: Mapping[str, Sequence[pd.DataFrame]], column: str) -> bool:
    """One colour per variant; one line per seed of it. True when anything was drawn."""
    drawn = False
    for i, (variant, frames) in enumerate(sorted(curves.items())):
        for j, f in enumerate(frames):
            if column in f.columns and "iteration" in f.columns and len(f):
                ax.plot(f["iteration"], f[column], color=f"C{i % 10}", alpha=0.9 if j == 0 else 0.5,
                        label=variant if j == 0 else None, linewidth=1.4)
                drawn = True
    return drawn


def learning_curves(curves: Mapping[str, Sequence[pd.DataFrame]], path: Path) -> bool:
    """Success (and reward, where present) per iteration, one colour per variant, one line per seed."""
    curves = {v: [f.rename(columns={success_column(f): "success"}) if success_column(f) else f for f in fs]
              for v, fs in curves.items()}
    panels = [c for c in ("success", "reward_mean") if any(c in f.columns for fs in curves.values() for f in fs)]
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        _curve_lines(ax, curves, panel)
        ax.set_xlabel("iteration")
        ax.set_ylabel("success (verified outcome = 1)" if panel == "success" else "mean reward")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Learning curves per variant")
    return _save(fig, path)


def behaviour_over_training(curves: Mapping[str, Sequence[pd.DataFrame]], path: Path) -> bool:
    """One small panel per behaviour column found in the curves (org_*, behaviour_*)."""
    cols = behaviour_columns(curves)
    if not cols:
        return False
    ncol = min(3, len(cols))
    nrow = -(-len(cols) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.0 * nrow), squeeze=False)
    for ax, col in zip(axes.flat, cols, strict=False):
        _curve_lines(ax, curves, col)
        ax.set_title(col.replace("_", " ", 1), fontsize=9)
        ax.set_xlabel("iteration", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(cols):]:
        ax.axis("off")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Behaviour over training")
    fig.tight_layout()
    return _save(fig, path)


def success_vs_critical_path(points: Mapping[str, pd.DataFrame], path: Path) -> bool:
    """Per run, success (with CI) against modelled time per difficulty level: company solid, single
    dashed. Each frame has columns critical_path_tokens, success, success_ci_low, success_ci_high."""
    points = {run: p for run, p in points.items() if len(p)}
    if not points:
        return False
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    policies = sorted({run.split("__")[0] for run in points})
    for run, p in sorted(points.items()):
        p = p.sort_values("critical_path_tokens")
        err = [p["success"] - p["success_ci_low"], p["success_ci_high"] - p["success"]]
        single = run.endswith("__single")
        ax.errorbar(p["critical_path_tokens"], p["success"], yerr=err, marker="s" if single else "o", capsize=3,
                    label=run, color=f"C{policies.index(run.split('__')[0]) % 10}", linestyle="--" if single else "-")
    ax.set_xlabel("modelled time: critical-path tokens per episode (single agent: all its tokens)")
    ax.set_ylabel("success")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Success vs critical path, per difficulty level")
    return _save(fig, path)


def _tree_positions(chart: Sequence[Mapping]) -> dict[int, tuple[float, float]]:
    """x by depth-first leaf order (parents centred over their hires), y = -depth."""
    children: dict[int, list[int]] = {}
    for m in chart:
        children.setdefault(int(m["parent"]), []).append(int(m["agent"]))
    pos: dict[int, tuple[float, float]] = {}
    next_x = [0.0]

    def place(agent: int, depth: int) -> float:
        kids = sorted(children.get(agent, []))
        if kids:
            x = sum(place(k, depth + 1) for k in kids) / len(kids)
        else:
            x, next_x[0] = next_x[0], next_x[0] + 1.0
        pos[agent] = (x, -float(depth))
        return x

    for root in sorted(children.get(-1, [])):
        place(root, 0)
    return pos


def org_charts(episodes: Sequence[tuple[str, Sequence[Mapping]]], path: Path) -> bool:
    """Who hired whom in each (title, org_chart) episode: one panel each, boxes coloured by role."""
    if not episodes:
        return False
    colours = {"ceo": "#f4c542", "worker": "#8fc1e3", "verifier": "#9bd59b", "tester": "#9bd59b", "lead": "#e39b8f"}
    ncol = min(2, len(episodes))
    nrow = -(-len(episodes) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(6.0 * ncol, 3.6 * nrow), squeeze=False)
    for ax, (title, chart) in zip(axes.flat, episodes, strict=False):
        pos = _tree_positions(chart)
        for m in chart:
            if int(m["parent"]) >= 0 and int(m["parent"]) in pos:
                (x0, y0), (x1, y1) = pos[int(m["parent"])], pos[int(m["agent"])]
                ax.plot([x0, x1], [y0, y1], color="#666666", linewidth=1.0, zorder=1)
        for m in chart:
            x, y = pos[int(m["agent"])]
            ax.text(x, y, f"agent{m['agent']}\n{m['role']}", ha="center", va="center", fontsize=7, zorder=2,
                    bbox={"boxstyle": "round", "facecolor": colours.get(m["role"], "#dddddd"), "edgecolor": "#444444"})
        xs = [x for x, _ in pos.values()] or [0.0]
        ys = [y for _, y in pos.values()] or [0.0]
        ax.set_xlim(min(xs) - 0.8, max(xs) + 0.8)
        ax.set_ylim(min(ys) - 0.6, 0.6)
        ax.set_title(title, fontsize=8)
        ax.axis("off")
    for ax in list(axes.flat)[len(episodes):]:
        ax.axis("off")
    fig.suptitle("Org charts: who hired whom (top: the CEO)")
    fig.tight_layout()
    return _save(fig, path)


__all__ = ["BEHAVIOUR_PREFIXES", "SUCCESS_COLUMNS", "behaviour_columns", "behaviour_over_training", "learning_curves",
           "org_charts", "success_column", "success_vs_critical_path"]


def report_html(markdown_text: str, folder: Path, title: str = "RLCR report") -> str:
    """The report as ONE self-contained HTML page: markdown (with tables) to HTML, each local image
    (`![..](name.png)` relative to `folder`) inlined as a data URI, so the MLflow artifact view, which
    shows an HTML file in a sandboxed frame with no access to its neighbours, draws the figures."""
    import base64
    import html
    import re

    import markdown

    body = markdown.markdown(markdown_text, extensions=["tables", "fenced_code"], output_format="html")

    def inline(m: re.Match) -> str:
        src = html.unescape(m.group(2))
        path = (folder / src).resolve()
        if "://" in src or not path.is_file() or not path.is_relative_to(folder.resolve()):
            return m.group(0)
        kind = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg"}.get(path.suffix.lower())
        if kind is None:
            return m.group(0)
        return f'{m.group(1)}"data:{kind};base64,{base64.b64encode(path.read_bytes()).decode()}"'

    body = re.sub(r'(<img\b[^>]*?\bsrc=)"([^"]+)"', inline, body)
    style = ("body{font:15px/1.5 system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px}"
             "th{background:#f3f3f3}img{max-width:100%}code{background:#f3f3f3;padding:0 3px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{body}</body></html>")
