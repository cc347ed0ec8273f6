"""The episode viewer: rollout parquet files -> a static HTML folder that opens from `file://`.

    python -m rlcr.viewer data/rollouts ablations --curves plots/train.csv plots/ablations --out reports/viewer

Arguments are episode tables (`<stem>.parquet`, or its `.turns.parquet`) or folders searched for them
(an episode table counts when its `.turns.parquet` lies beside it); `<policy>__<org>.parquet` is a
rollout run, `<variant>__s<seed>/rollout.parquet` an ablation run (`start.parquet` beside it: its start policy
on the same tasks). `build_viewer` writes into `out`:

    index.html        the page (no data in it): loads viewer.js, which loads data/*.js on demand
    viewer.js/.css    the app (rlcr/viewer_assets): DOM built by hand, charts in inline SVG
    data/manifest.js  the runs (label, policy x org or variant and seed, counts), the curve series
    data/r<i>.js      run i's episode list: one summary row per episode, loaded when the run is picked
    data/r<i>c<j>.js  chunk j of run i: `chunk_size` episodes in full (turns, board, files), loaded
                      when one of its episodes is opened
    standalone.html   the same app with every data file inlined as a JSON block parsed on demand: one
                      file, for the MLflow UI (which shows an HTML artifact alone, in a sandboxed frame)

Nothing is fetched from a network and no server is needed: data files are scripts that call
`RLCR.put(key, {...})`, which browsers load from `file://` (fetch/XHR would be refused there).

Per-episode figures reuse `rlcr.behaviour` (false approvals, idle hires, posts and verdicts), so the
viewer's filters count what the metrics count. The workspace is replayed from the turns' accepted
WRITE actions with `rlcr.org.workspace.Workspace` (same end-of-round order, last writer wins).

Escaping: agent text is hostile (completions, posts, briefs, file contents, answers, episode ids,
task prompts, even run names taken from file names).
Covers: every text reaches the page as a DOM text node (`textContent`, `createTextNode`); the app
never parses data as HTML (no innerHTML/outerHTML/insertAdjacentHTML/document.write/eval, which a
test checks); attributes set from data are `data-*`, `title` and `value` only (an allow-list),
never `href`, `src`, `style` or event handlers; index.html holds no data, standalone.html only in
`application/json` blocks (never run); data are JSON literals with every non-ASCII character and
`<`, `>`, `&` written as `\\uXXXX`, so no text can end a script block or leave its string; data
file names are generated (`r3c1`), never taken from the data; bidi overrides and zero-width
characters in agent text are shown as visible `<U+XXXX>` marks so they cannot reorder what
surrounds them; a Content-Security-Policy forbids inline script and handlers
(index.html: scripts from the folder only; standalone.html: only the app's own hash) and every
network load (`default-src 'none'`), as a second line should markup ever slip through.
Does not cover: what a reader does with text copied out of the page, homoglyphs and persuasion in
plain words, browsers that ignore CSP, and the replay of WRITEs refused at the round's end for the
org's file-count limit (the record does not hold the limit: such a write shows as applied).
"""

from __future__ import annotations

import argparse
import base64
import difflib
import hashlib
import json
import math
import re
import shutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ASSETS = Path(__file__).with_name("viewer_assets")
ABLATION_DIR = re.compile(r"(?P<variant>.+)__s(?P<seed>\d+)")
CURVE_PREFIXES = ("org_", "behaviour_collective_thinking", "reward_mean", "rollout_success")
"""Columns of plots/train.csv and plots/ablations/*.csv that the curves page draws."""
CSP_FOLDER = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'none'; base-uri 'none'; form-action 'none'"


# ------------------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class RunSource:
    """One run's episode table and how to label it."""

    episodes: Path
    kind: str = "rollout"
    """rollout (data/rollouts/<policy>__<org>) or ablation (ablations/<variant>__s<seed>/rollout, or its
    start: `start`, policy `bootstrap`)."""
    policy: str = ""
    org: str = ""
    variant: str = ""
    seed: int | None = None

    @property
    def stem(self) -> str:
        return self.episodes.name[: -len(".parquet")]

    def sibling(self, suffix: str) -> Path:
        return self.episodes.with_name(f"{self.stem}{suffix}.parquet")

    @property
    def label(self) -> str:
        if self.kind == "ablation":
            return f"{self.variant} (seed {self.seed})" + (f", its start ({self.policy})" if self.policy else "")
        return f"{self.policy} x {self.org}" if self.org else self.stem


