"""Supervised bootstrap: fine-tune a causal LM on scripted traces, loss on action tokens only.

RL from a sparse collective reward has nothing to reinforce while the company almost never
succeeds (measured: REINFORCE from a 9% model gained nothing), so the policy first imitates
scripted traces. Only the tokens the agent itself writes (loss_mask == 1) are trained; prompts,
briefs and observations are context, never targets, exactly as in the RL loss.

The loss is a token-mean over all action tokens of the batch (like the RL loss). The run is
deterministic for a seed: data order comes from `checkpoint.next_indices` (a pure function of
seed, epoch and position) and dropout from the torch RNG seeded at the start. An update whose loss
or gradients are NaN/Inf is refused before optimizer.step (`loss.finite_or_refuse`) and counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from rlcr.config import BootstrapConfig
from rlcr.train.checkpoint import DataCursor, next_indices
from rlcr.train.loss import Refusals, finite_or_refuse, sequence_logprobs


@dataclass(frozen=True)
class SFTExample:
    """One tokenised trace."""

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    """1 where the token is the agent's own action (a training target), 0 for context."""

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError(
                f"input_ids has {len(self.input_ids)} tokens but loss_mask {len(self.loss_mask)}"
            )
        if len(self.input_ids) < 2:
            raise ValueError("an example needs at least 2 tokens (a context and a target)")
        if self.loss_mask[0]:
            raise ValueError("loss_mask[0] must be 0: the first token has no context to predict it from")


@dataclass
class SFTResult:
    """What a bootstrap run did."""

    losses: list[float] = field(default_factory=list)
    """Loss of each applied update, in order."""
    refusals: Refusals = field(default_factory=Refusals)
    """Updates refused for NaN/Inf."""


def collate(examples: Sequence[SFTExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch. -> input_ids, attention_mask, loss_mask, each (B, T)"""
    t = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), t), pad_id, dtype=torch.long)  # (B, T)
    attn = torch.zeros((len(examples), t), dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(examples), t), dtype=torch.long)  # (B, T)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(e.loss_mask)
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": mask}


def masked_lm_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean negative log-likelihood of the action tokens of the batch (token-mean). -> scalar"""
    logp = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"])  # (B, T-1)
    target = batch["loss_mask"][:, 1:].bool()  # (B, T-1): token t+1 is predicted at t
    n = target.sum().clamp(min=1)
    return -torch.where(target, logp, torch.zeros((), dtype=logp.dtype)).sum() / n


def lr_multiplier(step: int, total: int, warmup: int, schedule: str) -> float:
    """Linear warmup to 1, then constant or cosine decay to 0.1 at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup - 1)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def train_sft(
    model: torch.nn.Module,
    examples: Sequence[SFTExample],
    cfg: BootstrapConfig,
    pad_id: int,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    batches: Sequence[Sequence[int]] | None = None,
    bf16: bool = False,
) -> SFTResult:
    """Fine-tune model in place for cfg.steps batches; on_step(step, metrics) after each one.

    batches: the example indices of each step (e.g. grouped by length so little is padding), at
    least cfg.steps of them; default: cfg.batch_size indices per step in seeded epoch order.
    bf16: the forwards under bf16 autocast (weights, gradients and AdamW state keep their dtype), as
    the RL trainer runs them with `train.bf16`."""
    if not examples:
        raise ValueError("no SFT examples")
    if not any(any(e.loss_mask) for e in examples):
        raise ValueError("no example has a loss-carrying token (all loss_mask are 0)")
    if batches is not None and len(batches) < cfg.steps:
        raise ValueError(f"{len(batches)} batches given for {cfg.steps} steps")
    torch.manual_seed(cfg.seed)  # dropout
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_multiplier(s, cfg.steps, cfg.warmup_steps, cfg.schedule)
    )
    cursor, result = DataCursor(), SFTResult()

    for step in range(cfg.steps):
        # batch
        idx = batches[step] if batches is not None else next_indices(cursor, len(examples), cfg.batch_size, cfg.seed)
        batch = collate([examples[i] for i in idx], pad_id)
        # loss
        lr = sched.get_last_lr()[0]
        with torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = masked_lm_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        # step, unless something is NaN/Inf
        metrics = {
            "losses/sft": float(loss.detach()),
            "charts/lr": lr,
            "perf/tokens": float(batch["attention_mask"].sum()),
        }
        if finite_or_refuse(loss, model, opt, result.refusals):
            if cfg.grad_clip > 0:
                metrics["losses/grad_norm"] = float(
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                )
            opt.step()
            sched.step()
            result.losses.append(metrics["losses/sft"])
        metrics["train/refused_updates"] = float(result.refusals.count)
        # log
        if on_step is not None:
            on_step(step, metrics)
    return result
