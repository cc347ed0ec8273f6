"""LoRA for the RL update (`train.finetune: lora`) through `peft`, and the weights the engine serves.

With LoRA the trainer holds the starting weights frozen plus low-rank adapters A (r x in) and
B (out x r) on the linear layers named by `train.lora_targets`; B starts at zero, so the adapted
model starts exactly at the starting policy. Only the adapters get gradients and optimiser state
(for SmolLM2-135M at r=16 on all seven projections: ~4.9M trainable values instead of 135M).

The rollout engine is a plain HF model: after every optimiser step it is given `serving_state`, the
MERGED weights W + (alpha / r) * B @ A of every adapted layer (computed from the adapter, the
trainer's weights are never merged in place), so what the engine samples is exactly the trained
policy and the trainer's recomputed logprobs match the engine's to float rounding.

`train.finetune: full` (the default) trains every weight, as before; nothing here is used then.
"""

from __future__ import annotations

from typing import Any

import torch

from rlcr.config import TrainConfig


def wrap_lora(model: torch.nn.Module, cfg: TrainConfig):
    """`model` with fresh LoRA adapters on `cfg.lora_targets` (a `peft.PeftModel`); the base is frozen.

    A target name that matches no module is an error naming it (peft would only say that none matched)."""
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)}
    missing = [t for t in cfg.lora_targets if t not in present]
    if missing:
        raise ValueError(f"train.lora_targets: {missing} name no linear layer of this model (it has {sorted(present)})")
    config = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                        target_modules=list(cfg.lora_targets), bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def is_lora(model) -> bool:
    """Whether `model` is a peft model (the trainer's LoRA copy)."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


@torch.no_grad()
def serving_state(model) -> dict[str, torch.Tensor]:
    """The weights a plain HF model of the same architecture should hold to compute what `model` does.

    A plain model: its own state dict. A LoRA model: the base weights under their HF names, each
    adapted layer's weight replaced by W + scaling * B @ A (dropout is inactive at inference)."""
    if not is_lora(model):
        return model.state_dict()
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    merged: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            adapter = module.active_adapters[0]
            merged[f"{name}.weight"] = module.base_layer.weight + module.get_delta_weight(adapter)
    out = {}
    for key, value in base.state_dict().items():
        if "lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        out[key] = merged.get(key, value)
    return out


def trainable_parameters(model) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def lora_summary(model) -> dict[str, Any]:
    """Metrics of the adapted model: trainable share."""
    trainable, total = trainable_parameters(model)
    return {"lora/trainable_params": float(trainable), "lora/total_params": float(total),
            "lora/trainable_share": trainable / max(1, total)}


__all__ = ["is_lora", "lora_summary", "serving_state", "trainable_parameters", "wrap_lora"]
