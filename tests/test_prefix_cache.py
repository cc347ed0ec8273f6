"""Prefix reuse: the store's lookups and memory bound, and the engine reusing KV exactly as if it
had recomputed it (same tokens; logprobs to float rounding and to the trainer's full forward)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import random  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from rlcr.policy.engine import Sampling, sequence_logprobs  # noqa: E402
from rlcr.policy.prefix_cache import PrefixCache, block_keys, kv_span, kv_take, shared_heads  # noqa: E402
from rlcr.policy.torch_engine import TorchEngine  # noqa: E402
from tests.helpers import varied_tiny  # noqa: E402
from tests.test_torch_engine import CFG, CTX, LOGPROB_TOL, greedy_by_recompute, prompts  # noqa: E402

BLOCK = 4


def kv_of(tokens, width: int = 2) -> torch.Tensor:
    """A fake (layers=1, 2, heads=1, n, width) KV whose values name their token, to check what comes back."""
    t = torch.tensor(tokens, dtype=torch.float32)
    return t[None, None, None, :, None].expand(1, 2, 1, len(tokens), width).clone()


def nbytes(tokens, width: int = 2) -> int:
    return kv_of(tokens, width).numel() * 4


# ------------------------------------------------------------------------------------ the store


def test_block_keys_name_the_whole_prefix_not_just_the_block():
    a = block_keys(list(range(12)), BLOCK)
    b = block_keys([99, *range(1, 12)], BLOCK)  # first token differs, later blocks equal
    assert len(a) == 3 and a[0] != b[0] and a[1] != b[1] and a[2] != b[2]
    assert block_keys(list(range(10)), BLOCK) == a[:2]  # a partial block has no key


def test_lookup_finds_the_longest_shared_prefix_within_the_limit():
    cache = PrefixCache(10**6, block=BLOCK)
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8, 9], kv_of([1, 2, 3, 4, 5, 6, 7, 8, 9]))
    cache.insert([1, 2, 3, 4, 5, 6, 70, 80], kv_of([1, 2, 3, 4, 5, 6, 70, 80]))
    kv, m = cache.lookup([1, 2, 3, 4, 5, 6, 7, 8, 40, 41], limit=9)
    assert m == 8 and kv_take(kv, 0, m)[0, 0, 0, :, 0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]  # into the next block
    kv, m = cache.lookup([1, 2, 3, 4, 5, 6, 70, 81, 82], limit=8)
    assert m == 7 and kv_take(kv, 0, m)[0, 1, 0, :, 0].tolist() == [1, 2, 3, 4, 5, 6, 70]
    assert cache.lookup([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], limit=3)[1] == 3  # the limit caps the match
    assert cache.lookup([1, 2, 3, 9, 9], limit=4) == (None, 0)  # shares less than a block: a miss
    assert cache.lookup([5, 6, 7, 8, 9], limit=4) == (None, 0)


def test_entries_in_parts_share_a_part_and_read_across_them():
    head, tails = [1, 2, 3, 4, 5], [[6, 7, 8], [60, 70]]
    shared = kv_of(head)
    cache = PrefixCache(10**6, block=BLOCK)
    for tail in tails:
        cache.insert(head + tail, (shared, kv_of(tail)))
    entries = [cache._entries[tuple(head + t)] for t in tails]
    assert entries[0].kv[0] is entries[1].kv[0] is shared  # stored as handed over, not copied
    assert cache.nbytes == sum(nbytes(head + t) for t in tails)  # a shared part counts in each entry
    kv, m = cache.lookup([1, 2, 3, 4, 5, 60, 70, 9], limit=10)
    assert m == 7 and kv_take(kv, 0, m)[0, 0, 0, :, 0].tolist() == [1, 2, 3, 4, 5, 60, 70]
    assert [p.shape[-2] for p in kv_span(kv, 3, 7)] == [2, 2] and kv_take(kv, 3, 7)[0, 0, 0, :, 0].tolist() == [4, 5, 60, 70]
    assert kv_take(kv, 1, 4).data_ptr() == shared[..., 1:4, :].data_ptr()  # within one part: a view
    assert kv_take(kv, 2, 2).shape[-2] == 0
    with pytest.raises(ValueError, match=r"positions \[6, 9\) outside the parts' 7"):
        kv_span(kv, 6, 9)
    with pytest.raises(ValueError, match="KV of 7 positions for 8 tokens"):
        cache.insert([9] * 8, (shared, kv_of([1, 2])))


def test_a_hash_collision_costs_a_miss_never_a_wrong_prefix():
    cache = PrefixCache(10**6, block=BLOCK)
    cache.insert([1, 2, 3, 4, 5], kv_of([1, 2, 3, 4, 5]))
    other = [7, 7, 7, 7, 7]
    cache._index[block_keys(other, BLOCK)[0]] = next(iter(cache._entries.values()))  # a forged collision
    assert cache.lookup(other, limit=4) == (None, 0)


def test_memory_stays_within_the_budget_least_recently_used_out_first():
    seqs = [[s, *range(100, 107)] for s in range(6)]  # 8 tokens each, distinct from the first token
    budget = 3 * nbytes(seqs[0])
    cache = PrefixCache(budget, block=BLOCK)
    for i, s in enumerate(seqs):
        cache.insert(s, kv_of(s))
        assert cache.nbytes <= budget and len(cache) == min(i + 1, 3)
        if i == 2:
            cache.lookup(seqs[0], limit=8)  # touch the oldest: the next two inserts evict 1 and 2, not 0
        if i == 4:
            assert [s in cache for s in seqs[:5]] == [True, False, False, True, True]
    assert [s in cache for s in seqs] == [False, False, False, True, True, True]
    big = list(range(200, 200 + 3 * 8 + 1))  # larger than the whole budget: not stored, nothing evicted
    cache.insert(big, kv_of(big))
    assert big not in cache and len(cache) == 3 and cache.nbytes <= budget


def test_a_stored_sequence_that_a_new_one_extends_is_dropped():
    cache = PrefixCache(10**6, block=BLOCK)
    turn1 = [1, 2, 3, 4, 5, 6]
    cache.insert(turn1, kv_of(turn1))
    turn2 = [*turn1, 7, 8, 9]
    cache.insert(turn2, kv_of(turn2))
    assert turn1 not in cache and turn2 in cache and cache.nbytes == nbytes(turn2)
    with pytest.raises(ValueError, match="KV of 3 positions for 4 tokens"):
        cache.insert([1, 2, 3, 4], kv_of([1, 2, 3]))


def test_shared_heads_are_each_prompts_longest_common_prefix_with_another():
    a, b, c = [1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 9], [1, 2, 3, 8, 8, 8]
    d = [1, 2, 3, 4, 5, 6, 7, 8]  # a is a whole prefix of d
    assert shared_heads([a, b, c, [9, 9, 9, 9]], [0, 0, 0, 0], min_gain=3) == [[1, 2, 3], [1, 2, 3, 4, 5]]
    assert shared_heads([c, d, b, a], [0] * 4, min_gain=3) == [[1, 2, 3], [1, 2, 3, 4, 5], a]
    # what the cache already holds of a prompt counts against it: a head is worth it only min_gain beyond
    assert shared_heads([a, b, c], [5, 5, 0], min_gain=3) == [[1, 2, 3]]
    assert shared_heads([a, b], [0, 0], min_gain=6) == []
    assert shared_heads([a], [0], min_gain=1) == [] and shared_heads([], [], min_gain=1) == []
    many = [[1, 2, 3, 4, i, i] for i in range(10, 30)]  # one head for all, however many share it
    assert shared_heads(many, [0] * 20, min_gain=4) == [[1, 2, 3, 4]]


# ------------------------------------------------------------------------------------ the engine


@pytest.fixture(scope="module")
def policy():
    return varied_tiny(CFG, 0)


def second_turns(first: list[list[int]], outs, seed: int) -> list[list[int]]:
    """Prompts of a next call: extensions of prompt + completion, prompts diverging midway, new
    prompts, a prompt too long for the context (its left cut moves: no reusable prefix)."""
    rng = random.Random(seed)
    more = lambda k: [rng.randrange(4, 101) for _ in range(k)]  # noqa: E731
    nxt = []
    for i, (p, c) in enumerate(zip(first, outs, strict=True)):
        if i % 4 == 0:
            nxt.append(p + c.token_ids + more(rng.randint(1, 8)))  # the chat case: the turn goes on
        elif i % 4 == 1:
            nxt.append(p[: max(1, len(p) // 2)] + more(rng.randint(1, 20)))  # an observation that changed
        elif i % 4 == 2:
            nxt.append(list(p))  # the same prompt again
        else:
            nxt.append(prompts(1, seed=seed + i)[0])
    nxt.append(first[0] + more(150))  # beyond the context: cut on the left
    return nxt


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.8, 0.9), (0.0, 1.0)])
def test_reuse_gives_what_recomputing_gives(policy, temperature, top_p):
    model, tok = policy
    reuse = TorchEngine(model, tok, context=CTX, prefill_tokens=64)
    fresh = TorchEngine(model, tok, context=CTX, prefill_tokens=64, prefix_cache_bytes=0)
    first = prompts(12, seed=20, lo=10, hi=40)
    s1 = Sampling(temperature=temperature, top_p=top_p, max_new_tokens=20, seed=3)
    a1, b1 = reuse.generate(first, s1), fresh.generate(first, s1)
    assert a1 == b1  # nothing to reuse yet: the same computation
    nxt = second_turns(first, a1, seed=21)
    s2 = Sampling(temperature=temperature, top_p=top_p, max_new_tokens=12, seed=4)
    a2, b2 = reuse.generate(nxt, s2), fresh.generate(nxt, s2)
    assert reuse.reused_tokens > sum(map(len, nxt)) // 3 and fresh.reused_tokens == 0
    for p, x, y in zip(nxt, a2, b2, strict=True):
        assert (x.token_ids, x.finish_reason, x.prompt_tokens_dropped) == (y.token_ids, y.finish_reason,
                                                                           y.prompt_tokens_dropped)
        assert (torch.tensor(x.logprobs) - torch.tensor(y.logprobs)).abs().max() < 1e-5
        kept = p[x.prompt_tokens_dropped :]
        assert (sequence_logprobs(model, kept, x.token_ids) - torch.tensor(x.logprobs)).abs().max() < LOGPROB_TOL
        if temperature == 0:
            assert x.token_ids == greedy_by_recompute(model, kept, len(x.token_ids))


def test_same_calls_on_fresh_engines_are_bit_identical_with_reuse(policy):
    model, tok = policy
    first = prompts(10, seed=22, lo=10, hi=40)
    s = Sampling(temperature=1.0, top_p=0.95, max_new_tokens=16, seed=8)

    def session():
        engine = TorchEngine(model, tok, context=CTX, prefill_tokens=64)
        out1 = engine.generate(first, s)
        out2 = engine.generate(second_turns(first, out1, seed=23), s)
        assert engine.reused_tokens > 0
        return out1, out2

    assert session() == session()


def test_the_engine_cache_stays_within_its_byte_budget(policy):
    model, tok = policy
    per_token = 2 * CFG.num_layers * CFG.hidden_size * 4  # K and V, fp32
    budget = 100 * per_token  # room for a few sequences only
    engine = TorchEngine(model, tok, context=CTX, prefix_cache_bytes=budget)
    ps = prompts(6, seed=24, lo=20, hi=40)
    for i in range(4):
        out = engine.generate(ps, Sampling(temperature=1.0, max_new_tokens=10, seed=i))
        assert 0 < engine.prefix_cache.nbytes <= budget
        ps = [p + c.token_ids for p, c in zip(ps, out, strict=True)]
    assert len(engine.prefix_cache) <= 100 // 20


def test_weights_changed_in_place_are_never_served_from_stale_keys_and_values():
    model, tok = varied_tiny(CFG, 0)
    engine = TorchEngine(model, tok, context=CTX, prefill_tokens=64)
    ps = prompts(5, seed=25, lo=20, hi=40)
    greedy = Sampling(temperature=0, max_new_tokens=10, ignore_eos=True)
    engine.generate(ps, greedy)
    with torch.no_grad():  # what an optimiser step does to a shared model: no load_state_dict
        for p in model.parameters():
            p.mul_(1.1)
    after = engine.generate(ps, greedy)
    assert engine.reused_tokens == 0
    assert [c.token_ids for c in after] == [greedy_by_recompute(model, p, 10) for p in ps]


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_shared_heads_run_once_and_give_what_recomputing_gives(policy, temperature):
    """Prompts opening with the same long text (every agent's first observation): with shared_prefill the
    head is prefilled once, not once per prompt, and the outputs are the cacheless engine's."""
    model, tok = policy
    rng = random.Random(26)
    head = prompts(1, seed=27, lo=30, hi=31)[0]
    batch = [head + [rng.randrange(4, 101) for _ in range(rng.randint(1, 12))] for _ in range(10)]
    batch += [head[:12] + [5, 6], prompts(1, seed=28)[0]]  # a shorter sharer and a stranger
    s = Sampling(temperature=temperature, max_new_tokens=12, seed=5)
    shared = TorchEngine(model, tok, context=CTX, prefill_tokens=64, shared_prefill=True)
    plain = TorchEngine(model, tok, context=CTX, prefill_tokens=64)
    fresh = TorchEngine(model, tok, context=CTX, prefill_tokens=64, prefix_cache_bytes=0)
    a, b, c = shared.generate(batch, s), plain.generate(batch, s), fresh.generate(batch, s)
    assert b == c  # without sharing nothing is reused within one call
    total = sum(map(len, batch))
    assert plain.prefilled_tokens == total and shared.prompt_tokens == total
    assert shared.prefilled_tokens < total - 8 * len(head)  # the head ran once (plus each row's last token)
    assert shared.reused_tokens >= 10 * (len(head) - 1)
    for x, y in zip(a, c, strict=True):
        assert (x.token_ids, x.finish_reason) == (y.token_ids, y.finish_reason)
        assert (torch.tensor(x.logprobs) - torch.tensor(y.logprobs)).abs().max() < 1e-5
