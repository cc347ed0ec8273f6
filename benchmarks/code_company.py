"""A company of the smollm2 profile on the code tasks of its eval suite, end to end, and what it did.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/code_company.py [--per-family 2] [--orgs company single]

Builds the `humaneval` and `canary` families of `profiles.smollm2`'s `prepare.eval` exactly as the
prepare stage draws them (the eval seed), keeps `--per-family` of each (default: the profile's
`rollout.max_tasks_per_family`), converts SmolLM2-135M-Instruct once into `models/base/smollm2`
(the bootstrap stage's folder), and rolls the tasks out with `rlcr.rollout.rollout_policy`: the
torch engine, the sandboxed RUN, grading by the pristine hidden tests. Prints per org the pass rate
on HumanEval, the canaries passed, the `cheat/` counters of `rlcr.behaviour` with their counts, what
the agents did (WRITEs, RUNs, SUBMITs) and the seconds. `--json PATH` also writes the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from rlcr.behaviour import behaviour_metrics  # noqa: E402
from rlcr.config import resolve  # noqa: E402
from rlcr.rollout import rollout_policy, select_tasks  # noqa: E402
from rlcr.tasks.suite import EVAL_SEED_OFFSET, SplitReport, build_split  # noqa: E402

CODE_FAMILIES = ("humaneval", "canary")


def code_tasks(params, per_family: int):
    specs = tuple(f for f in params.prepare.eval if f.name in CODE_FAMILIES)
    if not specs:
        raise SystemExit("the profile's prepare.eval has no humaneval or canary family")
    tasks = build_split(specs, params.prepare.seed + EVAL_SEED_OFFSET, set(), params.prepare, SplitReport())
    return select_tasks(tasks, per_family)


def summary(records, seconds: float) -> dict[str, float]:
    m = behaviour_metrics(records)
    out = {k: v for k, v in m.items() if k.startswith("cheat/") and (k.endswith("_total") or k.endswith("_rate"))}
    he = [r for r in records if r.episode.family == "humaneval"]
    out["humaneval/episodes"] = float(len(he))
    out["humaneval/pass_rate"] = sum(r.episode.outcome >= 1.0 for r in he) / len(he) if he else float("nan")
    acts = Counter(a["kind"] for r in records for t in r.turns for a in json.loads(t.actions))
    out.update({f"actions/{k}": float(v) for k, v in sorted(acts.items())})
    out["episodes/submitted"] = float(sum(r.episode.submitted for r in records))
    out["episodes/malformed_turns"] = float(sum(r.episode.malformed_turns for r in records))
    out["episodes/turns"] = float(sum(r.episode.n_turns for r in records))
    out["seconds"] = seconds
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-family", type=int, default=None, help="tasks per code family (default: the profile's)")
    ap.add_argument("--orgs", nargs="+", default=["company"], choices=["company", "single"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    from rlcr.policy.models import build_smollm2

    params = resolve({**yaml.safe_load((ROOT / "params.yaml").read_text()), "profile": "smollm2"})
    per = args.per_family if args.per_family is not None else params.rollout.max_tasks_per_family
    tasks = code_tasks(params, per)
    t0 = time.perf_counter()
    folder = build_smollm2(Path(params.model.path) if params.model.path else ROOT / "models/base/smollm2")
    print(f"[code-company] model {folder} ready in {time.perf_counter() - t0:.1f} s; tasks: "
          + ", ".join(f"{t.family}:{t.meta['entry_point']}" for t in tasks), flush=True)
    results = {}
    for org in args.orgs:
        t0 = time.perf_counter()
        records = rollout_policy(tasks, folder, org, params, args.seed)
        results[org] = summary(records, time.perf_counter() - t0)
        print(f"[code-company] {org}:", flush=True)
        for k, v in results[org].items():
            print(f"  {k:40s} {v:.3f}" if isinstance(v, float) and not v.is_integer() else f"  {k:40s} {v:.0f}")
        for r in records:
            e = r.episode
            print(f"  - {e.family:9s} {json.loads(e.task)['id']}: outcome {e.outcome:.0f}, {e.end_reason}, "
                  f"{e.n_agents} agents, {e.n_turns} turns, answer {e.answer[:60]!r}; first turn "
                  f"{r.turns[0].completion[:160]!r}" if r.turns else "")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