def episode_table(path: Path) -> Path:
    """The episode table of a run from any of its three files."""
    for suffix in (".turns.parquet", ".timing.parquet"):
        if path.name.endswith(suffix):
            return path.with_name(path.name[: -len(suffix)] + ".parquet")
    return path


def describe(path: Path) -> RunSource:
    """A run's labels from where its episode table lies (see the module docstring)."""
    stem = path.name[: -len(".parquet")]
    m = ABLATION_DIR.fullmatch(path.parent.name)
    if stem in ("rollout", "start") and m:  # start: the run's start policy on the same tasks
        return RunSource(path, "ablation", policy="bootstrap" if stem == "start" else "", variant=m["variant"],
                         seed=int(m["seed"]))
    policy, sep, org = stem.rpartition("__")
    return RunSource(path, "rollout", policy=policy, org=org) if sep and policy else RunSource(path, "rollout")


def find_runs(paths: Iterable[str | Path]) -> list[RunSource]:
    """Runs named by files or found under folders, in argument order then path order, each once.
    A folder's hidden parts (an ablation's `.<label>.tmp`) are skipped; a file without its turns
    table is an error, a folder's parquet without one (data/tasks) is not a run."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            cands = [episode_table(q) for q in sorted(p.rglob("*.parquet"))
                     if not any(part.startswith(".") for part in q.relative_to(p).parts)]
            cands = [q for q in cands if describe(q).sibling(".turns").is_file()]
        elif p.is_file() and p.name.endswith(".parquet"):
            cands = [episode_table(p)]
            if not describe(cands[0]).sibling(".turns").is_file():
                raise FileNotFoundError(f"{p}: no {describe(cands[0]).sibling('.turns').name} beside it")
        else:
            raise FileNotFoundError(f"{p}: neither a rollout parquet file nor a folder")
        found += [q for q in cands if q not in found]
    return [describe(q) for q in dict.fromkeys(found)]


def read_records(run: RunSource) -> tuple[list, dict[str, float]]:
    """(episode records, real seconds per episode id from the timing table, {} without one)."""
    import pandas as pd

    from rlcr.org.records import read_parquet

    records = read_parquet(run.sibling(".turns"), run.episodes)
    timing = run.sibling(".timing")
    seconds = {}
    if timing.is_file():
        t = pd.read_parquet(timing)
        seconds = dict(zip(t["episode_id"].astype(str), t["seconds"].astype(float), strict=True))
    return records, seconds


# ------------------------------------------------------------------------------ per episode


def _num(x: Any) -> float | None:
    """A JSON-safe number (NaN and infinities -> None)."""
    x = float(x)
    return x if math.isfinite(x) else None


def episode_summary(record, seconds: float | None = None) -> dict[str, Any]:
    """One row of a run's episode list: what the filters and the list show."""
    from rlcr.behaviour import episode_metrics

    ep = record.episode
    m = episode_metrics(record)
    task = json.loads(ep.task)
    return {
        "id": ep.episode_id, "task_id": ep.task_id, "family": ep.family, "difficulty": int(task.get("difficulty", 0)),
        "mode": ep.mode, "outcome": _num(ep.outcome), "reward": _num(ep.reward), "submitted": bool(ep.submitted),
        "answer": ep.answer, "end_reason": ep.end_reason, "rounds": int(ep.rounds), "agents": int(ep.n_agents),
        "depth": int(ep.max_depth), "n_turns": int(ep.n_turns), "malformed": int(ep.malformed_turns),
        "false_approvals": int(m["behaviour/false_approvals"]), "idle_hires": int(m["behaviour/idle_agents"]),
        "tokens": int(ep.total_tokens), "critical_path": int(ep.critical_path_tokens),
        "seconds": _num(seconds) if seconds is not None else None,
    }


def turn_view(turn) -> dict[str, Any]:
    """One timeline cell: what the agent saw and wrote, what was accepted, what went wrong."""
    return {
        "round": int(turn.round), "agent": int(turn.agent), "role": turn.role, "prompt": turn.prompt,
        "completion": turn.completion, "actions": turn.action_list(), "errors": json.loads(turn.errors),
        "refused": [e for e in turn.event_list() if "refused" in e], "malformed": bool(turn.malformed),
        "tokens": int(turn.completion_tokens), "max_tokens": int(turn.max_new_tokens),
        "finish": turn.finish_reason, "reward": _num(turn.reward),
    }


