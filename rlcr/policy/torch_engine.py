"""Batched KV-cached decoding in plain torch: all prompts of all agents of all episodes at once.

How it works:
- Prefix reuse: the engine keeps the KV of the sequences it ran (prompt + the completion tokens fed
  back), bounded by `prefix_cache_bytes`, LRU (rlcr/policy/prefix_cache.py). A prompt that starts
  with a stored sequence gets that KV copied in and prefills only the rest: an agent's successive
  observations share their head (identity, task, actions; the per-round status line comes last),
  so ~90% of the prompt tokens of an episode's later rounds are not recomputed. The cache is
  cleared when the weights change (`load_state_dict`, or any in-place change of a parameter).
- Shared heads (`shared_prefill=True`): prompts of one call that share a head the cache does not
  hold yet (every agent's first observation starts with the same protocol text) have it run once
  and stored first (`prefix_cache.shared_heads`), then read it like any stored prefix. Off by
  default: the reused keys/values come from another batch shape, so outputs move within float
  rounding (see Determinism), and the default tiny pipeline's committed bits stay as they are.
- A head attended once (`head_once`, on by default in bf16/fp16): when every prompt of a call (of a row
  group) opens with the same tokens that every prompt's cache hit holds, at least MIN_HEAD_TOKENS of
  them, their keys/values are kept once for the call (`_SlotCache.set_head`), each row's buffer holds
  only what follows, and every query attends to the head first: in a decode step one matmul per
  key/value head over all rows' queries reads the head's keys once instead of once a row
  (rlcr/policy/fast_llama.py). The smollm2 company's observations open with a ~350-token system
  prompt: 92% of a decode row's keys were its call's common head (64 episodes). Sequences stored in the
  prefix cache are whole (head + row), but in two parts: the head's one tensor, held by every row's
  entry, and a copy of the row's own columns (copying the head for each row took ~16 ms a row). Off by
  default in fp32, so the tiny pipeline's committed bits do not move; the same tokens and logprobs within
  float rounding where it is on.
- Prompts are sorted by fresh (not reused) tokens and prefilled in chunks of about `prefill_tokens`
  tokens; a chunk's rows all run their last `width` columns (the chunk's most fresh tokens), so a
  row with fewer fresh tokens recomputes a few cached ones (or pads, if shorter). With
  `planned_chunks` (on by default in bf16/fp16) the chunks are the plan of least modelled cost
  (`prefill_chunks`), so one long row does not pad many short ones to its width. Rows sit
  right-aligned in one preallocated KV cache of shape (B, heads, L + max_new_tokens, head_dim) per
  layer, L the longest prompt.
- Decoding feeds one token per active row per step; new keys/values are written in place (no
  `torch.cat` of the whole cache per step as in HF's DynamicCache). We pass our own 4-D boolean
  attention mask and per-row position ids, so left padding is invisible to the model.
- Llama-family models run through our own forward (rlcr/policy/fast_llama.py: fused q/k/v and
  gate/up matmuls, fewer small operations; same results within float rounding); other models, or
  `fast_forward=False`, run the HF model's forward with the same cache and mask.
- Row groups (`row_threads=n`, off at 1; CPU only): a call of at least 8n prompts runs as n groups of
  them at once, each the whole call's work (prefill, decode, sampling) on its own cache, one Python
  thread each at one intra-op thread (never more groups than the process's torch threads). Why: under
  OMP_WAIT_POLICY=PASSIVE (rlcr/env.py) torch's OpenMP workers sleep after every parallel operation and
  waking them costs ~0.1-0.3 ms, and a decode step of a 30-layer model has ~450 operations, most of them
  small; threads that each own a group never wait for one another. The prompts are sorted by length
  and cut where the costliest group is cheapest (`cut_groups`), so each group pads to its own longest
  and the group of the long prompts takes fewer of them. Each group computes its rows as a smaller
  batch would (same values within float rounding) and samples with a seed of its own; deterministic for
  the same calls at the same thread count.
- Stop detection runs on token ids, vectorised over the batch: a vocabulary mask of tokens that end
  a completion (eos, stop ids, any token whose text contains a stop string) plus a comparison of
  the last k tokens with each stop string's token sequence. Finished rows are dropped from the
  batch (the cache is compacted) once they are an eighth of it, so short answers stop costing.
- Sampling uses one torch.Generator seeded per call (per row group), and rows draw in the caller's
  order, so what a prompt samples does not depend on how cache hits reorder the batch.

Determinism: the same engine state (a fresh engine, or the same sequence of calls since it was
built or its weights changed) + the same prompts + the same Sampling -> bit-identical outputs.
With another cache state the same call gives the same tokens and logprobs equal up to float
rounding (~1e-6 in fp32: reused keys/values were computed in another batch shape, which already
holds without reuse for a prompt alone vs in a batch); a sampled token could only differ if its
uniform draw fell within that rounding of a boundary of the sampling law.

Context: a row never sees more than `context` tokens (min of the model's max_position_embeddings
and the `context` cap). A prompt longer than context - max_new_tokens loses its left part (the end,
i.e. the latest text, is kept; `prompt_tokens_dropped` says how much). If max_new_tokens itself
does not fit, the row ends with finish_reason "context" when the window is full.

Does not cover: a stop string that the model spells with a token split different from the
tokenizer's own split of that string and that no single token contains (e.g. BPE "x\\n" + "\\n"
against stop "\\n\\n"); with the character tokenizer every stop string is caught. Sharing KV
memory between cached sequences with a common prefix (each stores its own copy).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, DynamicLayer

from rlcr.config import EngineConfig
from rlcr.policy.engine import Completion, Sampling, pad_token_id
from rlcr.policy.fast_llama import FastLlama, unsupported
from rlcr.policy.models import DTYPES, load_policy
from rlcr.policy.prefix_cache import PrefixCache, common_prefix_length, kv_span, kv_take, shared_heads

_RUNNING, _STOP, _LENGTH, _CONTEXT = 0, 1, 2, 3
MIN_SHARE_ROWS = 8  # row_threads: a call splits only into row groups of at least this many prompts
MIN_HEAD_TOKENS = 16  # a call's rows attend to their common cached head once (bf16/fp16) from this length on
# planned prefill chunks: a forward's fixed cost in prefilled tokens (SmolLM2 bf16, one thread: a chunk takes
# ~30 ms + ~0.65 ms a token, measured at 1-32 rows x 16-128 tokens)
CHUNK_OVERHEAD_TOKENS = 48
# row groups: a row's work besides its attention, in attended columns (`cut_groups`), fitted on 64 smollm2
# company episodes in bf16 at 2 row threads: at 24 the group given the most rows ran ~1.4 s longer a call,
# with equal rows the group of the longest prompts ~1.6 s longer, at 64 the two within ~0.5 s
ROW_COLUMNS = 64
_REASONS = {_STOP: "stop", _LENGTH: "length", _CONTEXT: "context"}


class _SlotLayer(DynamicLayer):
    """One layer's preallocated K/V; the engine sets which rows/columns a forward reads and writes."""

    def __init__(self, kbuf: torch.Tensor, vbuf: torch.Tensor):
        super().__init__()
        self.kbuf, self.vbuf = kbuf, vbuf  # (B, kv_heads, capacity, head_dim)
        self.dtype, self.device, self.is_initialized = kbuf.dtype, kbuf.device, True
        self.rows, self.read_from, self.write_at = slice(0, kbuf.shape[0]), 0, 0
        self.head: tuple[torch.Tensor, torch.Tensor] | None = None  # the call's shared head, (kv_heads, n, head_dim) each

    def update(self, key_states, value_states, *args, **kwargs):
        end = self.write_at + key_states.shape[-2]
        self.kbuf[self.rows, :, self.write_at : end] = key_states
        self.vbuf[self.rows, :, self.write_at : end] = value_states
        self.keys = self.kbuf[self.rows, :, self.read_from : end]
        self.values = self.vbuf[self.rows, :, self.read_from : end]
        return self.keys, self.values

    def whole(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The window's rows of the K/V buffers at every allocated column, when the window reads from
        column 0 (a decode step): (b, kv_heads, capacity, head_dim) each, contiguous; else None."""
        if self.read_from != 0:
            return None
        k, v = self.kbuf[self.rows], self.vbuf[self.rows]
        return (k, v) if k.is_contiguous() and v.is_contiguous() else None

    def get_seq_length(self) -> int:
        return self.write_at

    def keep_rows(self, index: torch.Tensor) -> None:
        self.kbuf, self.vbuf = self.kbuf[index], self.vbuf[index]


class _SlotCache(Cache):
    def __init__(self, num_layers: int, batch: int, capacity: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (batch, kv_heads, capacity, head_dim)
        super().__init__(layers=[
            _SlotLayer(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(num_layers)
        ])
        self.head_tokens: list[int] = []
        self.head_kv: torch.Tensor | None = None

    def set_head(self, tokens: list[int], kv: torch.Tensor) -> None:
        """Keys/values of a head that every row's prompt starts with (kv: layers, 2, kv_heads, n, head_dim), kept
        once: each row's buffer then holds only what follows it, and attention reads it first (fast_llama).
        Held as one tensor (not copied when `kv` is contiguous), which `read` hands to every row's entry."""
        self.head_tokens = list(tokens)
        self.head_kv = kv.contiguous()
        for i, layer in enumerate(self.layers):
            layer.head = (self.head_kv[i, 0], self.head_kv[i, 1])

    def set_window(self, rows: slice, read_from: int, write_at: int) -> None:
        for layer in self.layers:
            layer.rows, layer.read_from, layer.write_at = rows, read_from, write_at

    def keep_rows(self, index: torch.Tensor) -> None:
        for layer in self.layers:
            layer.keep_rows(index)

    def read(self, row: int, start: int, end: int) -> tuple[torch.Tensor, ...]:
        """Row `row`'s K/V at columns [start, end) as prefix-cache parts: the shared head's tensor itself (if
        any; every row's entry holds the same one), then a copy of the row's own columns, (layers, 2,
        kv_heads, end - start, head_dim). Why: the head is most of a row's sequence (~350 of ~450 tokens in
        the smollm2 company), and copying it for every row cost ~16 ms a row (64 bf16 episodes: 5.8 s of
        thread time in 360 reads)."""
        k0 = self.layers[0].kbuf
        kv = k0.new_empty(len(self.layers), 2, k0.shape[1], end - start, k0.shape[-1])
        for i, layer in enumerate(self.layers):
            kv[i, 0].copy_(layer.kbuf[row, :, start:end])
            kv[i, 1].copy_(layer.vbuf[row, :, start:end])
        return (kv,) if self.head_kv is None else (self.head_kv, kv)

    def write(self, row: int, start: int, parts: list[torch.Tensor]) -> None:
        """Put consecutive K/V `parts` (each layers, 2, kv_heads, n_i, head_dim; e.g. `kv_span` of a stored
        prefix) at row `row`, from column `start` on."""
        for kv in parts:
            end = start + kv.shape[-2]
            for i, layer in enumerate(self.layers):
                layer.kbuf[row, :, start:end] = kv[i, 0]
                layer.vbuf[row, :, start:end] = kv[i, 1]
            start = end


def prefill_chunks(fresh: list[int], max_tokens: int, overhead: int | None) -> list[tuple[int, int]]:
    """Consecutive row ranges [r0, r1) to prefill together, for rows sorted by fresh tokens, most first; a
    chunk runs every row at its first row's width. overhead None: greedy, as many rows as fit
    `max_tokens` at that width. Else the plan of least cost, a chunk costing `overhead` (a forward's
    fixed cost, in tokens) plus its rows x width, no chunk over `max_tokens` unless one row alone
    (dynamic programming over the cut points: a long row no longer pads many short ones to its width)."""
    n = len(fresh)
    if overhead is None:
        chunks, r0 = [], 0
        while r0 < n:
            r1 = min(n, r0 + max(1, max_tokens // fresh[r0]))
            chunks.append((r0, r1))
            r0 = r1
        return chunks
    best, cut = [0] + [None] * n, [0] * (n + 1)  # best[j]: least cost of rows [0, j); cut[j]: its last chunk's start
    for j in range(1, n + 1):
        for i in range(j - 1, -1, -1):
            if i < j - 1 and (j - i) * fresh[i] > max_tokens:
                break  # fresh[i] only grows as i falls: wider chunks do not fit either
            cost = best[i] + overhead + (j - i) * fresh[i]
            if best[j] is None or cost < best[j]:
                best[j], cut[j] = cost, i
    chunks, j = [], n
    while j > 0:
        chunks.append((cut[j], j))
        j = cut[j]
    return chunks[::-1]


def cut_groups(lengths: list[int], n: int, min_rows: int, extra: int) -> list[int]:
    """Cuts [0, c1, ..., len(lengths)] of rows sorted by length (shortest first) into n consecutive groups of
    at least `min_rows` rows, those whose costliest group is cheapest; a group costs its rows x (its longest
    length + extra): each decode step every row attends over its group's padded buffer (the longest prompt
    and the tokens to generate), and `extra` also holds a row's share of the other per-row work. The groups
    run at once, so the call lasts as long as its costliest group (a step's matmuls cost every group the
    same and leave the cuts as they are). Dynamic programming over the cut points."""
    B, inf = len(lengths), float("inf")
    best = [[inf] * (B + 1) for _ in range(n + 1)]  # best[g][j]: rows [0, j) in g groups, costliest group
    back = [[0] * (B + 1) for _ in range(n + 1)]
    best[0][0] = 0
    for g in range(1, n + 1):
        for j in range(g * min_rows, B + 1):
            for i in range((g - 1) * min_rows, j - min_rows + 1):
                cost = max(best[g - 1][i], (j - i) * (lengths[j - 1] + extra))
                if cost < best[g][j]:
                    best[g][j], back[g][j] = cost, i
    cuts = [B]
    for g in range(n, 0, -1):
        cuts.append(back[g][cuts[-1]])
    return cuts[::-1]


def _group_seed(seed: int, g: int) -> int:
    """The sampling seed of row group g of a call seeded `seed` (group 0 keeps it)."""
    return seed if g == 0 else hash((seed, g)) & 0x7FFF_FFFF_FFFF_FFFF


def _sample(logits: torch.Tensor, sampling: Sampling, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, V) logits -> sampled tokens (B,) and their temperature-1 logprobs (B,)."""
    logits = logits.float()
    logp = torch.log_softmax(logits, -1)  # (B, V) the model's law: what the trainer recomputes
    if sampling.temperature == 0:
        tokens = logits.argmax(-1)
    else:
        z = logits / sampling.temperature if sampling.temperature != 1.0 else logits  # x / 1.0 is x: a pass saved
        if sampling.top_p < 1.0:
            z_sorted, order = z.sort(-1, descending=True)
            p_sorted = torch.softmax(z_sorted, -1)
            # drop tokens once the mass before them already reaches top_p (the first always stays)
            drop = (p_sorted.cumsum(-1) - p_sorted) >= sampling.top_p
            z = torch.full_like(z, float("-inf")).scatter(-1, order, z_sorted.masked_fill(drop, float("-inf")))
        probs = torch.softmax(z, -1)
        if sampling.sampler == "inverse_cdf":
            tokens = inverse_cdf(probs, gen)
        else:
            tokens = torch.multinomial(probs, 1, generator=gen)[:, 0]
    return tokens, logp.gather(-1, tokens[:, None])[:, 0]


def inverse_cdf(probs: torch.Tensor, gen: torch.Generator, block: int = 512) -> torch.Tensor:
    """(B, V) probabilities (rows need not sum to 1) -> one token per row, drawn with P(j) = probs[j] / row sum:
    one uniform u per row, the first index whose running sum (float64) exceeds u * total. An entry of
    probability 0 is never drawn (its running sum equals the one before it, and `right=True` skips ties).

    In two levels, the same draw: the running sum of `block`-entry block sums picks the block, the
    running sum inside that block the entry. A float64 cumsum over a whole 49152-entry row is a
    sequential scan (15 ms at 64 rows on 2 threads); the two levels take 1.3 ms and drew the same tokens
    from the same uniforms (200 x 64 draws)."""
    B, V = probs.shape
    block = min(block, V)
    nb = -(-V // block)
    padded = F.pad(probs, (0, nb * block - V)) if nb * block != V else probs
    blocks = padded.view(B, nb, block)
    ends = blocks.sum(-1, dtype=torch.float64).cumsum(-1)  # (B, nb) running sum at each block's end
    u = torch.rand(B, 1, generator=gen, device=probs.device, dtype=torch.float64) * ends[:, -1:]
    k = torch.searchsorted(ends, u, right=True).clamp_max(nb - 1)  # (B, 1) a block of positive mass
    before = torch.where(k > 0, ends.gather(-1, (k - 1).clamp_min(0)), torch.zeros_like(u))
    inner = blocks.gather(1, k[:, :, None].expand(B, 1, block))[:, 0].double().cumsum(-1)  # (B, block)
    j = torch.searchsorted(inner, u - before, right=True)
    last = (inner < inner[:, -1:]).sum(-1, keepdim=True)  # the block's last positive entry: rounding never passes it
    return (k * block + torch.minimum(j, last))[:, 0]


class TorchEngine:
    """The in-process engine; see the module docstring for how it batches and what it guarantees."""

    def __init__(self, model, tokenizer, device: str = "cpu", dtype: str = "float32",
                 context: int | None = None, prefill_tokens: int | None = None,
                 prefix_cache_bytes: int = 2**30, fast_forward: bool = True, shared_prefill: bool = False,
                 row_threads: int = 1, head_once: bool | None = None, planned_chunks: bool | None = None):
        if model.config._attn_implementation not in ("sdpa", "eager"):
            model.set_attn_implementation("sdpa")  # we pass a 4-D mask, which flash kernels do not take
        self.model = model.to(device=device, dtype=DTYPES[dtype]).eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        max_pos = model.config.max_position_embeddings
        self.context = min(context, max_pos) if context else max_pos
        # tokens per prefill chunk: on CPU, chunks beyond a few thousand tokens only add allocator
        # traffic (measured equal or slower at 8k-32k on 2 cores); a GPU wants big chunks
        self.prefill_tokens = prefill_tokens or (32768 if self.device.type == "cuda" else 4096)
        self.vocab_size = model.get_input_embeddings().weight.shape[0]
        self.pad_id = pad_token_id(tokenizer)
        self._stop_rules: dict[tuple, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        self._token_texts: list[str] | None = None
        # KV of sequences already run, valid only for the weights that computed it; 0 bytes: off.
        # 1 GiB holds ~260k tokens of the default tiny model (4 layers x 2 x 128 floats = 4 KiB a token)
        self.prefix_cache = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        # our own forward for Llama-family models (rlcr/policy/fast_llama.py); others run the HF forward
        self.fast = FastLlama(self.model) if fast_forward and unsupported(self.model) is None else None
        self.shared_prefill = shared_prefill and self.prefix_cache is not None
        # rows attend to their call's common cached head once (`_head_length`); default: bf16/fp16 only
        self.head_once = self.fast is not None and (self.model.dtype != torch.float32 if head_once is None else head_once)
        # prefill chunks of least modelled cost (`prefill_chunks`); default: bf16/fp16 only (fp32: greedy chunks)
        self.planned_chunks = self.model.dtype != torch.float32 if planned_chunks is None else planned_chunks
        if row_threads < 1:
            raise ValueError(f"row_threads must be >= 1, got {row_threads}")
        self.row_threads = row_threads
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        self._weights_version = self._version()
        # totals over calls: prompt tokens, those read from the cache, and tokens run by prefills (shared heads included)
        self.prompt_tokens = self.reused_tokens = self.prefilled_tokens = 0

    @classmethod
    def from_folder(cls, folder: str | Path, device: str = "cpu", dtype: str = "float32",
                    context: int | None = None, **kw) -> TorchEngine:
        model, tok = load_policy(folder, device=device, dtype=dtype)
        return cls(model, tok, device=device, dtype=dtype, context=context, **kw)

    @classmethod
    def from_config(cls, model, tokenizer, cfg: EngineConfig, context: int | None = None,
                    device: str | None = None) -> TorchEngine:
        """The engine `cfg` describes (dtype, shared heads, row threads; its device unless `device`
        names another, a rank's own GPU) serving `model`."""
        return cls(model, tokenizer, device=device or cfg.device, dtype=cfg.dtype, context=context,
                   shared_prefill=cfg.shared_prefill, row_threads=cfg.row_threads)

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Take the trainer's new weights (copied and cast into this engine's device and dtype)."""
        self.model.load_state_dict(state_dict)
        self._weights_changed()

    def _weights_changed(self) -> None:
        """Stored KV and fused weight copies belong to the old weights: drop / rebuild them."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        if self.fast is not None:
            self.fast.refresh()
        self._weights_version = self._version()

    def _version(self) -> int:
        """Grows with every in-place change of any weight (load_state_dict, an optimiser step)."""
        return sum(p._version for p in self.model.parameters())

    # ------------------------------------------------------------------------------------ stop rules

    def _rules(self, sampling: Sampling) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(V,) bool mask of tokens that end a completion, and the multi-token stop sequences."""
        key = (sampling.stop, sampling.stop_token_ids, sampling.ignore_eos)
        if key not in self._stop_rules:
            mask = torch.zeros(self.vocab_size, dtype=torch.bool)
            ids = list(sampling.stop_token_ids)
            eos = self.tokenizer.eos_token_id
            if not sampling.ignore_eos and eos is not None:
                ids.append(eos)
            mask[[i for i in ids if 0 <= i < self.vocab_size]] = True
            seqs = []
            if sampling.stop:
                if self._token_texts is None:
                    special = set(self.tokenizer.all_special_ids)
                    self._token_texts = [
                        "" if i in special else self.tokenizer.decode([i]) for i in range(len(self.tokenizer))
                    ]
                for i, text in enumerate(self._token_texts[: self.vocab_size]):
                    if any(s in text for s in sampling.stop):
                        mask[i] = True
                for s in sampling.stop:
                    seq = self.tokenizer(s, add_special_tokens=False, split_special_tokens=True)["input_ids"]
                    if len(seq) > 1:
                        seqs.append(torch.tensor(seq, device=self.device))
            self._stop_rules[key] = (mask.to(self.device), seqs)
        return self._stop_rules[key]

    # ------------------------------------------------------------------------------------ generation

    @torch.inference_mode()
    def generate(self, prompt_token_ids: list[list[int]], sampling: Sampling) -> list[Completion]:
        """Complete every prompt; returns one Completion per prompt, in order."""
        B = len(prompt_token_ids)
        if B == 0:
            return []
        keep = max(1, self.context - sampling.max_new_tokens)  # prompt tokens kept at most
        prompts, dropped = [], []
        for i, p in enumerate(prompt_token_ids):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty: it needs at least one token (e.g. bos)")
            prompts.append(list(p[-keep:]))
            dropped.append(max(0, len(p) - keep))

        # prefix reuse: each prompt's longest stored prefix; its last token is always run (its logits)
        store = self.prefix_cache
        if self._version() != self._weights_version:  # the weights changed in place
            self._weights_changed()
        if self.shared_prefill and B > 1:
            self._prefill_heads(prompts)
        hits = [store.lookup(p, len(p) - 1) if store is not None else (None, 0) for p in prompts]
        reused = sum(m for _, m in hits)
        self.prompt_tokens += sum(len(p) for p in prompts)
        self.reused_tokens += reused
        self.prefilled_tokens += sum(len(p) for p in prompts) - reused
        self._rules(sampling)  # built here, not by two groups at once

        n = self._groups(B)
        if n == 1:
            done = self._complete(prompts, hits, sampling, None)
        else:
            done = self._complete_groups(prompts, hits, sampling, n)
        return [Completion(t, lp, reason, d) for (t, lp, reason), d in zip(done, dropped, strict=True)]

    def _groups(self, rows: int) -> int:
        """Row groups a call of `rows` prompts runs as (`row_threads`): 1 off CPU, without our own forward,
        at one torch thread, or with fewer than MIN_SHARE_ROWS rows a group."""
        if self.fast is None or self.device.type != "cpu":
            return 1
        return max(1, min(self.row_threads, torch.get_num_threads(), rows // MIN_SHARE_ROWS))

    def _complete_groups(self, prompts: list[list[int]], hits: list, sampling: Sampling,
                         n: int) -> list[tuple[list[int], list[float], str]]:
        """`_complete` on n groups of the prompts at once, one Python thread each at one intra-op thread
        (this one runs the first): the prompts sorted by length and cut where the costliest group is
        cheapest (`cut_groups`), so a group pads its rows to its own longest; group g samples with seed
        (seed, g). The sequences the groups finish are stored in the prefix cache after all of them end,
        group by group (the cache is not touched while they run: the same calls give the same cache)."""
        if self._pool_size < n - 1:
            if self._pool is not None:
                self._pool.shutdown(wait=False)  # idle between calls: its threads end
            self._pool = ThreadPoolExecutor(n - 1, thread_name_prefix="rlcr-rows", initializer=torch.set_num_threads,
                                            initargs=(1,))
            self._pool_size = n - 1
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        head = self._head_length(prompts, hits)  # what each group's rows attend once (when the group shares it too)
        cuts = cut_groups([len(prompts[i]) for i in order], n, MIN_SHARE_ROWS,
                          sampling.max_new_tokens + ROW_COLUMNS - head)
        groups = [order[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
        kept: list[list] = [[] for _ in groups]

        def run_group(g: int) -> list:
            with torch.inference_mode():
                idx = groups[g]
                return self._complete([prompts[i] for i in idx], [hits[i] for i in idx],
                                      replace(sampling, seed=_group_seed(sampling.seed, g)), kept[g])

        futures = [self._pool.submit(run_group, g) for g in range(1, len(groups))]
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            outs = [run_group(0)]
        finally:
            torch.set_num_threads(threads)
        outs += [f.result() for f in futures]
        if self.prefix_cache is not None:
            for part in kept:
                for tokens, kv in part:
                    self.prefix_cache.insert(tokens, kv)
        done: list = [None] * len(prompts)
        for idx, out in zip(groups, outs, strict=True):
            for i, o in zip(idx, out, strict=True):
                done[i] = o
        return done

    def _complete(self, prompts: list[list[int]], hits: list, sampling: Sampling,
                  kept: list | None) -> list[tuple[list[int], list[float], str]]:
        """(tokens, logprobs, finish reason) of each prompt (already clipped to the context), its cache
        hit given; the sequences it finishes go into the prefix cache, or onto `kept` to be stored later."""
        B = len(prompts)
        dev, ctx, max_new = self.device, self.context, sampling.max_new_tokens
        H = self._head_length(prompts, hits)
        head_tokens = prompts[0][:H]
        if H:  # rows hold what follows the head; the head's keys/values are kept once (set_head below)
            prompts = [p[H:] for p in prompts]
        lens = torch.tensor([len(p) for p in prompts])
        L = int(lens.max())
        budget = torch.clamp(ctx - H - lens, max=max_new)  # (B,) tokens each row may generate
        steps = int(budget.max())
        fresh = lens - torch.tensor([m - H for _, m in hits])  # (B,) tokens to prefill

        # left-padded prompt matrix, rows with the most fresh tokens first so prefill chunks pad little
        order = torch.argsort(fresh * (L + 1) + lens, descending=True, stable=True)
        lens_s, fresh_s = lens[order], fresh[order]
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        for r, i in enumerate(order.tolist()):
            ids[r, L - len(prompts[i]) :] = torch.tensor(prompts[i])
        if int(ids.max()) >= self.vocab_size or int(ids.min()) < 0:
            raise ValueError(f"prompt token id outside the vocabulary [0, {self.vocab_size})")
        ids = ids.to(dev)
        cols = torch.arange(L + steps, device=dev)
        start = (L - lens_s).to(dev)  # (B,) first real column of each row
        valid = cols[None, :] >= start[:, None]  # (B, L+steps) real prompt and generated columns
        positions = (cols[None, :] - start[:, None] + H).clamp(0, ctx - 1)  # (B, L+steps)

        cfg = self.model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        cache = _SlotCache(cfg.num_hidden_layers, B, L + steps, getattr(cfg, "num_key_value_heads", None)
                           or cfg.num_attention_heads, head_dim, self.model.dtype, dev)
        if H:
            cache.set_head(head_tokens, kv_take(hits[0][0], 0, H))
        for r, i in enumerate(order.tolist()):
            kv, m = hits[i]
            if m > H:
                cache.write(r, L - len(prompts[i]), kv_span(kv, H, m))
        last_logits = torch.empty(B, self.vocab_size, device=dev)

        # prefill, chunk by chunk: rows [r0, r1) run their last `width` columns [q0, L) (a row's fresh
        # tokens, then recomputed cached ones or padding), reading keys from the chunk's first real column
        overhead = CHUNK_OVERHEAD_TOKENS if self.planned_chunks else None
        for r0, r1 in prefill_chunks(fresh_s.tolist(), self.prefill_tokens, overhead):
            width = int(fresh_s[r0])
            k0, q0 = L - int(lens_s[r0:r1].max()), L - width
            cache.set_window(slice(r0, r1), k0, q0)
            kcols, qcols = cols[k0:L], cols[q0:L]
            causal = kcols[None, :] <= qcols[:, None]  # (w, k)
            # pad queries attend to themselves only, so no row of the mask is empty (NaN-free)
            mask = (causal[None] & valid[r0:r1, None, k0:L]) | (kcols[None, :] == qcols[:, None])[None]
            last_logits[r0:r1] = self._forward(ids[r0:r1, q0:L], positions[r0:r1, q0:L], mask[:, None], cache)

        # decode: all active rows one token per step; `rows` maps batch rows to sorted rows
        gen = torch.Generator(device=dev).manual_seed(sampling.seed)
        stop_mask, stop_seqs = self._rules(sampling)
        out_tok = torch.full((B, max(steps, 1)), self.pad_id, dtype=torch.long, device=dev)
        out_lp = torch.zeros(B, max(steps, 1), device=dev)
        n_out = torch.zeros(B, dtype=torch.long, device=dev)
        reason = torch.zeros(B, dtype=torch.long, device=dev)
        budget_s = budget[order].to(dev)
        context_bound = (budget_s < max_new)
        rows = torch.arange(B, device=dev)
        sorted_prompts = [prompts[i] for i in order.tolist()]
        alive = torch.ones(B, dtype=torch.bool, device=dev)  # per batch row; False = finished, not yet dropped
        # rows draw their random numbers in the caller's order, so what a prompt samples does not depend
        # on the layout (cache hits reorder rows): `draw` lists batch rows in caller order, `undraw` inverts it
        caller = order.to(dev)
        draw = torch.argsort(caller)
        undraw = torch.argsort(draw)
        logits = last_logits
        for s in range(steps):
            tok, lp = _sample(logits[draw], sampling, gen)  # (b,), (b,) in caller order
            tok, lp = tok[undraw], lp[undraw]
            out_tok[rows, s], out_lp[rows, s] = tok, lp
            done = stop_mask[tok]
            for seq in stop_seqs:
                k = seq.numel()
                if s + 1 >= k:
                    done |= (out_tok[rows, s + 1 - k : s + 1] == seq).all(-1)
            full = (s + 1) >= budget_s[rows]
            new = alive & (done | full)
            reason[rows[new]] = torch.where(
                done[new], _STOP, torch.where(context_bound[rows[new]], _CONTEXT, _LENGTH)
            )
            n_out[rows[new]] = s + 1
            alive &= ~new
            if s + 1 == steps or not bool(alive.any()):
                break
            if int((~alive).sum()) * 8 >= rows.numel():  # drop finished rows, compact the cache
                self._remember(cache, (~alive).nonzero()[:, 0], rows, sorted_prompts, out_tok, n_out, L, kept)
                idx = alive.nonzero()[:, 0]
                cache.keep_rows(idx)
                rows, tok, alive = rows[idx], tok[idx], alive[idx]
                draw = torch.argsort(caller[rows])
                undraw = torch.argsort(draw)
            b = rows.numel()
            cache.set_window(slice(0, b), 0, L + s)
            mask = valid[rows, None, None, : L + s + 1]  # (b, 1, 1, kv)
            logits = self._forward(tok[:, None], positions[rows, L + s : L + s + 1], mask, cache)
        self._remember(cache, torch.arange(rows.numel(), device=dev), rows, sorted_prompts, out_tok, n_out, L, kept)

        # back to the caller's order
        inv = torch.empty_like(order)
        inv[order] = torch.arange(B)
        toks, lps = out_tok.cpu().tolist(), out_lp.cpu().tolist()
        n_out, reason = n_out.cpu().tolist(), reason.cpu().tolist()
        result = []
        for i in range(B):
            r = int(inv[i])
            result.append((toks[r][: n_out[r]], lps[r][: n_out[r]], _REASONS[reason[r]]))
        return result

    def _head_length(self, prompts: list[list[int]], hits: list) -> int:
        """Tokens that every prompt starts with and every prompt's cache hit holds, when the rows attend to
        them once (`_SlotCache.set_head`, with `head_once`): at least MIN_HEAD_TOKENS; else 0.
        Why: a batch's observations share most of their tokens (the smollm2 company's, 64 episodes: 92% of
        a row's keys were its group's common head), and a decode step read each row's copy of them.
        Off by default in fp32, so the tiny policy's committed bits stay as they are."""
        if not self.head_once or len(prompts) < 2:
            return 0
        n = min(m for _, m in hits)
        for p in prompts[1:]:
            if n < MIN_HEAD_TOKENS:
                break
            n = common_prefix_length(prompts[0][:n], p)
        return n if n >= MIN_HEAD_TOKENS else 0

    def _prefill_heads(self, prompts: list[list[int]]) -> None:
        """Run and store the heads the prompts share beyond what the prefix cache holds of them (at least a
        cache block longer), so each prompt reads its head from the cache. A head is run as a prompt of
        its own (one greedy token, never fed back); heads that share heads recurse, at most n - 1 each level."""
        store = self.prefix_cache
        heads = shared_heads(prompts, [store.match_length(p) for p in prompts], store.block)
        if heads:
            counted = self.prompt_tokens, self.reused_tokens  # the callers' prompts only
            self.generate(heads, Sampling(temperature=0.0, max_new_tokens=1))
            self.prompt_tokens, self.reused_tokens = counted

    def _remember(self, cache: _SlotCache, batch_rows: torch.Tensor, rows: torch.Tensor, sorted_prompts: list[list[int]],
                  out_tok: torch.Tensor, n_out: torch.Tensor, L: int, kept: list | None) -> None:
        """Store the finished `batch_rows` of the cache in the prefix cache (or, a group's, onto `kept`):
        each row's prompt and the generated tokens fed after it (all but the last one, sampled, never run)."""
        if self.prefix_cache is None:
            return
        sorted_rows = rows[batch_rows]
        fed, gen = (n_out[sorted_rows] - 1).tolist(), out_tok[sorted_rows].tolist()
        for b, r, n, g in zip(batch_rows.tolist(), sorted_rows.tolist(), fed, gen, strict=True):
            tokens = cache.head_tokens + sorted_prompts[r] + g[:n]
            if kept is not None:  # stored after the call (insert skips one already there then)
                kept.append((tokens, cache.read(b, L - len(sorted_prompts[r]), L + n)))
            elif tokens not in self.prefix_cache:
                self.prefix_cache.insert(tokens, cache.read(b, L - len(sorted_prompts[r]), L + n))

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: _SlotCache) -> torch.Tensor:
        """Logits (b, V) of each row's last position; `mask` (b, 1, q, kv) bool, True = may attend."""
        if self.fast is not None:
            return self.fast(ids, positions, mask, cache)
        out = self.model(input_ids=ids, attention_mask=self._mask(mask), position_ids=positions,
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1]

    def _mask(self, mask: torch.Tensor) -> torch.Tensor:
        """A boolean (b, 1, q, kv) mask in the form the model's attention takes."""
        if self.model.config._attn_implementation == "sdpa":
            return mask
        dtype = next(self.model.parameters()).dtype
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
