"""benchmarks/combine_skill.py's --play line: the bootstrap stage's held-out check, by task length (the
SFT rows themselves are the benchmark's, not a test's)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def test_play_reports_each_org_and_sampling_by_task_length():
    from rlcr.config import load_params
    from rlcr.policy.models import build_tiny
    from rlcr.tasks import build_family

    params = load_params(ROOT / "params.yaml", {"tracking.enabled": False}, profile="quick")
    model, tok = build_tiny(params.model, 0)
    held = build_family("sum", {"digits": 1}).generate(5, 4, 1) + build_family("sum", {"digits": 1}).generate(5, 4, 3)
    line = load_benchmark("combine_skill").play(model, tok, held, params, 8)
    parts = line.split("; ")
    assert [p.rsplit(" d1 ", 1)[0] for p in parts] == ["company sampled", "company greedy", "single sampled", "single greedy"]
    for p in parts:  # a rate per length of the held-out sums, each in [0, 1]
        rates = re.findall(r"d(\d+) (\d\.\d\d)", p)
        assert [d for d, _ in rates] == ["1", "3"] and all(0.0 <= float(r) <= 1.0 for _, r in rates), p