def board_posts(record) -> list[dict[str, Any]]:
    """The board as it was written: post #k is the k-th accepted POST, with its verdict (approve or
    reject, `rlcr.behaviour.verdict`) and whether an approval approved a wrong claim."""
    from rlcr.behaviour import claim_is_right, posts, verdict

    task = record.episode.task_obj()
    out = []
    for k, (i, agent, text, ment) in enumerate(posts(record), start=1):
        v = verdict(text)
        out.append({"id": k, "round": int(record.turns[i].round), "agent": int(agent), "role": record.turns[i].role,
                    "text": text, "mentions": [int(x) for x in ment], "verdict": v or "",
                    "false_approval": v == "approve" and claim_is_right(text, task) is False})
    return out


def unified(old: str | None, new: str) -> list[str]:
    """Diff lines (`+`, `-`, ` ` and `@@` hunk heads) from `old` (None: no such file) to `new`, no
    file headers."""
    lines = difflib.unified_diff([] if old is None else old.split("\n"), new.split("\n"), lineterm="", n=2)
    return [s for s in lines if not s.startswith(("---", "+++"))]


def file_history(turns) -> list[dict[str, Any]]:
    """Every write the workspace applied, round by round: the writer, whether it won the round (the
    highest agent index wins a path), the file's version, and the diff from the previous version."""
    from rlcr.org.workspace import Workspace

    ws = Workspace(max_files=1 << 30, max_file_chars=1 << 30)
    out: list[dict[str, Any]] = []
    rounds = sorted({int(t.round) for t in turns})
    for rnd in rounds:
        before = ws.files()
        for t in (t for t in turns if t.round == rnd):
            for a in t.action_list():
                if a["kind"] == "WRITE":
                    ws.stage_write(int(t.agent), a["arg"], a["body"], rnd)
        for rec in ws.commit(rnd):
            f = ws.read(rec.path) if rec.won else None
            out.append({"round": rnd, "agent": rec.agent, "path": rec.path, "chars": rec.chars, "won": rec.won,
                        "version": f.version if f else None, "content": f.content if f else None,
                        "diff": unified(before.get(rec.path), f.content) if f else []})
    return out


def episode_detail(record, summary: dict[str, Any]) -> dict[str, Any]:
    """Everything the episode page shows: its `episode_summary` row and the episode in full."""
    from rlcr.behaviour import idle_hires

    ep = record.episode
    task = json.loads(ep.task)
    return {
        **summary,
        "task": {k: task.get(k) for k in ("prompt", "answer", "family", "kind", "difficulty")},
        "submitter": int(ep.submitter), "truncated": bool(ep.truncated),
        "agent_rewards": {str(k): _num(v) for k, v in json.loads(ep.agent_rewards).items()},
        "org": ep.org(), "idle": idle_hires(record), "turns": [turn_view(t) for t in record.turns],
        "posts": board_posts(record), "files": file_history(record.turns),
    }


# ------------------------------------------------------------------------------------ curves


def curve_files(paths: Iterable[str | Path]) -> list[Path]:
    """CSV files named, or found in named folders (sorted); missing paths are skipped."""
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.glob("*.csv")) if p.is_dir() else [p] if p.is_file() else []
    return list(dict.fromkeys(out))


def curve_series(path: Path) -> dict[str, Any]:
    """One training curve: `train.csv` is the trained policy, `<variant>__s<seed>.csv` an ablation."""
    import pandas as pd

    frame = pd.read_csv(path)
    m = ABLATION_DIR.fullmatch(path.stem)
    variant, seed = (m["variant"], int(m["seed"])) if m else ("trained" if path.stem == "train" else path.stem, None)
    cols = [c for c in frame.columns if c.startswith(CURVE_PREFIXES)]
    x = frame["iteration"] if "iteration" in frame.columns else pd.Series(range(1, len(frame) + 1))
    return {"variant": variant, "seed": seed, "source": path.name, "iteration": [_num(v) for v in x],
            "columns": {c: [_num(v) for v in frame[c]] for c in cols}}


# ------------------------------------------------------------------------------------ output


def js_literal(data: Any) -> str:
    """JSON that is also safe inside a script: ASCII only, and `<`, `>`, `&` as \\u escapes."""
    text = json.dumps(data, ensure_ascii=True, allow_nan=False, separators=(",", ":"), sort_keys=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def data_script(key: str, data: Any) -> str:
    if not re.fullmatch(r"[a-z0-9]+", key):
        raise ValueError(f"data key {key!r}: lowercase letters and digits only")
    return f'RLCR.put("{key}",{js_literal(data)});\n'


def _page(csp: str, head: str, body: str) -> str:
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{csp}\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>RLCR episode viewer</title>\n{head}</head>\n<body>\n"
            "<noscript>The episode viewer needs JavaScript.</noscript>\n"
            f"{body}</body></html>\n")


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def standalone_page(app_js: str, css: str, data: dict[str, Any]) -> str:
    """One HTML file: the app inline (allowed by its hash) and each data file as a JSON block."""
    blocks = "".join(f'<script type="application/json" id="rlcr-data-{k}">{js_literal(v)}</script>\n'
                     for k, v in data.items())
    app = f"\n{app_js}\n"
    csp = (f"default-src 'none'; script-src '{_sha256(app)}'; style-src '{_sha256(css)}'; img-src 'none'; "
           "base-uri 'none'; form-action 'none'")
    return _page(csp, f"<style>{css}</style>\n", f"{blocks}<script>{app}</script>\n")


