"""The seam between the organisation and the model: text turns <-> token ids, one engine call a round.

`prompt_ids` and `completion_ids` are the ONE encoding used everywhere (rollouts, SFT on scripted
traces, RL recomputation), so the model is trained on exactly what it later sees. A turn's completion
ends with the tokenizer's eos: turns hold several action lines (WRITE bodies span lines), so no
newline stop is used.

`EnginePolicy` is an `rlcr.org.Policy`: all requests of a round (all agents of all episodes) go to
the engine as ONE `generate` call with the largest allowance; each completion is then cut to its own
request's `max_new_tokens` (the cut tokens are dropped with their logprobs, so what is kept is exactly
what the model sampled).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from rlcr.org.episode import Generation, Request
from rlcr.policy.engine import Engine, Sampling
from rlcr.policy.instruct import system_prompt
from rlcr.policy.models import render_chat
from rlcr.policy.tokenizer import encode


def prompt_ids(tokenizer, text: str) -> list[int]:
    """Observation text -> prompt ids (instruct models: chat template with the protocol as the system
    message, rlcr/policy/instruct.py; tiny: <bos> + its tokens)."""
    return render_chat(tokenizer, text, system=system_prompt(tokenizer))


def completion_ids(tokenizer, text: str) -> list[int]:
    """A turn's text as the model should produce it: its tokens, then eos (for SFT targets)."""
    return [*encode(tokenizer, text, bos=False), tokenizer.eos_token_id]


def decode_completion(tokenizer, ids: Sequence[int]) -> str:
    """Text of generated ids without the eos/special tokens that ended it."""
    return tokenizer.decode(list(ids), skip_special_tokens=True)


class EnginePolicy:
    """An organisation policy backed by an engine (torch or vLLM)."""

    def __init__(self, engine: Engine, tokenizer, sampling: Sampling):
        self.engine, self.tokenizer, self.sampling = engine, tokenizer, sampling
        self.calls = 0

    def generate_batch(self, requests: Sequence[Request]) -> list[Generation]:
        if not requests:
            return []
        prompts = [prompt_ids(self.tokenizer, r.prompt) for r in requests]
        longest = max(r.max_new_tokens for r in requests)
        sampling = replace(self.sampling, max_new_tokens=max(1, min(longest, self.sampling.max_new_tokens)),
                           seed=self.sampling.seed + self.calls)
        self.calls += 1
        out = []
        for req, ids, comp in zip(requests, prompts, self.engine.generate(prompts, sampling), strict=True):
            limit = min(req.max_new_tokens, sampling.max_new_tokens)
            tokens, logprobs, finish = comp.token_ids, comp.logprobs, comp.finish_reason
            if len(tokens) > limit:
                tokens, logprobs, finish = tokens[:limit], logprobs[:limit], "length"
            out.append(Generation(
                text=decode_completion(self.tokenizer, tokens),
                prompt_tokens=len(ids) - comp.prompt_tokens_dropped,
                completion_tokens=len(tokens),
                token_ids=list(tokens),
                logprobs=list(logprobs),
                finish_reason=finish,
            ))
        return out


def token_length_fn(tokenizer):
    """The organisation's length function for this tokenizer (observations are fitted with it)."""
    from rlcr.policy.tokenizer import tokenizer_words, words_length

    words = tokenizer_words(tokenizer) if tokenizer.chat_template is None else None
    if words == frozenset():
        return lambda text: len(text) + 1  # the char tokenizer: one token a character, plus <bos>
    if words:
        return lambda text: words_length(text, words) + 1  # the words tokenizer, counted in Python
    return lambda text: len(encode(tokenizer, text, bos=False))
