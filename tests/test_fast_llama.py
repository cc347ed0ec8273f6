"""The engine's own Llama forward against the HF model's: same logits, tokens and logprobs, on the
shapes the tiny policy does not exercise (grouped-query attention, scaled rotary, bf16), with weights
changed in place, and the fallback for models it does not cover."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import random  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from rlcr.config import ModelConfig  # noqa: E402
from rlcr.policy.engine import Sampling, sequence_logprobs  # noqa: E402
from rlcr.policy.fast_llama import FastLlama, decode_attention, packs_weights, scripted_decode, unsupported  # noqa: E402
from rlcr.policy.tokenizer import build_char_tokenizer  # noqa: E402
from rlcr.policy.torch_engine import TorchEngine  # noqa: E402
from tests.helpers import varied_tiny, vary  # noqa: E402
from tests.test_torch_engine import greedy_by_recompute, prompts  # noqa: E402

CTX = 96
TOL = 1e-5


def llama(**over):
    """A random Llama with the char tokenizer's vocabulary; `over` changes its config."""
    tok = build_char_tokenizer(model_max_length=CTX)
    kw = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=4, max_position_embeddings=CTX, bos_token_id=tok.bos_token_id,
              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    return vary(LlamaForCausalLM(LlamaConfig(**{**kw, **over})), 0), tok


SHAPES = {
    "tiny policy": lambda: varied_tiny(ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                                                   context=CTX), 0),
    "grouped-query attention": lambda: llama(num_key_value_heads=2),
    "linear rotary scaling, untied head": lambda: llama(
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}, tie_word_embeddings=False),
    "head_dim != hidden / heads": lambda: llama(head_dim=32),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_logits_equal_the_hf_forward_for_a_left_padded_batch(shape):
    model, tok = SHAPES[shape]()
    assert unsupported(model) is None
    ps = prompts(5, seed=1, lo=3, hi=30)
    engine = TorchEngine(model, tok, context=CTX)
    assert engine.fast is not None
    s = Sampling(temperature=1.0, max_new_tokens=12, ignore_eos=True, seed=3)
    for p, c in zip(ps, engine.generate(ps, s), strict=True):
        assert (sequence_logprobs(model, p, c.token_ids) - torch.tensor(c.logprobs)).abs().max() < TOL
    greedy = engine.generate(ps, Sampling(temperature=0, max_new_tokens=12, ignore_eos=True))
    assert [c.token_ids for c in greedy] == [greedy_by_recompute(model, p, 12) for p in ps]


def test_fast_and_hf_forward_sample_the_same_tokens():
    model, tok = SHAPES["tiny policy"]()
    ps = prompts(12, seed=2)
    s = Sampling(temperature=1.0, max_new_tokens=20, stop=("\n",), seed=5)
    fast = TorchEngine(model, tok, context=CTX, prefill_tokens=64).generate(ps, s)
    slow_engine = TorchEngine(model, tok, context=CTX, prefill_tokens=64, fast_forward=False)
    assert slow_engine.fast is None
    slow = slow_engine.generate(ps, s)
    assert [c.token_ids for c in fast] == [c.token_ids for c in slow]
    assert [c.finish_reason for c in fast] == [c.finish_reason for c in slow]
    assert max(abs(a - b) for f, h in zip(fast, slow, strict=True) for a, b in zip(f.logprobs, h.logprobs, strict=True)) < TOL


def test_an_in_place_weight_change_reaches_the_fused_copies():
    model, tok = SHAPES["tiny policy"]()
    engine = TorchEngine(model, tok, context=CTX)
    ps = prompts(4, seed=3)
    s = Sampling(temperature=0, max_new_tokens=10, ignore_eos=True)
    before = [c.token_ids for c in engine.generate(ps, s)]
    with torch.no_grad():  # what an optimiser step does to a shared model: q/k/v and gate/up included
        for layer in model.model.layers:
            layer.self_attn.k_proj.weight.mul_(-1.5)
            layer.mlp.up_proj.weight.add_(0.3)
    after = [c.token_ids for c in engine.generate(ps, s)]
    assert after == [greedy_by_recompute(model, p, 10) for p in ps]
    assert after != before