def viewer_data(runs: Sequence[RunSource], curves: Sequence[Path], title: str, chunk_size: int,
                root: Path | None = None) -> dict[str, Any]:
    """{data key: JSON-able data}: the manifest, each run's episode list, each run's chunks."""
    data: dict[str, Any] = {}
    manifest: dict[str, Any] = {"title": title, "chunk_size": chunk_size, "runs": [],
                                "curves": [curve_series(p) for p in curves]}
    for i, run in enumerate(runs):
        records, seconds = read_records(run)
        rows = [{**episode_summary(r, seconds.get(r.episode.episode_id)), "chunk": k // chunk_size}
                for k, r in enumerate(records)]
        for j in range(0, len(records), chunk_size):
            data[f"r{i}c{j // chunk_size}"] = {"episodes": [episode_detail(r, s) for r, s in
                                                            zip(records[j:j + chunk_size], rows[j:j + chunk_size], strict=True)]}
        data[f"r{i}"] = {"episodes": rows}
        source = run.episodes.relative_to(root) if root and run.episodes.is_relative_to(root) else run.episodes
        orgs = sorted({r["mode"] for r in rows})
        manifest["runs"].append({
            "key": f"r{i}", "label": run.label, "kind": run.kind, "policy": run.policy,
            "org": run.org or "/".join(orgs), "variant": run.variant, "seed": run.seed, "source": str(source),
            "episodes": len(rows), "chunks": -(-len(rows) // chunk_size),
            "success": sum((r["outcome"] or 0) >= 1 for r in rows) / len(rows) if rows else None,
        })
    return {"manifest": manifest, **data}


def build_viewer(runs: Sequence[RunSource], out: str | Path, curves: Sequence[str | Path] = (),
                 title: str = "RLCR episodes", chunk_size: int = 20, root: Path | None = None) -> Path:
    """Write the viewer folder `out` (replaced whole) and return its index.html."""
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    out = Path(out)
    data = viewer_data(runs, curve_files(curves), title, chunk_size, root)
    app, css = (ASSETS / "viewer.js").read_text(), (ASSETS / "viewer.css").read_text()
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "data").mkdir(parents=True)
    for key, value in data.items():
        (tmp / "data" / f"{key}.js").write_text(data_script(key, value))
    (tmp / "viewer.js").write_text(app)
    (tmp / "viewer.css").write_text(css)
    (tmp / "index.html").write_text(_page(CSP_FOLDER, '<link rel="stylesheet" href="viewer.css">\n',
                                          '<script src="viewer.js"></script>\n'))
    (tmp / "standalone.html").write_text(standalone_page(app, css, data))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out / "index.html"


def project_viewer(root: Path, out: Path, title: str = "RLCR episodes") -> Path:
    """The report stage's viewer: every run under data/rollouts and ablations, and the training
    curves plots/train.csv and plots/ablations/*.csv (what exists of them)."""
    runs = find_runs([p for p in (root / "data/rollouts", root / "ablations") if p.is_dir()])
    return build_viewer(runs, out, [root / "plots/train.csv", root / "plots/ablations"], title, root=root)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlcr.viewer", description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="rollout or ablation parquet files, or folders holding them")
    ap.add_argument("--out", required=True, help="folder to write (replaced whole)")
    ap.add_argument("--curves", nargs="*", default=[], help="training curve CSVs or folders of them")
    ap.add_argument("--title", default="RLCR episodes")
    ap.add_argument("--chunk-size", type=int, default=20, help="episodes per lazily loaded data file")
    args = ap.parse_args(argv)
    try:
        runs = find_runs(args.paths)
    except FileNotFoundError as e:
        print(f"[viewer] {e}", file=sys.stderr)
        return 2
    index = build_viewer(runs, args.out, args.curves, args.title, args.chunk_size)
    print(f"[viewer] {len(runs)} runs -> {index} (open it in a browser: file://{index.resolve()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
