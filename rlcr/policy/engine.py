"""The rollout engine interface: prompts as token ids in, completions with logprobs out.

Episode code talks only to `Engine.generate`, so the in-process torch engine (CPU/CUDA) and the
vLLM engine (GPU profile) are interchangeable. `sequence_logprobs` is the trainer's side of the same
number: the logprob of each completion token under the model by one full forward, which the engine's
returned logprobs must match (they are the `old` logprobs of the importance ratio).
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import torch

from rlcr.config import EngineConfig, ModelConfig, Sampler

FinishReason = Literal["stop", "length", "context"]

SAMPLERS = typing.get_args(Sampler)


@dataclass(frozen=True)
class Sampling:
    """How to sample one `generate` call; same prompts + same Sampling (seed included) -> same output
    (bit for bit from the same engine state; an engine's prefix cache can move logprobs by float rounding)."""

    temperature: float = 1.0
    """0 means greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]; 1 samples from the full distribution."""
    max_new_tokens: int = 64
    """Generated tokens per prompt at most."""
    stop: tuple[str, ...] = ()
    """Stop strings, e.g. ("\\n",) for one protocol line; the stop text is part of the completion."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra token ids that end a completion (eos always does unless `ignore_eos`)."""
    ignore_eos: bool = False
    """Do not stop at eos (benchmarks with equal lengths)."""
    seed: int = 0
    """Seed of this call's sampling generator."""
    sampler: Sampler = "multinomial"
    """How the torch engine draws a token from the (B, V) probabilities (`EngineConfig.sampler`)."""

    def __post_init__(self) -> None:
        if not self.temperature >= 0 or math.isinf(self.temperature):
            raise ValueError(f"Sampling.temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"Sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"Sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"Sampling.sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        if any(not s for s in self.stop):
            raise ValueError("Sampling.stop: an empty stop string would stop before anything is generated")

    @classmethod
    def from_config(cls, cfg: EngineConfig, **over) -> Sampling:
        """The params.yaml defaults, with per-call fields (stop, seed, ...) in `over`."""
        return cls(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                   sampler=cfg.sampler, **over)


@dataclass
class Completion:
    """One generated continuation."""

    token_ids: list[int]
    """Sampled tokens, including the stop sequence or eos that ended it (the trainer credits them)."""
    logprobs: list[float]
    """Per token: log p(token | prefix) under the model at temperature 1, without top-p, i.e. what a
    full forward of the same weights gives (`sequence_logprobs`), not the tempered sampling law."""
    finish_reason: FinishReason
    """stop: a stop string/id or eos; length: max_new_tokens; context: the context window is full."""
    prompt_tokens_dropped: int = 0
    """Tokens cut from the left of the prompt to fit the context (the model did not see them)."""


class Engine(Protocol):
    """What episodes need from a rollout engine."""

    context: int
    """Tokens the model sees at most (prompt + completion)."""

    def generate(self, prompt_token_ids: list[list[int]], sampling: Sampling) -> list[Completion]: ...

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None: ...


def pad_token_id(tokenizer) -> int:
    """The id that pads a batch: the tokenizer's pad token, else its eos, else 0."""
    return next(i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0) if i is not None)


@torch.no_grad()
def sequence_logprobs(model, prompt_ids: list[int], completion_ids: list[int]) -> torch.Tensor:
    """(C,) log p(completion[t] | prompt, completion[:t]) by one full forward, float32, on CPU."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=device)
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()  # (C, V)
    target = torch.tensor(completion_ids, device=device)
    return torch.log_softmax(logits, -1).gather(-1, target[:, None])[:, 0].cpu()


def make_engine(cfg: EngineConfig, folder: str | Path, model_cfg: ModelConfig | None = None) -> Engine:
    """The engine `cfg.kind` serving the policy folder; model.context caps the context."""
    context = model_cfg.context if model_cfg is not None else None
    if cfg.kind == "torch":
        from rlcr.policy.models import load_policy
        from rlcr.policy.torch_engine import TorchEngine

        model, tok = load_policy(folder, device=cfg.device, dtype=cfg.dtype)
        return TorchEngine.from_config(model, tok, cfg, context)
    if cfg.kind == "vllm":
        from rlcr.policy.vllm_engine import VllmEngine

        return VllmEngine.from_folder(folder, device=cfg.device, dtype=cfg.dtype, context=context)
    raise ValueError(f"engine.kind {cfg.kind!r}: known kinds are torch and vllm")