@pytest.mark.skipif(not packs_weights(torch.zeros(1, dtype=torch.bfloat16)), reason="no oneDNN bf16 kernels on this CPU")
def test_bfloat16_packed_weights_give_the_bits_of_f_linear_and_follow_weight_changes():
    model, tok = SHAPES["tiny policy"]()
    model = model.to(torch.bfloat16)
    ps = prompts(6, seed=6)
    s = Sampling(temperature=1.0, max_new_tokens=12, ignore_eos=True, seed=2)
    packed = TorchEngine(model, tok, dtype="bfloat16", context=CTX)
    plain = TorchEngine(model, tok, dtype="bfloat16", context=CTX)
    plain.fast = FastLlama(plain.model, pack=False)  # F.linear on plain matrices
    assert packed.fast.packed and not plain.fast.packed
    assert packed.generate(ps, s) == plain.generate(ps, s)
    greedy = Sampling(temperature=0, max_new_tokens=10, ignore_eos=True)
    before = [c.token_ids for c in packed.generate(ps, greedy)]
    with torch.no_grad():  # an optimiser step on the shared model: the packed copies must follow
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(-2.0)
            layer.mlp.down_proj.weight.add_(0.05)
        model.lm_head.weight.mul_(1.5)
    after = [c.token_ids for c in packed.generate(ps, greedy)]
    assert after == [c.token_ids for c in TorchEngine(model, tok, dtype="bfloat16", context=CTX).generate(ps, greedy)]
    assert after != before


def test_bfloat16_fast_forward_tracks_the_hf_forward():
    model, tok = SHAPES["tiny policy"]()
    model = model.to(torch.bfloat16)
    ps = prompts(6, seed=4)
    s = Sampling(temperature=1.0, max_new_tokens=10, ignore_eos=True, seed=1)
    fast = TorchEngine(model, tok, dtype="bfloat16", context=CTX).generate(ps, s)
    for p, c in zip(ps, fast, strict=True):
        # the trainer's recompute in bf16: both round at bf16, in different places
        assert (sequence_logprobs(model, p, c.token_ids) - torch.tensor(c.logprobs)).abs().max() < 0.1


def test_bf16_decode_step_compiled_by_torchscript_gives_the_bits_of_the_python_step():
    """The decode step TorchScript runs (`scripted_decode`) against `decode_layers` run as plain Python: the
    same tokens and logprobs to the bit, with a shared head (head_once) and without, row groups included."""
    assert scripted_decode() is not None
    model, tok = SHAPES["grouped-query attention"]()
    model = model.to(torch.bfloat16)
    rng = random.Random(5)
    head = [1] + [rng.randrange(4, 60) for _ in range(20)]
    ps = [head + [rng.randrange(4, 60) for _ in range(rng.randint(1, 12))] for _ in range(18)]
    s = Sampling(temperature=1.0, max_new_tokens=14, ignore_eos=True, seed=7)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for kw in (dict(head_once=False), dict(head_once=True, shared_prefill=True), dict(row_threads=2, shared_prefill=True)):
            scripted = TorchEngine(model, tok, dtype="bfloat16", context=CTX, **kw)
            plain = TorchEngine(model, tok, dtype="bfloat16", context=CTX, **kw)
            plain.fast = FastLlama(plain.model, script=False)
            assert scripted.fast.script and not plain.fast.script
            for _ in range(2):  # the second call reads the first one's sequences from the prefix cache
                assert scripted.generate(ps, s) == plain.generate(ps, s)
    finally:
        torch.set_num_threads(threads)


