"""Can an organisation be faster than one agent? The scripted organisations' critical paths.

No model and no errors: the scripted solo agent, the delegating company and the delegate-and-verify
company (rlcr/org/scripted.py) play one-digit sums of 2 to 32 terms through the real scheduler,
with tokens counted by the tiny default's tokenizer (`numbers`). Printed per length: the solo
agent's tokens (a single agent's time) and each company's critical path (the sum over rounds of the
longest turn), with the task in a workspace file that briefs name parts of (`org.task_file`) and
without it (briefs re-type the terms); the ratio is critical path / solo tokens (below 1: the
company finishes first). Two settings: `unbounded` turns long enough to hold any work (the
protocol's own cost), and `long` the org of params.yaml's `long` profile (the per-turn cap, budget
and org limits of the experiment: a single agent then splits a long chain over turns with
`READ task.txt:a-b`, carrying its running sum in its working).

    python benchmarks/org_critical_path.py [--terms 2 4 8 16 32] [--tasks 16]
"""

from __future__ import annotations

import argparse
import dataclasses

from rlcr.config import OrgConfig, load_params
from rlcr.org.episode import run_episodes
from rlcr.org.scripted import ScriptedOrg
from rlcr.policy.bridge import token_length_fn
from rlcr.policy.tokenizer import build_tokenizer
from rlcr.tasks import build_family

UNBOUNDED = OrgConfig(max_agents=16, max_depth=3, max_rounds=24, token_budget=8192, max_turn_tokens=512,
                      max_obs_tokens=1536, context_tokens=2048, max_message_chars=200)
"""Limits that never bind for the scripted orgs: the paths measure the protocol, not a budget."""


def measure(terms: int, n_tasks: int, base: OrgConfig, task_file: str, len_fn) -> dict[str, float]:
    """Mean solo tokens and mean critical path per company style on n one-digit sums of `terms` terms."""
    tasks = build_family("sum", {"digits": 1}).generate(seed=7, n=n_tasks, difficulty=terms - 1)
    out: dict[str, float] = {}
    for style in ("solo", "delegate", "verify"):
        cfg = dataclasses.replace(base, single_agent=style == "solo", task_file=task_file)
        recs = run_episodes(tasks, ScriptedOrg(style=style, len_fn=len_fn), cfg, len_fn=len_fn)
        ok = sum(r.episode.outcome for r in recs) / len(recs)
        key = "critical_path_tokens" if style != "solo" else "total_tokens"
        out[style] = sum(getattr(r.episode, key) for r in recs) / len(recs)
        out[f"{style}_success"] = ok
        out[f"{style}_rounds"] = sum(r.episode.rounds for r in recs) / len(recs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--terms", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    ap.add_argument("--tasks", type=int, default=16)
    args = ap.parse_args()
    len_fn = token_length_fn(build_tokenizer("numbers"))
    settings = (("unbounded", UNBOUNDED, ""), ("unbounded", UNBOUNDED, "task.txt"),
                ("long", load_params("params.yaml", profile="long").org, "task.txt"))
    print("setting   | terms | solo tokens | delegate cp (ratio) | verify cp (ratio) | success s/d/v | briefs")
    for name, base, task_file in settings:
        for k in args.terms:
            m = measure(k, args.tasks, base, task_file, len_fn)
            solo = m["solo"]
            ok = "/".join(f"{m[f'{s}_success']:.2f}" for s in ("solo", "delegate", "verify"))
            print(f"{name:9s} | {k:5d} | {solo:11.1f} | {m['delegate']:7.1f} ({m['delegate'] / solo:4.2f}) "
                  f"| {m['verify']:7.1f} ({m['verify'] / solo:4.2f}) | {ok} | "
                  + ("name task.txt parts" if task_file else "re-type the terms"))


if __name__ == "__main__":
    main()
