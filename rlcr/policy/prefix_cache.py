"""Keys/values of token sequences the engine has already run, so a prompt that starts with one of
them is prefilled from where the match ends (an agent's successive observations share a long head).

Entries are whole sequences (a prompt and the completion tokens fed back after it) with their KV:
consecutive parts along the position dimension, each (layers, 2, kv_heads, n_i, head_dim), whose
lengths sum to the sequence's. A part may be shared by several entries: the engine stores the head a
call's rows attended once as one tensor that every row's entry starts with, and copies only what is
each row's own (`kv_span` / `kv_take` read positions across the parts). A lookup finds the stored sequence sharing the
longest prefix with a prompt: the deepest full block of `block` tokens found in a dict of chained
block hashes, then checked token by token (so a hash collision can only cost a miss, never a wrong
reuse) and extended into the next partial block. A block key points to the newest entry holding
that prefix; evicting it while older holders remain can shorten a later match, never falsify one.
Memory is bounded by `max_bytes` of KV, least recently used entries evicted first (a shared part counts
in every entry holding it, so the bound holds over the memory really held); an entry that is a prefix of
a newly stored one is dropped at once (the new one serves every prompt it served).

Covers: exact token-prefix matches, at any position a prompt and a stored sequence diverge.
`shared_heads` finds, among the prompts of one batch, the heads they share (an engine runs each once
and stores it, so the prompts read it from here instead of each prefilling its own copy).

Does not cover: invalidation when weights change (the engine clears the cache itself), sharing of
memory between entries beyond the parts the engine hands over shared (two entries with a common prefix
from different calls each hold their own copy of it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):  # up to the shorter one
        if x != y:
            break
        n += 1
    return n


def shared_heads(prompts: Sequence[Sequence[int]], stored: Sequence[int], min_gain: int) -> list[list[int]]:
    """The heads that prompts of one batch share, worth running once: each prompt's longest common prefix
    with any other prompt of the batch, where it is at least `min_gain` tokens longer than that prompt's
    `stored` prefix (what the cache already holds of it); distinct, shortest first.

    The longest common prefix of a sequence with any other of a set is the one with a neighbour in
    sorted order, so one sort and n - 1 comparisons find them all; the n - 1 neighbour pairs give at most
    n - 1 distinct heads (heads of heads therefore shrink to one)."""
    order = sorted(range(len(prompts)), key=lambda i: list(prompts[i]))
    shared = [0] * len(prompts)
    for a, b in zip(order, order[1:], strict=False):  # neighbours in sorted order
        m = common_prefix_length(prompts[a], prompts[b])
        shared[a], shared[b] = max(shared[a], m), max(shared[b], m)
    heads = {tuple(p[:n]) for p, n, have in zip(prompts, shared, stored, strict=True) if n - have >= min_gain}
    return [list(h) for h in sorted(heads, key=len)]


def kv_length(parts: Sequence[torch.Tensor]) -> int:
    """Positions that the KV parts (each (..., n_i, head_dim)) hold together."""
    return sum(p.shape[-2] for p in parts)


def kv_span(parts: Sequence[torch.Tensor], start: int, end: int) -> list[torch.Tensor]:
    """Views of positions [start, end) of the KV parts, in order, one per part they touch (no copy)."""
    if not 0 <= start <= end <= kv_length(parts):
        raise ValueError(f"kv_span: positions [{start}, {end}) outside the parts' {kv_length(parts)}")
    views, offset = [], 0
    for p in parts:
        n = p.shape[-2]
        a, b = max(start, offset), min(end, offset + n)
        if a < b:
            views.append(p[..., a - offset : b - offset, :])
        offset += n
    return views


def kv_take(parts: Sequence[torch.Tensor], start: int, end: int) -> torch.Tensor:
    """Positions [start, end) of the KV parts as one tensor: a view when they lie in one part, else a copy."""
    views = kv_span(parts, start, end)
    if len(views) == 1:
        return views[0]
    if not views:
        return parts[0][..., :0, :]
    return torch.cat(views, -2)


def block_keys(tokens: Sequence[int], block: int) -> list[int]:
    """Chained hashes of the full `block`-token blocks of `tokens`: key i identifies tokens[: (i+1)*block]."""
    keys, key = [], 0
    for i in range(len(tokens) // block):
        key = hash((key, tuple(tokens[i * block : (i + 1) * block])))
        keys.append(key)
    return keys


class _Entry:
    __slots__ = ("tokens", "kv", "keys")

    def __init__(self, tokens: tuple[int, ...], kv: tuple[torch.Tensor, ...], keys: list[int]):
        self.tokens, self.kv, self.keys = tokens, kv, keys

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.kv)


class PrefixCache:
    """LRU store of (token sequence -> KV), bounded by bytes; see the module docstring."""

    def __init__(self, max_bytes: int, block: int = 16):
        if block < 1:
            raise ValueError(f"PrefixCache.block must be >= 1, got {block}")
        self.max_bytes, self.block = max_bytes, block
        self.nbytes = 0
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()  # oldest first
        self._index: dict[int, _Entry] = {}  # block key -> the newest entry holding that prefix

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, tokens: Sequence[int]) -> bool:
        return tuple(tokens) in self._entries

    def clear(self) -> None:
        self._entries.clear()
        self._index.clear()
        self.nbytes = 0

    def _longest(self, tokens: Sequence[int]) -> tuple[_Entry | None, int]:
        """The stored entry sharing the longest prefix with `tokens`, and that prefix's length."""
        best, m = None, 0
        keys = block_keys(tokens, self.block)
        for i in range(len(keys) - 1, -1, -1):  # the deepest stored block, even past a gap in the index
            if (owner := self._index.get(keys[i])) is not None:
                best, m = owner, (i + 1) * self.block
                break
        if best is None or best.tokens[:m] != tuple(tokens[:m]):  # none, or a hash collision
            return None, 0
        end = min(len(best.tokens), len(tokens))
        while m < end and best.tokens[m] == tokens[m]:
            m += 1
        return best, m

    def match_length(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of `tokens` a stored entry holds (no LRU update)."""
        return self._longest(tokens)[1]

    def lookup(self, tokens: Sequence[int], limit: int) -> tuple[tuple[torch.Tensor, ...] | None, int]:
        """(KV of the longest stored prefix of `tokens`, at most `limit` tokens long, its length m).
        The KV is the stored entry's whole tuple of parts: read positions [0, m) of it (`kv_span`,
        `kv_take`). (None, 0) on a miss."""
        entry, m = self._longest(tokens)
        m = min(m, limit)
        if entry is None or m <= 0:
            return None, 0
        self._entries.move_to_end(entry.tokens)
        return entry.kv, m

    def insert(self, tokens: Sequence[int], kv: torch.Tensor | Sequence[torch.Tensor]) -> None:
        """Store `tokens` (n of them) with their KV: one tensor (..., n, head_dim) or consecutive parts
        whose positions sum to n (kept as they are, not copied), evicting the oldest entries to stay
        within max_bytes; a sequence larger than the whole budget is not stored."""
        tokens = tuple(tokens)
        kv = (kv,) if isinstance(kv, torch.Tensor) else tuple(kv)
        if kv_length(kv) != len(tokens):
            raise ValueError(f"PrefixCache.insert: KV of {kv_length(kv)} positions for {len(tokens)} tokens")
        entry = _Entry(tokens, kv, [])
        size = entry.nbytes
        if tokens in self._entries or size > self.max_bytes or len(tokens) < self.block:
            return
        older, m = self._longest(tokens)
        if older is not None and m == len(older.tokens):  # the new entry extends it: it is redundant
            self._remove(older)
        entry.keys = block_keys(tokens, self.block)
        self._entries[tokens] = entry
        for key in entry.keys:
            self._index[key] = entry
        self.nbytes += size
        while self.nbytes > self.max_bytes:
            self._remove(next(iter(self._entries.values())))

    def _remove(self, entry: _Entry) -> None:
        del self._entries[entry.tokens]
        for key in entry.keys:
            if self._index.get(key) is entry:
                del self._index[key]
        self.nbytes -= entry.nbytes
