"""Clipped token-level policy loss against hand-computed numbers; logprob recomputation; NaN guard."""

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlcr.train.loss import Refusals, finite_or_refuse, policy_loss, sequence_logprobs

LN = math.log


def _lp(*probs, grad=False):
    t = torch.tensor([[LN(p) if p > 0 else float(p) for p in probs]], dtype=torch.float64)
    return t.requires_grad_(grad)


def test_positive_advantage_by_hand_clip_and_masked_nan():
    # token 0: r = 1.0 -> -2 * 1.0 = -2.0; token 1: r = 1.4 > 1.2, clipped -> -2 * 1.2 = -2.4;
    # token 2 is masked and NaN: it must not touch the loss or the gradient
    new = torch.tensor([[LN(0.5), LN(0.7), float("nan")]], dtype=torch.float64, requires_grad=True)
    old = _lp(0.5, 0.5, 0.5)
    mask = torch.tensor([[1, 1, 0]])
    loss, st = policy_loss(new, old, torch.tensor([2.0], dtype=torch.float64), mask, 0.2, 0.2)
    assert loss.item() == pytest.approx((-2.0 - 2.4) / 2)
    assert st["losses/clip_frac"] == pytest.approx(0.5)
    assert st["losses/ratio_mean"] == pytest.approx(1.2)
    assert st["losses/ratio_max"] == pytest.approx(1.4)
    assert st["losses/approx_kl"] == pytest.approx((0.4 - LN(1.4)) / 2)
    assert st["losses/tokens"] == 2
    loss.backward()
    # d/d new_0 = -A * r / n = -2 * 1 / 2; clipped token and masked token get exactly 0
    assert new.grad.tolist() == [[pytest.approx(-1.0), 0.0, 0.0]]


def test_negative_advantage_clips_low_side_only():
    # A = -1. token 0: r = 0.5 < 0.8 -> max(0.5, 0.8) = 0.8, clipped (no gradient);
    # token 1: r = 1.5 -> max(1.5, 1.2) = 1.5, NOT clipped: a bad action made likelier keeps its penalty
    new = _lp(0.25, 0.75, grad=True)
    old = _lp(0.5, 0.5)
    loss, st = policy_loss(new, old, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 2), 0.2, 0.2)
    assert loss.item() == pytest.approx((0.8 + 1.5) / 2)
    assert st["losses/clip_frac"] == pytest.approx(0.5)
    loss.backward()
    assert new.grad.tolist() == [[0.0, pytest.approx(1.5 / 2)]]


@pytest.mark.parametrize(("delta", "has_grad"), [(-1e-4, True), (1e-4, False)])
def test_gradient_stops_just_past_the_high_clip(delta, has_grad):
    r = 1.28 + delta  # eps_high = 0.28, A = +1
    new = torch.tensor([[LN(r)]], dtype=torch.float64, requires_grad=True)
    loss, _ = policy_loss(
        new, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([1.0]), torch.ones(1, 1), 0.2, 0.28
    )
    loss.backward()
    assert loss.item() == pytest.approx(-min(r, 1.28))
    assert new.grad.item() == (pytest.approx(-r) if has_grad else 0.0)


def test_token_mean_over_batch_not_per_sequence():
    # sample 0: 1 token, A = +1; sample 1: 3 tokens, A = -1; r = 1 everywhere
    # token-mean (DAPO): (-1 + 3) / 4 = 0.5; GRPO's sequence-mean would give (-1 + 1) / 2 = 0
    new = torch.zeros(2, 3)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    loss, _ = policy_loss(new, new.clone(), torch.tensor([1.0, -1.0]), mask)
    assert loss.item() == pytest.approx(0.5)
    # micro-batching: the whole batch's token count is the denominator
    loss8, _ = policy_loss(new, new.clone(), torch.tensor([1.0, -1.0]), mask, token_count=8)
    assert loss8.item() == pytest.approx(2 / 8)


