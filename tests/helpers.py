"""Small builders shared by several test files."""

from __future__ import annotations

import torch

from rlcr.config import ModelConfig
from rlcr.policy.models import build_tiny


def varied_tiny(cfg: ModelConfig, seed: int):
    """A tiny model whose outputs vary: at the default init (std 0.02) it just repeats the last
    character, which would make equality tests pass for the wrong reason. -> (model, tokenizer)"""
    model, tok = build_tiny(cfg, seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2, generator=gen)
    return model, tok
