"""The policy-gradient loss we run, per-token log-probabilities, and the non-finite update guard.

`policy_loss` is a token-level clipped policy gradient:

    r_t    = exp(logp_new_t - logp_rollout_t)                                   # (B, T)
    pg_t   = max(-A * r_t, -A * clip(r_t, 1 - eps_low, 1 + eps_high))          # (B, T)
    kl_t   = exp(ref_t - new_t) - (ref_t - new_t) - 1                           # (B, T), k3
    loss   = sum_t mask_t * (pg_t + kl_coef * kl_t) / sum_t mask_t              # scalar

How it departs from the papers it borrows from:
- PPO (Schulman et al. 2017, arXiv 1707.06347): the pessimistic clipped surrogate is the same, but
  there is no value function; A is a group-relative advantage (see rlcr/advantage.py) and is the same
  for every token of a sample.
- GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300): GRPO averages tokens within a sequence,
  then sequences; we take one mean over ALL completion tokens of the batch (DAPO's token-level
  aggregation, Yu et al. 2025, arXiv 2503.14476), so a long agent turn is not down-weighted per token
  and many short turns from one busy agent do not dominate. The clip is asymmetric (DAPO's
  clip-higher) when eps_high > eps_low.
- The KL to the reference is added to the loss, not the reward, with Schulman's unbiased,
  always-positive k3 estimator (http://joschu.net/blog/kl-approx.html), as in GRPO.
- The ratio is taken against the rollout engine's logprobs, so off-policy drift between the engine
  and the trainer (or between minibatch steps) is clipped the same way.

Observation and prompt tokens (loss_mask == 0) never carry loss or gradient: masked positions are
replaced by 0 before any arithmetic, so a -inf or NaN there (padding) cannot leak into the loss or
its gradient.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.28,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    logits: torch.Tensor | None = None,
    token_count: int | float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped token-level policy-gradient loss, token-mean over the batch. -> (scalar loss, stats)

    new_logprobs, old_logprobs, ref_logprobs, loss_mask: (B, T); advantages: (B,) or (B, T);
    logits: (B, T, V) aligned with new_logprobs, only for the entropy statistic.
    token_count: the denominator when a batch is split into micro-batches (the whole batch's number
    of completion tokens); default: this micro-batch's.
    """
    if new_logprobs.shape != old_logprobs.shape or new_logprobs.shape != loss_mask.shape:
        raise ValueError(
            f"shapes differ: new {tuple(new_logprobs.shape)}, old {tuple(old_logprobs.shape)}, "
            f"mask {tuple(loss_mask.shape)}"
        )
    if advantages.shape not in (new_logprobs.shape[:1], new_logprobs.shape):
        raise ValueError(f"advantages must be (B,) or (B, T), got {tuple(advantages.shape)}")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    m = loss_mask.bool()  # (B, T)
    zero = torch.zeros((), dtype=new_logprobs.dtype, device=new_logprobs.device)
    n = float(token_count) if token_count is not None else float(m.sum().clamp(min=1))

    new = torch.where(m, new_logprobs, zero)  # (B, T)
    old = torch.where(m, old_logprobs.detach(), zero)  # (B, T)
    adv = advantages.detach()
    adv = adv[:, None].expand_as(new) if adv.ndim == 1 else adv  # (B, T)
    adv = torch.where(m, adv.to(new.dtype), zero)  # (B, T)

    log_ratio = new - old  # (B, T), 0 on masked tokens
    ratio = torch.exp(log_ratio)  # (B, T)
    pg_unclipped = -adv * ratio  # (B, T)
    pg_clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)  # (B, T)
    pg_tok = torch.maximum(pg_unclipped, pg_clipped)  # (B, T) pessimistic bound
    pg = torch.where(m, pg_tok, zero).sum() / n

    kl = zero
    if ref_logprobs is not None:
        d = torch.where(m, ref_logprobs.detach(), zero) - new  # (B, T) log(p_ref / p_new)
        kl_tok = torch.exp(d) - d - 1.0  # (B, T) k3 >= 0
        kl = torch.where(m, kl_tok, zero).sum() / n
    loss = pg + kl_coef * kl if kl_coef > 0 else pg

    with torch.no_grad():
        cnt = m.sum().clamp(min=1)
        clipped = (pg_clipped > pg_unclipped) & m  # the clip bound is the active term: no gradient
        ratio_m = ratio[m]
        stats = {
            "losses/total": float(loss.detach()),
            "losses/pg": float(pg.detach()),
            "losses/kl": float(kl.detach()),
            "losses/clip_frac": float(clipped.sum() / cnt),
            "losses/ratio_mean": float(ratio_m.mean()) if ratio_m.numel() else 1.0,
            "losses/ratio_max": float(ratio_m.max()) if ratio_m.numel() else 1.0,
            # k3 of KL(rollout || new), as cleanrl logs it: >= 0, unbiased
            "losses/approx_kl": float(torch.where(m, (ratio - 1.0) - log_ratio, zero).sum() / cnt),
            "losses/tokens": float(m.sum()),
        }
        if logits is not None:
            stats["losses/entropy"] = float(torch.where(m, token_entropy(logits), zero).sum() / cnt)
    return loss, stats


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at each position. (B, T, V) -> (B, T)"""
    logp = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    return -(logp.exp() * logp).sum(-1)


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    return_logits: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each given token under a HF causal LM, for recomputing rollout logprobs.

    input_ids, attention_mask: (B, T) -> (B, T-1), entry t = log p(input_ids[:, t+1] | input_ids[:, :t+1]).
    Positions are counted from each row's first real token, so left- and right-padded rows give the
    same numbers as the row alone (the engine's KV-cached decode must count them the same way).
    With return_logits, also the (B, T-1, V) logits for entropy.
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logits = logits[:, :-1].float()  # (B, T-1, V) predicts tokens 1..T-1
    targets = input_ids[:, 1:]  # (B, T-1)
    logp = -F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, T-1)
    return (logp, logits) if return_logits else logp


# ------------------------------------------------------------------------------- non-finite guard


@dataclass
class Refusals:
    """Updates refused because a loss, logit or gradient was NaN/Inf (docs/reliability.md, item 11)."""

    count: int = 0
    """How many updates were refused since the start of the run (log it as `train/refused_updates`)."""
    last_reason: str = ""
    """What was non-finite in the last refused update."""


def nonfinite_reason(
    loss: torch.Tensor | None,
    parameters: Iterable[torch.nn.Parameter] = (),
    logits: torch.Tensor | None = None,
) -> str | None:
    """None when loss, logits and every existing gradient are finite; else what is not."""
    if loss is not None and not bool(torch.isfinite(loss.detach()).all()):
        return f"loss is {loss.detach().flatten()[0].item()}"
    if logits is not None and not bool(torch.isfinite(logits.detach()).all()):
        return "logits contain NaN/Inf"
    grads = [p.grad for p in parameters if p.grad is not None]
    if grads:
        finite = torch.stack([torch.isfinite(g.detach()).all() for g in grads])  # (P,) one sync
        if not bool(finite.all()):
            return f"{int((~finite).sum())} gradient tensor(s) contain NaN/Inf"
    return None


def finite_or_refuse(
    loss: torch.Tensor | None,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    refusals: Refusals,
    logits: torch.Tensor | None = None,
) -> bool:
    """True when the update may be stepped; else drop its gradients, count it and return False.

    Call after backward and before clipping and optimizer.step (or after the forward alone, to
    skip a pointless backward). A refused update leaves weights and optimizer state bit-for-bit
    as they were: no step, and the poisoned gradients are dropped so they cannot leak into the
    next accumulation. Covers: NaN/Inf in the loss, the given logits, any parameter gradient.
    Does not cover: finite but huge values (that is grad_clip's job), NaN already in the weights
    (checkpoint.save_checkpoint refuses those).
    """
    reason = nonfinite_reason(loss, model.parameters(), logits)
    if reason is None:
        return True
    optimizer.zero_grad(set_to_none=True)
    refusals.count += 1
    refusals.last_reason = reason
    return False