def test_per_token_advantages_accepted():
    new = torch.zeros(1, 2)
    loss, _ = policy_loss(new, new.clone(), torch.tensor([[1.0, 3.0]]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(-2.0)


def test_k3_kl_to_reference_by_hand():
    # p_new = 0.5, p_ref = 0.25: d = ln(0.5) -> k3 = 0.5 - ln(0.5) - 1 = 0.193147; dk3/dnew = 1 - e^d = 0.5
    new = _lp(0.5, grad=True)
    loss, st = policy_loss(
        new, new.detach().clone(), torch.tensor([0.0]), torch.ones(1, 1), ref_logprobs=_lp(0.25), kl_coef=0.1
    )
    assert st["losses/kl"] == pytest.approx(0.5 - LN(0.5) - 1)
    assert loss.item() == pytest.approx(0.1 * (0.5 - LN(0.5) - 1))
    loss.backward()
    assert new.grad.item() == pytest.approx(0.1 * 0.5)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(new, new, torch.tensor([0.0]), torch.ones(1, 1), kl_coef=0.1)


def test_entropy_stat_from_logits():
    _, st = policy_loss(
        torch.zeros(1, 2),
        torch.zeros(1, 2),
        torch.tensor([1.0]),
        torch.tensor([[1, 0]]),
        logits=torch.zeros(1, 2, 4),
    )
    assert st["losses/entropy"] == pytest.approx(LN(4))


# ------------------------------------------------------------------------- real model: logprobs, guard


def _tiny_llama(seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg).eval()


def test_sequence_logprobs_match_manual_and_ignore_left_padding():
    model = _tiny_llama()
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    lp = sequence_logprobs(model, ids, torch.ones_like(ids))
    assert lp.shape == (1, 4)
    with torch.no_grad():
        manual = torch.log_softmax(model(ids).logits[0, :-1], -1)[torch.arange(4), ids[0, 1:]]
    torch.testing.assert_close(lp[0], manual, atol=1e-5, rtol=1e-5)
    padded = torch.tensor([[0, 0, 1, 5, 9, 3, 7]])
    lp_pad = sequence_logprobs(model, padded, torch.tensor([[0, 0, 1, 1, 1, 1, 1]]))
    torch.testing.assert_close(lp_pad[0, 2:], lp[0], atol=1e-5, rtol=1e-5)


def _snapshot(model, opt):
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    state = {
        i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
        for i, s in enumerate(opt.state.values())
    }
    return weights, state


def _assert_bitwise_same(model, opt, snap):
    weights, state = snap
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    for i, s in enumerate(opt.state.values()):
        for k, v in s.items():
            assert torch.equal(v, state[i][k]) if torch.is_tensor(v) else v == state[i][k]


def _rl_step(model, opt, refusals, old_logprobs):
    ids = torch.tensor([[1, 5, 9, 3, 7], [1, 4, 4, 2, 6]])
    mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    new = sequence_logprobs(model, ids, torch.ones_like(ids))
    loss, _ = policy_loss(new, old_logprobs, torch.tensor([1.0, -1.0]), mask)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if finite_or_refuse(loss, model, opt, refusals):
        opt.step()
        return True
    return False


def test_nan_in_rollout_logprobs_refused_before_step_weights_bitwise_unchanged():
    model = _tiny_llama().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    refusals = Refusals()
    old = torch.full((2, 4), -3.0)
    assert _rl_step(model, opt, refusals, old)  # a normal step first, so Adam has state to protect
    snap = _snapshot(model, opt)
    old_bad = old.clone()
    old_bad[1, 2] = float("nan")  # a corrupt logprob from the engine, on a loss-carrying token
    assert not _rl_step(model, opt, refusals, old_bad)
    assert refusals.count == 1 and "loss" in refusals.last_reason
    _assert_bitwise_same(model, opt, snap)
    assert all(p.grad is None for p in model.parameters())  # poisoned grads dropped
    assert _rl_step(model, opt, refusals, old)  # and training goes on
    assert not torch.equal(model.lm_head.weight, snap[0]["lm_head.weight"])


def test_nan_gradient_with_finite_loss_refused():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    snap = _snapshot(model, opt)
    w = model[0].weight
    # sqrt'(0) = inf and 0 * inf = NaN: autograd itself makes NaN gradients behind a finite loss
    loss = model(torch.randn(8, 4)).pow(2).mean() + 0.0 * torch.sqrt(w - w).sum()
    loss.backward()
    assert torch.isfinite(loss)
    refusals = Refusals()
    assert not finite_or_refuse(loss, model, opt, refusals)
    assert "gradient" in refusals.last_reason
    _assert_bitwise_same(model, opt, snap)


def test_nan_logits_refused():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    refusals = Refusals()
    logits = torch.tensor([[0.0, float("inf")]])
    assert not finite_or_refuse(torch.tensor(1.0), model, opt, refusals, logits=logits)
    assert refusals.last_reason == "logits contain NaN/Inf"
