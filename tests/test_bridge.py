"""EnginePolicy through the real round scheduler with a real tiny model: budgets, context, logprobs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlcr.config import ModelConfig, OrgConfig, RewardConfig
from rlcr.org import run_episodes
from rlcr.org.episode import Request
from rlcr.policy.bridge import EnginePolicy, decode_completion, prompt_ids, token_length_fn
from rlcr.policy.engine import Sampling, sequence_logprobs
from rlcr.policy.torch_engine import TorchEngine
from rlcr.tasks import Task, build_family
from tests.helpers import varied_tiny

CTX = 112
MODEL = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, context=CTX)
# observations of at most 96 tokens + turns of at most 16 fill the model's 112 exactly
ORG = OrgConfig(max_agents=4, max_depth=1, max_rounds=8, token_budget=60, max_turn_tokens=16,
                max_obs_tokens=96, context_tokens=CTX, board_posts_shown=4)
LOGPROB_TOL = 1e-4
# a prompt far longer than an observation: the scheduler must cut it, not the engine
LONG = Task(id="long-0", family="sum", kind="math", difficulty=1, prompt="+".join(["12"] * 100), answer="1200")


@pytest.fixture(scope="module")
def policy():
    """A tiny model with larger weights than the default init, so its samples vary (and sometimes end
    with eos) instead of repeating one character."""
    return varied_tiny(MODEL, 0)


@pytest.fixture(scope="module")
def episodes(policy):
    model, tok = policy
    engine = TorchEngine(model, tok, context=CTX)
    pol = EnginePolicy(engine, tok, Sampling(temperature=1.0, max_new_tokens=16, seed=3))
    tasks = [*build_family("sum").generate(0, 4, 1), *build_family("sum").generate(1, 3, 3), LONG]
    recs = run_episodes(tasks, pol, ORG, RewardConfig(), len_fn=token_length_fn(tok))
    return pol, recs


def test_one_engine_call_per_round(episodes):
    pol, recs = episodes
    assert pol.calls == max(r.episode.rounds for r in recs)


def test_the_shared_token_budget_is_never_exceeded(episodes):
    _, recs = episodes
    for r in recs:
        spent = sum(t.completion_tokens for t in r.turns)
        assert spent == r.episode.total_tokens == r.episode.budget_used <= ORG.token_budget
        assert all(1 <= t.completion_tokens <= t.max_new_tokens <= ORG.max_turn_tokens for t in r.turns)
    # the budget, not the round limit, is what ends these episodes: the test exercises the split
    assert any(r.episode.end_reason == "budget" for r in recs)


def test_context_is_never_exceeded_observations_are_cut_first(episodes, policy):
    _, tok = policy
    _, recs = episodes
    turns = [t for r in recs for t in r.turns]
    for t in turns:
        ids = prompt_ids(tok, t.prompt)
        # the model saw the whole observation (the engine dropped nothing) and it fits the window
        assert t.prompt_tokens == len(ids) <= ORG.max_obs_tokens
        assert t.prompt_tokens + t.completion_tokens <= CTX
    long = [t for t in turns if t.task_id == LONG.id]
    # the observation was cut to (nearly: whole lines) the limit, and the task text with it
    assert long and all(ORG.max_obs_tokens - 8 <= t.prompt_tokens for t in long)
    assert all(LONG.prompt not in t.prompt for t in long)


def test_logprobs_are_finite_and_match_the_trainers_recomputation(episodes, policy):
    model, tok = policy
    _, recs = episodes
    turns = [t for r in recs for t in r.turns]
    assert {t.finish_reason for t in turns} >= {"length"}
    for t in turns:
        ids, lps = json.loads(t.token_ids), json.loads(t.logprobs)
        assert len(ids) == len(lps) == t.completion_tokens
        assert all(math.isfinite(x) and x <= 0.0 for x in lps)
        assert decode_completion(tok, ids) == t.completion
        ref = sequence_logprobs(model, prompt_ids(tok, t.prompt), ids)
        assert (ref - torch.tensor(lps)).abs().max() < LOGPROB_TOL, (t.episode_id, t.round, t.agent)


def test_each_request_is_cut_to_its_own_allowance(policy):
    model, tok = policy
    engine = TorchEngine(model, tok, context=CTX)
    sampling = Sampling(temperature=1.0, max_new_tokens=16, ignore_eos=True, seed=7)
    reqs = [Request("e", i, "ceo", 1, "12+34", n) for i, n in enumerate((16, 5, 1))]
    cut = EnginePolicy(engine, tok, sampling).generate_batch(reqs)
    full = EnginePolicy(engine, tok, sampling).generate_batch([Request("e", 0, "ceo", 1, "12+34", 16)] * 3)
    for req, c, f in zip(reqs, cut, full, strict=True):
        assert c.completion_tokens == len(c.token_ids) == len(c.logprobs) == req.max_new_tokens
        # what is kept is exactly what was sampled: the prefix of the uncut completion, same logprobs
        assert c.token_ids == f.token_ids[: req.max_new_tokens] and c.logprobs == f.logprobs[: req.max_new_tokens]
    assert cut[1].finish_reason == cut[2].finish_reason == "length"


def test_same_seed_same_episodes_other_seed_other_episodes(policy):
    model, tok = policy
    tasks = build_family("sum").generate(2, 3, 2)

    def run(seed):
        # a fresh engine: its prefix cache starts empty, as it was for the run compared against
        engine = TorchEngine(model, tok, context=CTX)
        pol = EnginePolicy(engine, tok, Sampling(temperature=1.0, max_new_tokens=16, seed=seed))
        recs = run_episodes(tasks, pol, ORG, RewardConfig(), len_fn=token_length_fn(tok))
        return [(t.prompt, t.token_ids, t.logprobs) for r in recs for t in r.turns]

    assert run(1) == run(1)
    assert run(1) != run(2)