def test_bf16_decode_attention_reads_the_whole_buffer_and_ignores_columns_past_the_mask():
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    b, heads, kv_heads, d, cap, n = 3, 6, 2, 16, 40, 29
    scale = d**-0.5
    kbuf, vbuf = torch.randn(b, kv_heads, cap, d, generator=g), torch.randn(b, kv_heads, cap, d, generator=g)
    kbuf[:, :, n:], vbuf[:, :, n:] = 1e4, -1e4  # stale columns the engine allocated but has not written yet
    query = torch.randn(b, heads, 1, d, generator=g)
    mask = torch.rand(b, 1, 1, n, generator=g) > 0.3
    mask[..., -1] = True  # a row's own new key
    ref = F.scaled_dot_product_attention(query, kbuf[:, :, :n], vbuf[:, :, :n], attn_mask=mask, scale=scale,
                                         enable_gqa=True)
    blocked = FastLlama.decode_blocked(mask, cap)
    got = decode_attention(query.bfloat16(), kbuf.bfloat16(), vbuf.bfloat16(), blocked, scale, None, None)
    assert got.dtype == torch.bfloat16
    assert float((got.float() - ref).abs().max()) < 0.05  # bf16 rounding of inputs and weights
    assert float((decode_attention(query, kbuf, vbuf, blocked, scale, None, None) - ref).abs().max()) < 1e-5  # the same law


def test_decode_attention_with_a_shared_head_is_attention_over_the_head_then_the_row():
    """The call's shared head (kv_heads, m, d), attended once for all rows, gives what SDPA gives over each
    row's keys with the head put in front of them, grouped-query attention included."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(1)
    b, heads, kv_heads, d, cap, n, head = 5, 6, 2, 16, 40, 29, 23
    scale = d**-0.5
    hk, hv = torch.randn(kv_heads, head, d, generator=g), torch.randn(kv_heads, head, d, generator=g)
    kbuf, vbuf = torch.randn(b, kv_heads, cap, d, generator=g), torch.randn(b, kv_heads, cap, d, generator=g)
    kbuf[:, :, n:], vbuf[:, :, n:] = 1e4, -1e4  # columns not written yet
    query = torch.randn(b, heads, 1, d, generator=g)
    mask = torch.rand(b, 1, 1, n, generator=g) > 0.3
    mask[..., -1] = True
    keys = torch.cat([hk.expand(b, -1, -1, -1), kbuf[:, :, :n]], 2)
    values = torch.cat([hv.expand(b, -1, -1, -1), vbuf[:, :, :n]], 2)
    ref = F.scaled_dot_product_attention(query, keys, values, scale=scale, enable_gqa=True,
                                         attn_mask=torch.cat([torch.ones(b, 1, 1, head, dtype=torch.bool), mask], -1))
    blocked = FastLlama.decode_blocked(mask, cap)
    assert float((decode_attention(query, kbuf, vbuf, blocked, scale, hk, hv) - ref).abs().max()) < 1e-5
    got = decode_attention(query.bfloat16(), kbuf.bfloat16(), vbuf.bfloat16(), blocked, scale, hk.bfloat16(),
                           hv.bfloat16())
    assert got.dtype == torch.bfloat16 and float((got.float() - ref).abs().max()) < 0.05


def test_models_it_does_not_cover_run_the_hf_forward():
    tok = build_char_tokenizer(model_max_length=CTX)
    torch.manual_seed(0)
    qwen = vary(Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=CTX, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)), 0)
    assert "qwen2" in unsupported(qwen)
    with pytest.raises(ValueError, match="cannot run this model: model_type 'qwen2'"):
        FastLlama(qwen)
    engine = TorchEngine(qwen, tok, context=CTX)
    assert engine.fast is None
    ps = prompts(4, seed=5)
    out = engine.generate(ps, Sampling(temperature=0, max_new_tokens=8, ignore_eos=True))
    assert [c.token_ids for c in out] == [greedy_by_recompute(qwen, p, 8) for p in ps]
    biased, _ = llama(attention_bias=True, mlp_bias=True)
    assert unsupported(biased) == "attention_bias, mlp_bias"
