"""The engine's own forward pass for Llama-family models (the tiny policy, SmolLM2, Llama/Mistral-style
GPU folders): the same arithmetic as `LlamaForCausalLM.forward`, with fewer and larger operations.

Why: a decode step of the default tiny model (4 layers, 64 rows) is ~10 ms of small operations, so
their count matters. This pass runs q/k/v as one matmul and gate/up as one (measured on 2 cores,
64 rows: 150 vs 291 us and 160 vs 250 us per layer), a fused RMSNorm, rotary tables gathered once per
call, and SDPA with the engine's boolean mask as is; it skips HF's mask preparation, output
capturing and cache bookkeeping. benchmarks/rollout_throughput.py (64 company episodes of the tiny
model, prefix cache on, medians of interleaved repetitions), generated tokens/s, HF forward -> this:
bootstrap policy 796 -> 1056 (1.33x), RL-trained policy 649 -> 774 (1.19x), random-init policy
(every episode runs all 12 rounds) 2647 -> 2948 (1.11x); the sampled tokens are the same.

Exactness: fp32 results equal HF's within float rounding (tests: logits within 1e-5, same greedy
tokens); fused matmuls only change the order in which BLAS blocks its work. In bf16/fp16 RMSNorm
runs in fp32 and casts back before the weight, as HF's LlamaRMSNorm does.

Weights: the fused q/k/v and gate/up matrices are copies, rebuilt by `refresh()`; the engine calls
it whenever the model's weights change (load_state_dict, or an in-place step, seen through the
parameters' version counters). Every other weight is read from the model itself, except in bf16 on a
CPU with oneDNN's bf16 kernels: there every matrix is a copy in oneDNN's packed layout
(`torch.ops.mkldnn._reorder_linear_weight`, multiplied by `_linear_pointwise`, as torch inductor's
frozen CPU graphs do). The same bits as F.linear; measured on 2 threads at 64 rows (SmolLM2 shapes):
gate/up 0.65 -> 0.58 ms, down 0.43 -> 0.35 ms, the 49152-row LM head 13.5 -> 9.5 ms.

Decode steps in bf16/fp16 run compiled by TorchScript (`decode_layers`, `scripted_decode`): the engine's
row groups are Python threads, and an eager step's ~1,400 small operations each took the GIL back in
between, so two groups stepping at once slowed each other by ~25%; the compiled step runs without it.
Prefill, fp32 (the tiny policy's bits) and anything TorchScript cannot compile run eagerly, through the
same functions.

Covers: `model_type` llama or mistral without sliding windows, SiLU MLP, no q/k/v/o or MLP bias,
any rotary scaling the model's own rotary module implements (cos/sin come from it), grouped-query
attention. Anything else (`unsupported()` says why) runs through the model's own forward.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

SUPPORTED_TYPES = ("llama", "mistral")


def packs_weights(weight: torch.Tensor) -> bool:
    """Whether FastLlama multiplies by oneDNN-packed copies of `weight`'s kind: bf16 on a CPU whose oneDNN
    has bf16 kernels (AVX-512 BF16 or AMX); fp32 (the tiny policy's bits) and CUDA keep F.linear."""
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def unsupported(model) -> str | None:
    """Why `FastLlama` cannot run this model, or None when it can."""
    cfg = model.config
    if cfg.model_type not in SUPPORTED_TYPES:
        return f"model_type {cfg.model_type!r} (supported: {', '.join(SUPPORTED_TYPES)})"
    checks = {
        "hidden_act is not silu": getattr(cfg, "hidden_act", "silu") != "silu",
        "attention_bias": bool(getattr(cfg, "attention_bias", False)),
        "mlp_bias": bool(getattr(cfg, "mlp_bias", False)),
        "pretraining_tp > 1": getattr(cfg, "pretraining_tp", 1) != 1,
        "sliding_window": bool(getattr(cfg, "sliding_window", None)),
    }
    bad = [name for name, hit in checks.items() if hit]
    return ", ".join(bad) if bad else None


# The operations below are plain functions in TorchScript's subset: the eager forward calls them as they
# are, and a bf16/fp16 decode step runs `decode_layers` compiled by TorchScript (`scripted_decode`).


def linear(x: Tensor, weight: Tensor, packed: bool) -> Tensor:
    """x @ weight.T; `packed`: weight is a oneDNN-packed copy (`packs_weights`)."""
    if packed:
        no_scalars = torch.jit.annotate(list[float | int | complex | None], [])
        return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", no_scalars, "")
    return F.linear(x, weight)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """HF's LlamaRMSNorm: in bf16/fp16 normalised in fp32 and cast back before the weight."""
    if x.dtype == torch.float32:
        return torch.rms_norm(x, [x.shape[-1]], weight, eps)
    return weight * torch.rms_norm(x.float(), [x.shape[-1]], None, eps).to(x.dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat((-x2, x1), -1) * sin


def qkv_rotated(x: Tensor, norm: Tensor, w_qkv: Tensor, cos: Tensor, sin: Tensor, heads: int, kv_heads: int,
                head_dim: int, eps: float, packed: bool) -> tuple[Tensor, Tensor, Tensor]:
    """A layer's queries (b, heads, q, d) and keys (b, kv_heads, q, d), rotated, and values, from x (b, q, hidden)."""
    b, q = x.shape[0], x.shape[1]
    qkv = linear(rms_norm(x, norm, eps), w_qkv, packed).view(b, q, heads + 2 * kv_heads, head_dim).transpose(1, 2)
    return (rotate(qkv[:, :heads], cos, sin), rotate(qkv[:, heads : heads + kv_heads], cos, sin),
            qkv[:, heads + kv_heads :])


def attention_out_and_mlp(x: Tensor, o: Tensor, w_o: Tensor, norm: Tensor, w_gu: Tensor, w_down: Tensor, inter: int,
                          eps: float, packed: bool) -> Tensor:
    """The rest of a layer from its attention's output o (b, heads, q, d): projection, residual, SwiGLU MLP."""
    b, q = x.shape[0], x.shape[1]
    x = x + linear(o.transpose(1, 2).reshape(b, q, o.shape[1] * o.shape[3]), w_o, packed)
    gate, up = linear(rms_norm(x, norm, eps), w_gu, packed).split(inter, -1)
    return x + linear(F.silu(gate) * up, w_down, packed)


def decode_attention(query: Tensor, kbuf: Tensor, vbuf: Tensor, blocked: Tensor, scale: float,
                     head_k: Tensor | None, head_v: Tensor | None) -> Tensor:
    """Attention of one query per row (a decode step) in bf16/fp16, on the cache's whole buffers.

    query (b, heads, 1, d); kbuf, vbuf (b, kv_heads, capacity, d) contiguous (every column the
    engine allocated: the written ones, then zeros or stale rows that `blocked` covers, so they
    get weight exactly 0); blocked (b, 1, 1, capacity) from `decode_blocked` -> (b, heads, 1, d).
    Two batched matmuls per key/value head over its group of query heads (the keys transposed in
    place: no copy), scores in the model's dtype, scaled, masked and softmaxed in fp32 along their
    last, contiguous dimension. Why: torch's CPU SDPA kernel in bf16 is slower than its fp32 one (b
    16, 9 heads on 3 kv heads, 1000 keys, 2 threads: 11.1 vs 3.9 ms), and a batched matmul on the
    cache's strided window copies it first; the whole buffer is one packed batch. Scores laid out
    (group, capacity) rather than (capacity, group): softmax over a strided dimension took 0.62 ms
    against 0.14 (b 64, 3 kv heads, 460 keys), the whole layer 3.40 -> 2.37 ms, the same values.
    fp32 keeps SDPA (the tiny policy's bits). (Reading only the written columns, a window of the
    buffers, was measured too: the batched matmuls copy such windows first, 0.6 ms a layer at 30 rows.)

    head_k, head_v: keys and values (kv_heads, m, d) every row attends to before its own buffer (the
    call's shared head, stored once: `_SlotCache.set_head`), or None and None. Its scores are one
    matmul per key/value head over all rows' queries (the head's keys read once, not once a row),
    softmaxed together with the row's own. TorchScript compiles it inside `decode_layers` (`_script`)."""
    b, h, d = query.shape[0], query.shape[1], query.shape[3]
    kvh, cap = kbuf.shape[1], kbuf.shape[2]
    g = h // kvh
    keys, values = kbuf.view(b * kvh, cap, d), vbuf.view(b * kvh, cap, d)
    scores = torch.bmm(query.reshape(b * kvh, g, d), keys.transpose(1, 2))  # (b kv_heads, group, cap)
    scores = scores.view(b, kvh, g, cap).float().mul_(scale).masked_fill_(blocked, float("-inf"))
    if head_k is None or head_v is None:
        weights = torch.softmax(scores, -1).to(query.dtype).view(b * kvh, g, cap)
        return torch.bmm(weights, values).view(b, h, 1, d)
    m = head_k.shape[1]
    per_kv = query.reshape(b, kvh, g, d).transpose(0, 1).reshape(kvh, b * g, d)  # every row's queries of a kv head
    shared = torch.bmm(per_kv, head_k.transpose(1, 2)).view(kvh, b, g, m).transpose(0, 1).float().mul_(scale)
    weights = torch.softmax(torch.cat([shared, scores], -1), -1).to(query.dtype)  # (b, kv_heads, group, m + cap)
    out = torch.bmm(weights[:, :, :, m:].reshape(b * kvh, g, cap), values).view(b, kvh, g, d)
    out += torch.bmm(weights[:, :, :, :m].transpose(0, 1).reshape(kvh, b * g, m), head_v).view(kvh, b, g, d).transpose(0, 1)
    return out.view(b, h, 1, d)


def decode_layers(x: Tensor, cos: Tensor, sin: Tensor, blocked: Tensor, norms: list[Tensor], weights: list[Tensor],
                  kbufs: list[Tensor], vbufs: list[Tensor], head_k: list[Tensor], head_v: list[Tensor], write_at: int,
                  heads: int, kv_heads: int, head_dim: int, inter: int, eps: float, scale: float, packed: bool,
                  final_norm: Tensor, lm_head: Tensor) -> Tensor:
    """One bf16/fp16 decode step through every layer: x (b, 1, hidden) -> logits (b, vocab). Layer i reads
    norms[2i], norms[2i+1] and weights[4i: 4i+4] (q/k/v, o, gate/up, down); writes its key/value at column
    `write_at` of kbufs[i]/vbufs[i] (b, kv_heads, capacity, d) and attends on the whole buffers (`blocked`),
    after head_k[i]/head_v[i] when the call has a shared head (else the lists are empty)."""
    for i in range(len(kbufs)):
        query, key, value = qkv_rotated(x, norms[2 * i], weights[4 * i], cos, sin, heads, kv_heads, head_dim, eps, packed)
        kbufs[i][:, :, write_at : write_at + 1] = key
        vbufs[i][:, :, write_at : write_at + 1] = value
        hk: Tensor | None = head_k[i] if len(head_k) > 0 else None
        hv: Tensor | None = head_v[i] if len(head_v) > 0 else None
        o = decode_attention(query, kbufs[i], vbufs[i], blocked, scale, hk, hv)
        x = attention_out_and_mlp(x, o, weights[4 * i + 1], norms[2 * i + 1], weights[4 * i + 2], weights[4 * i + 3],
                                  inter, eps, packed)
    return linear(rms_norm(x[:, -1], final_norm, eps), lm_head, packed)


def _script(fn):
    """`fn` compiled by TorchScript, or None (with a warning) where it cannot be: then the eager step runs.
    Compiled when this module is imported (~0.02 s), because TorchScript reads the function's source
    file: compiled later, an edit of this file in between would compile other source than the one loaded.
    `torch.jit.script` is deprecated since torch 2.13 (its DeprecationWarning is silenced here); the torch
    engine's tests check that the decode step compiled (test_fast_llama.py).

    Why TorchScript for the decode step: it is ~1,400 small operations, and between two of them Python holds
    the GIL, so the row groups' threads (`TorchEngine(row_threads=)`) waited on each other: one group's step
    of 32 rows (SmolLM2 bf16, 1 thread) took ~83 ms alone and ~104 ms with a second group stepping in another
    thread, but ~86 ms beside a second process. Compiled, the step runs in C++ without the GIL: ~77 ms
    alone and ~73 ms each with two threads, the same bits. (`torch.compile` of its parts was slower than
    eager: README, "Benchmarks".)"""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit.script's deprecation notice
            return torch.jit.script(fn)
    except Exception as err:  # noqa: BLE001 (any compile failure: the eager step does the same work)
        warnings.warn(f"TorchScript could not compile {fn.__name__}; it runs eagerly: {err}", stacklevel=2)
        return None


_SCRIPTED_DECODE = _script(decode_layers)


def scripted_decode():
    """`decode_layers` as compiled by TorchScript at import, or None where it could not be."""
    return _SCRIPTED_DECODE


class FastLlama:
    """forward(ids, positions, mask, cache) -> logits of each row's last position, (b, vocab)."""

    def __init__(self, model, pack: bool = True, script: bool = True):
        """pack=False keeps F.linear on plain matrices even where `packs_weights` holds (a reference);
        script=False runs the bf16/fp16 decode step as plain Python (`decode_layers` itself, a reference)."""
        why = unsupported(model)
        if why:
            raise ValueError(f"FastLlama cannot run this model: {why}")
        cfg = model.config
        self.model = model
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        self.inter = cfg.intermediate_size
        self.scale = model.model.layers[0].self_attn.scaling
        self.gqa = self.kv_heads != self.heads
        self.cos = self.sin = None
        self.pack, self.script = pack, script
        self.refresh()

    @torch.inference_mode()
    def refresh(self) -> None:
        """Rebuild the fused matrices and rotary tables from the model's current weights and device."""
        body = self.model.model
        w = body.embed_tokens.weight
        self.packed = self.pack and packs_weights(w)
        prep = torch.ops.mkldnn._reorder_linear_weight if self.packed else (lambda t: t)
        self.weights = []  # per layer: q/k/v, o, gate/up, down, as F.linear or the packed kernel takes them
        for layer in body.layers:
            a, m = layer.self_attn, layer.mlp
            self.weights.append((prep(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])),
                                 prep(a.o_proj.weight), prep(torch.cat([m.gate_proj.weight, m.up_proj.weight])),
                                 prep(m.down_proj.weight)))
        self.head = prep(self.model.lm_head.weight)
        self.norms = [w for layer in body.layers for w in (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)]
        self.flat = [w for ws in self.weights for w in ws]  # decode_layers' order: per layer q/k/v, o, gate/up, down
        positions = torch.arange(self.model.config.max_position_embeddings, device=w.device)[None]
        cos, sin = body.rotary_emb(w[:1], positions)  # (1, P, head_dim) in the model's dtype
        self.cos, self.sin = cos[0], sin[0]

    @staticmethod
    def decode_blocked(mask: torch.Tensor, capacity: int) -> torch.Tensor:
        """A decode step's mask (b, 1, 1, kv <= capacity), True = may attend, over the cache's whole
        buffers: (b, 1, 1, capacity), True = blocked (every column past kv included). Built once a step,
        shared by every layer."""
        b, n = mask.shape[0], mask.shape[-1]
        blocked = torch.ones(b, capacity, dtype=torch.bool, device=mask.device)
        blocked[:, :n] = ~mask.view(b, n)
        return blocked.view(b, 1, 1, capacity)

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
        """ids, positions: (b, q); mask: (b, 1, q, kv) bool, True = may attend; cache: the engine's
        slot cache, whose layers store this call's keys/values and return the window to attend to (after
        the shared head, when the cache has one: every query attends to it, `mask` covers the window)."""
        body = self.model.model
        b, q = ids.shape
        h, kvh, d = self.heads, self.kv_heads, self.head_dim
        x = body.embed_tokens.weight[ids]  # (b, q, hidden)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # (b, 1, q, d)
        if q == 1 and x.dtype != torch.float32:  # bf16/fp16 decode: every layer attends on its whole buffers
            wholes = [slot.whole() for slot in cache.layers]
            if all(w is not None for w in wholes):
                return self._decode(x, cos, sin, self.decode_blocked(mask, wholes[0][0].shape[2]), wholes, cache)
        if cache.layers[0].head is not None:  # the shared head's columns come first, open to every query
            mask = torch.cat([mask.new_ones(b, 1, q, cache.layers[0].head[0].shape[1]), mask], -1)
        for layer, (w_qkv, w_o, w_gu, w_down), slot in zip(body.layers, self.weights, cache.layers, strict=True):
            query, key, value = qkv_rotated(x, layer.input_layernorm.weight, w_qkv, cos, sin, h, kvh, d, self.eps,
                                            self.packed)
            k, v = slot.update(key, value)
            if slot.head is not None:
                k = torch.cat([slot.head[0].expand(b, -1, -1, -1), k], 2)
                v = torch.cat([slot.head[1].expand(b, -1, -1, -1), v], 2)
            o = F.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=self.scale, enable_gqa=self.gqa)
            x = attention_out_and_mlp(x, o, w_o, layer.post_attention_layernorm.weight, w_gu, w_down, self.inter,
                                      self.eps, self.packed)
        return linear(rms_norm(x[:, -1], body.norm.weight, self.eps), self.head, self.packed)

    def _decode(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, blocked: torch.Tensor,
                wholes: list[tuple[torch.Tensor, torch.Tensor]], cache) -> torch.Tensor:
        """A bf16/fp16 decode step through `decode_layers`, compiled by TorchScript unless script=False."""
        heads = [slot.head for slot in cache.layers if slot.head is not None]
        step = (scripted_decode() if self.script else None) or decode_layers
        return step(x, cos, sin, blocked, self.norms, self.flat, [k for k, _ in wholes], [v for _, v in wholes],
                    [k for k, _ in heads], [v for _, v in heads], cache.layers[0].write_at, self.heads, self.kv_heads,
                    self.head_dim, self.inter, self.eps, self.scale, self.packed, self.model.model.norm.weight, self.head)
