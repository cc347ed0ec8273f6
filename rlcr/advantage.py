"""Group-relative advantages for collective rewards, and their broadcast onto tokens.

G episodes of the same task form a group. Every agent in an episode is paid the episode's collective
reward, so an episode's advantage is its reward measured against its group:

    A = (R - mean_group(R)) / (std_group(R) + eps)        (GRPO, Shao et al. 2024)
    A =  R - mean_group(R)                                (std_normalise=False: Dr. GRPO / nanochat)

How this departs from GRPO as usually written:
- groups are arbitrary keys, not a fixed (n_tasks, G) reshape, so episodes can be grouped per
  (task, role) when roles see different prompts (`role_group_ids`), and ragged groups work;
- a group whose rewards are all equal gets advantage exactly 0.0 (not ~1e-9 from float error in the
  mean, not NaN from 0/0): it carries no signal, so it must push nothing (docs/reliability.md, item 12);
- a group of one has no baseline and gets 0;
- a non-finite reward is refused with its index before anything is computed (docs/reliability.md, item 11).

The std is the unbiased sample std (n - 1), as in TRL's GRPO, computed in float64.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import torch


def check_finite_rewards(rewards: torch.Tensor) -> None:
    """Raise ValueError naming the first non-finite reward; a NaN reward must never reach a loss."""
    bad = (~torch.isfinite(rewards)).nonzero()
    if len(bad):
        i = int(bad[0, 0])
        raise ValueError(
            f"reward at index {i} is not finite ({rewards[i].item()}); {len(bad)} non-finite of {len(rewards)}"
        )


def dense_group_ids(keys: Sequence[Hashable]) -> torch.Tensor:
    """Map arbitrary hashable group keys to 0..K-1 in order of first appearance. -> (B,) long"""
    index: dict[Hashable, int] = {}
    return torch.tensor([index.setdefault(k, len(index)) for k in keys], dtype=torch.long)


def role_group_ids(group_ids: Sequence[Hashable] | torch.Tensor, roles: Sequence[str]) -> torch.Tensor:
    """Group keys for per-role grouping: samples share a group iff same task group AND same role.

    Roles see different prompts (a CEO's brief vs a verifier's), so their returns are not exchangeable
    and a shared baseline would credit a role for being a role. -> (B,) long
    """
    gids = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    if len(gids) != len(roles):
        raise ValueError(f"group_ids has {len(gids)} entries but roles has {len(roles)}")
    return dense_group_ids(list(zip(gids, roles, strict=True)))


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | Sequence[Hashable],
    std_normalise: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantage of each sample against the other samples of its group. -> (B,) float32

    rewards: (B,) float; group_ids: (B,) ints or any hashable keys.
    """
    rewards = torch.as_tensor(rewards)
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D (B,), got shape {tuple(rewards.shape)}")
    check_finite_rewards(rewards)
    if isinstance(group_ids, torch.Tensor):
        gid = dense_group_ids(group_ids.tolist())
    else:
        gid = dense_group_ids(list(group_ids))
    if len(gid) != len(rewards):
        raise ValueError(f"group_ids has {len(gid)} entries but rewards has {len(rewards)}")
    if len(rewards) == 0:
        return torch.zeros(0)

    r = rewards.double()  # (B,)
    k = int(gid.max()) + 1
    count = torch.zeros(k, dtype=torch.float64).index_add_(0, gid, torch.ones_like(r))  # (K,)
    mean = torch.zeros(k, dtype=torch.float64).index_add_(0, gid, r) / count  # (K,)
    lo = torch.full((k,), math.inf, dtype=torch.float64).scatter_reduce(0, gid, r, "amin")  # (K,)
    hi = torch.full((k,), -math.inf, dtype=torch.float64).scatter_reduce(0, gid, r, "amax")  # (K,)
    informative = (hi > lo) & (count > 1)  # (K,) a group with no spread or no peer carries no signal

    centred = r - mean[gid]  # (B,)
    centred = torch.where(informative[gid], centred, torch.zeros_like(centred))  # exact 0.0, not ~1e-17
    if std_normalise:
        sq = torch.zeros(k, dtype=torch.float64).index_add_(0, gid, centred**2)  # (K,)
        std = (sq / (count - 1).clamp(min=1)).sqrt()  # (K,) unbiased
        centred = centred / (std[gid] + eps)
    return centred.float()


def token_advantages(
    advantages: torch.Tensor,
    *,
    loss_mask: torch.Tensor | None = None,
    token_sample: torch.Tensor | None = None,
) -> torch.Tensor:
    """Broadcast each sample's advantage onto its tokens; give exactly one of the two layouts.

    Padded layout, one row per sample (an agent turn or an episode):
        advantages (B,), loss_mask (B, T) -> (B, T), zero where loss_mask is 0 (observation tokens).
    Packed layout, tokens of all samples in one stream:
        advantages (B,), token_sample (N,) long index into B -> (N,).
    The same gather maps episode advantages onto agent turns (token_sample = turn -> episode).
    """
    if (loss_mask is None) == (token_sample is None):
        raise ValueError("give exactly one of loss_mask (B, T) or token_sample (N,)")
    if advantages.ndim != 1:
        raise ValueError(f"advantages must be 1-D (B,), got shape {tuple(advantages.shape)}")
    if token_sample is not None:
        if token_sample.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"token_sample must be an integer index tensor, got {token_sample.dtype}")
        if len(token_sample) and (token_sample.min() < 0 or token_sample.max() >= len(advantages)):
            raise ValueError(f"token_sample indexes outside 0..{len(advantages) - 1}")
        return advantages[token_sample]  # (N,)
    assert loss_mask is not None
    if loss_mask.ndim != 2 or loss_mask.shape[0] != advantages.shape[0]:
        raise ValueError(f"loss_mask must be (B={advantages.shape[0]}, T), got {tuple(loss_mask.shape)}")
    return torch.where(
        loss_mask.bool(), advantages[:, None], torch.zeros((), dtype=advantages.dtype)
    )  # (B, T)
