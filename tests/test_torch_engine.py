"""The torch engine against the model itself: full recomputation is the reference for every property."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import random  # noqa: E402
from collections import Counter  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from rlcr.config import EngineConfig, ModelConfig  # noqa: E402
from rlcr.policy.engine import Sampling, make_engine, sequence_logprobs  # noqa: E402
from rlcr.policy.models import save_policy  # noqa: E402
from rlcr.policy.prefix_cache import kv_take  # noqa: E402
from rlcr.policy.torch_engine import TorchEngine, inverse_cdf  # noqa: E402
from tests.helpers import varied_tiny  # noqa: E402

CTX = 96
CFG = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, context=CTX, tokenizer="char")
"""Characters: every stop string is a fixed token sequence (the engine's documented exact case)."""
LOGPROB_TOL = 1e-4  # fp32, batched + left-padded + KV-cached vs one unpadded full forward


def varied_policy(seed: int):
    return varied_tiny(CFG, seed)


@pytest.fixture(scope="module")
def policy():
    return varied_policy(0)


@pytest.fixture(scope="module")
def engine(policy):
    model, tok = policy
    # a small prefill budget forces several chunks of different widths
    return TorchEngine(model, tok, context=CTX, prefill_tokens=64)


def prompts(n: int, seed: int = 0, lo: int = 1, hi: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(4, 101) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def greedy_by_recompute(model, prompt: list[int], n: int) -> list[int]:
    """The reference: no cache, no padding, no batching; one full forward per token."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_greedy_kv_cache_equals_full_recompute(policy, engine):
    model, _ = policy
    ps = prompts(9)
    out = engine.generate(ps, Sampling(temperature=0, max_new_tokens=24, ignore_eos=True))
    for p, c in zip(ps, out, strict=True):
        assert c.token_ids == greedy_by_recompute(model, p, 24)
        assert c.finish_reason == "length"


def test_a_prompt_gets_the_same_greedy_answer_alone_or_in_a_batch(engine):
    ps = prompts(12, seed=1)
    greedy = Sampling(temperature=0, max_new_tokens=16, ignore_eos=True)
    batch = engine.generate(ps, greedy)
    assert [engine.generate([p], greedy)[0].token_ids for p in ps[:4]] == [c.token_ids for c in batch[:4]]


@pytest.mark.parametrize("temperature,top_p,sampler", [(1.0, 1.0, "multinomial"), (0.7, 0.9, "multinomial"),
                                                     (0.0, 1.0, "multinomial"), (0.7, 0.9, "inverse_cdf")])
def test_logprobs_match_the_trainers_full_forward(policy, engine, temperature, top_p, sampler):
    model, _ = policy
    ps = prompts(8, seed=2)
    out = engine.generate(ps, Sampling(temperature=temperature, top_p=top_p, max_new_tokens=20, seed=5, sampler=sampler))
    for p, c in zip(ps, out, strict=True):
        ref = sequence_logprobs(model, p, c.token_ids)
        assert (ref - torch.tensor(c.logprobs)).abs().max() < LOGPROB_TOL


def test_inverse_cdf_draws_the_softmax_law_and_never_a_zero():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0]) * 3  # unnormalised, zeros first, between and last
    n = 60000
    gen = torch.Generator().manual_seed(0)
    drawn = inverse_cdf(probs.expand(n, -1), gen)
    freq = torch.bincount(drawn, minlength=6).double() / n
    p = probs.double() / probs.sum()
    assert (freq[p == 0] == 0).all()
    assert ((freq - p).abs() <= 4 * (p * (1 - p) / n).sqrt() + 1e-12).all(), freq  # 4 standard errors
    assert inverse_cdf(probs.expand(n, -1), torch.Generator().manual_seed(0)).equal(drawn)  # seeded
    one_hot = inverse_cdf(torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]), gen)
    assert one_hot.tolist() == [2, 0]
    blocked = inverse_cdf(probs.expand(n, -1), torch.Generator().manual_seed(0), block=4)  # 2 blocks, one padded
    assert blocked.equal(drawn)  # the two levels draw what one running sum draws
    many = torch.zeros(4, 1000)
    many[:, [3, 511, 512, 999]] = torch.tensor([0.1, 0.2, 0.3, 0.4])  # mass at block edges, whole blocks empty
    got = torch.cat([inverse_cdf(many, gen, block=64) for _ in range(2000)])
    assert set(got.tolist()) == {3, 511, 512, 999}


def test_inverse_cdf_in_two_levels_draws_what_one_running_sum_draws():
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(64, 5000, generator=g) * 4, -1)
    u = torch.rand(64, 1, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    c = probs.double().cumsum(-1)
    one_scan = torch.searchsorted(c, u * c[:, -1:], right=True)[:, 0]
    assert inverse_cdf(probs, torch.Generator().manual_seed(2), block=128).equal(one_scan)


def test_the_inverse_cdf_sampler_is_seeded_and_differs_from_multinomial(policy):
    model, tok = policy
    ps = prompts(8, seed=3)
    s = Sampling(temperature=1.0, max_new_tokens=20, seed=11, sampler="inverse_cdf")
    one, two = (TorchEngine(model, tok, context=CTX, prefill_tokens=64) for _ in range(2))
    assert one.generate(ps, s) == two.generate(ps, s)
    multi = one.generate(ps, Sampling(temperature=1.0, max_new_tokens=20, seed=11))
    assert [c.token_ids for c in one.generate(ps, s)] != [c.token_ids for c in multi]
    with pytest.raises(ValueError, match="Sampling.sampler must be one of multinomial, inverse_cdf"):
        Sampling(sampler="gumbel")


def test_same_seed_same_output_other_seed_other_output(policy):
    model, tok = policy
    ps = prompts(8, seed=3)
    s = Sampling(temperature=1.0, top_p=0.95, max_new_tokens=20, seed=11)
    # the same state (fresh engines, same calls): bit-identical, the second call reusing the first's KV
    one, two = (TorchEngine(model, tok, context=CTX, prefill_tokens=64) for _ in range(2))
    assert [one.generate(ps, s), one.generate(ps, s)] == [two.generate(ps, s), two.generate(ps, s)]
    assert one.reused_tokens > 0
    c = one.generate(ps, Sampling(temperature=1.0, top_p=0.95, max_new_tokens=20, seed=12))
    assert [x.token_ids for x in one.generate(ps, s)] != [x.token_ids for x in c]


def test_a_repeated_call_gives_the_same_tokens_and_logprobs_up_to_rounding(engine):
    ps = prompts(8, seed=3)
    s = Sampling(temperature=1.0, top_p=0.95, max_new_tokens=20, seed=11)
    a, b = engine.generate(ps, s), engine.generate(ps, s)  # b reads a's KV from the prefix cache
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert max(abs(u - v) for x, y in zip(a, b, strict=True) for u, v in zip(x.logprobs, y.logprobs, strict=True)) < 1e-5


def test_tiny_top_p_is_greedy(engine):
    ps = prompts(6, seed=4)
    greedy = engine.generate(ps, Sampling(temperature=0, max_new_tokens=12, ignore_eos=True))
    nucleus = engine.generate(ps, Sampling(temperature=1.0, top_p=1e-6, max_new_tokens=12, ignore_eos=True, seed=9))
    assert [c.token_ids for c in greedy] == [c.token_ids for c in nucleus]


def test_stop_string_ends_the_completion_at_its_first_occurrence(policy, engine):
    _, tok = policy
    ps = prompts(6, seed=5)
    free = engine.generate(ps, Sampling(temperature=0, max_new_tokens=30, ignore_eos=True))
    specials = set(tok.all_special_ids)
    # a two-character stop taken from each greedy answer: must end exactly at its first occurrence
    for p, f in zip(ps, free, strict=True):
        at = next(i for i in range(10, 28) if not specials & set(f.token_ids[i : i + 2]))
        seq = f.token_ids[at : at + 2]
        first = next(j for j in range(29) if f.token_ids[j : j + 2] == seq)
        c = engine.generate([p], Sampling(temperature=0, max_new_tokens=30, stop=(tok.decode(seq),), ignore_eos=True))[0]
        assert c.token_ids == f.token_ids[: first + 2] and c.finish_reason == "stop"


def test_newline_stop_and_max_new_tokens_over_a_sampled_batch(policy, engine):
    _, tok = policy
    ps = prompts(48, seed=6)
    out = engine.generate(ps, Sampling(temperature=1.0, max_new_tokens=40, stop=("\n",), ignore_eos=True, seed=1))
    reasons = {c.finish_reason for c in out}
    assert reasons == {"stop", "length"}  # both happen with this seed (random init, ~1% newline)
    for c in out:
        text = tok.decode(c.token_ids)
        assert len(c.token_ids) <= 40
        if c.finish_reason == "stop":
            assert text.endswith("\n") and "\n" not in text[:-1]
        else:
            assert len(c.token_ids) == 40 and "\n" not in text


def test_stop_token_ids_and_eos(policy, engine):
    _, tok = policy
    p = prompts(1, seed=7)
    free = engine.generate(p, Sampling(temperature=0, max_new_tokens=30, ignore_eos=True))[0].token_ids
    target = free[5]
    c = engine.generate(p, Sampling(temperature=0, max_new_tokens=30, stop_token_ids=(target,), ignore_eos=True))[0]
    assert c.token_ids == free[: free.index(target) + 1] and c.finish_reason == "stop"


def test_long_prompt_keeps_its_end_and_never_exceeds_the_context(policy, engine):
    model, _ = policy
    long = prompts(1, seed=8, lo=200, hi=200)[0]
    c = engine.generate([long], Sampling(temperature=0, max_new_tokens=16, ignore_eos=True))[0]
    kept = CTX - 16
    assert c.prompt_tokens_dropped == len(long) - kept
    assert len(c.token_ids) == 16 and c.finish_reason == "length"
    assert c.token_ids == greedy_by_recompute(model, long[-kept:], 16)


def test_generation_stops_with_context_when_the_window_is_full(engine):
    ps = prompts(3, seed=9, lo=5, hi=30)
    out = engine.generate(ps, Sampling(temperature=1.0, max_new_tokens=500, ignore_eos=True))
    for p, c in zip(ps, out, strict=True):
        kept = len(p) - c.prompt_tokens_dropped
        assert kept + len(c.token_ids) == CTX and c.finish_reason == "context"


def test_eager_attention_gives_the_same_tokens(policy):
    model, tok = policy
    eager, _ = varied_policy(0)
    eager.set_attn_implementation("eager")
    ps = prompts(5, seed=10)
    s = Sampling(temperature=0, max_new_tokens=12, ignore_eos=True)
    a = TorchEngine(model, tok, context=CTX).generate(ps, s)
    b = TorchEngine(eager, tok, context=CTX).generate(ps, s)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]


def test_load_state_dict_switches_to_the_new_weights(tmp_path):
    model_a, tok = varied_policy(0)
    model_b, _ = varied_policy(1)
    engine = make_engine(EngineConfig(), save_policy(model_a, tok, tmp_path / "a"), CFG)
    ps = prompts(4, seed=11)
    s = Sampling(temperature=0, max_new_tokens=10, ignore_eos=True)
    before = engine.generate(ps, s)
    engine.load_state_dict(model_b.state_dict())
    after = engine.generate(ps, s)
    assert [c.token_ids for c in after] == [greedy_by_recompute(model_b, p, 10) for p in ps]
    assert [c.token_ids for c in after] != [c.token_ids for c in before]


def test_bad_prompts_are_rejected_by_index(engine):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[1, 5], []], Sampling())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate([[1, 10_000]], Sampling())
    assert engine.generate([], Sampling()) == []


def test_bfloat16_engine_runs_and_keeps_its_limits():
    model, tok = varied_policy(0)
    engine = TorchEngine(model, tok, dtype="bfloat16", context=CTX)
    ps = prompts(5, seed=12)
    out = engine.generate(ps, Sampling(temperature=1.0, max_new_tokens=12, stop=("\n",), seed=2))
    assert all(1 <= len(c.token_ids) <= 12 and len(c.logprobs) == len(c.token_ids) for c in out)
    assert all(lp <= 0.0 for c in out for lp in c.logprobs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (GPU profile)")
def test_cuda_engine_matches_cpu_recompute():
    model, tok = varied_policy(0)
    ps = prompts(6, seed=13)
    reference = [greedy_by_recompute(model, p, 16) for p in ps]
    out = TorchEngine(model, tok, device="cuda", context=CTX).generate(
        ps, Sampling(temperature=0, max_new_tokens=16, ignore_eos=True)
    )
    assert [c.token_ids for c in out] == reference
    for p, c in zip(ps, out, strict=True):
        assert (sequence_logprobs(model, p, c.token_ids) - torch.tensor(c.logprobs)).abs().max() < LOGPROB_TOL


def test_row_groups_give_the_full_recompute_and_run_on_threads(policy):
    """`row_threads=2` (at 2 torch threads, 24 prompts: two groups) gives what the model gives: greedy tokens
    of a full recompute, logprobs of the trainer's forward, bit-identical across fresh engines, and the prefix
    cache holds the same sequences as an engine without groups; at 1 torch thread, or too few prompts,
    nothing is split."""
    model, tok = policy
    ps = prompts(24, seed=21)
    greedy_s = Sampling(temperature=0, max_new_tokens=16, ignore_eos=True)
    plain = TorchEngine(model, tok, context=CTX, prefill_tokens=64)
    plain_greedy = plain.generate(ps, greedy_s)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        one, two = (TorchEngine(model, tok, context=CTX, prefill_tokens=64, row_threads=2) for _ in range(2))
        assert one._groups(len(ps)) == 2
        greedy = one.generate(ps, greedy_s)
        assert one._pool_size == 1 and torch.get_num_threads() == 2
        assert [c.token_ids for c in greedy] == [c.token_ids for c in plain_greedy]
        assert set(one.prefix_cache._entries) == set(plain.prefix_cache._entries)
        for p, c in zip(ps[:6], greedy[:6], strict=True):
            assert c.token_ids == greedy_by_recompute(model, p, 16)
        s = Sampling(temperature=1.0, max_new_tokens=20, seed=7)
        a = one.generate(ps, s)
        for p, c in zip(ps[:6], a[:6], strict=True):
            assert (sequence_logprobs(model, p, c.token_ids) - torch.tensor(c.logprobs)).abs().max() < LOGPROB_TOL
        two.generate(ps, greedy_s)
        assert two.generate(ps, s) == a  # the same calls on a fresh engine: the same bits
        few = TorchEngine(model, tok, context=CTX, row_threads=2)
        few.generate(ps[:15], s)  # 15 prompts: no group of 8
        torch.set_num_threads(1)
        alone = TorchEngine(model, tok, context=CTX, row_threads=2)
        alone.generate(ps, s)
        assert few._pool_size == 0 and alone._pool_size == 0
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(ValueError, match="row_threads"):
        TorchEngine(model, tok, context=CTX, row_threads=0)


def test_from_config_builds_what_the_config_says_and_a_grown_pool_replaces_the_old(policy):
    """`TorchEngine.from_config` takes dtype, shared heads and row threads from an `EngineConfig` (the
    device from it unless one is named); when a call needs more row groups than the pool has threads
    (the process's thread count grew), the old pool is shut down, not left behind."""
    model, tok = policy
    cfg = EngineConfig(shared_prefill=True, row_threads=3)
    engine = TorchEngine.from_config(model, tok, cfg, CTX)
    assert (engine.shared_prefill, engine.row_threads, engine.context, engine.device.type) == (True, 3, CTX, "cpu")
    assert TorchEngine.from_config(model, tok, EngineConfig(), CTX).row_threads == 1
    ps, s = prompts(24, seed=5), Sampling(temperature=0, max_new_tokens=4, ignore_eos=True)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        engine.generate(ps, s)
        first = engine._pool
        assert engine._pool_size == 1 and first is not None
        torch.set_num_threads(3)
        engine.generate(ps, s)
        assert engine._pool_size == 2 and engine._pool is not first and first._shutdown
    finally:
        torch.set_num_threads(threads)


def test_a_head_every_row_shares_is_attended_once_and_gives_the_full_recompute(policy):
    """`head_once`: a call whose prompts all open with the same cached head keeps its keys/values once
    (rows hold what follows it) and every row attends to it first. In fp32 (forced on, with planned prefill
    chunks; both off by default there) greedy tokens equal a full recompute, logprobs the trainer's forward, and the prefix cache
    stores the same whole sequences with the same keys/values as an engine that copies the head into
    every row; with row groups too. On by default in bf16 only."""
    model, tok = policy
    rng = random.Random(31)
    head = [1] + [rng.randrange(4, 101) for _ in range(33)]
    ps = [head + [rng.randrange(4, 101) for _ in range(rng.randint(1, 20))] for _ in range(20)]
    greedy_s, s = Sampling(temperature=0, max_new_tokens=16, ignore_eos=True), Sampling(temperature=1.0, max_new_tokens=16, seed=4)
    copied = TorchEngine(model, tok, context=CTX, prefill_tokens=64, shared_prefill=True)
    once = TorchEngine(model, tok, context=CTX, prefill_tokens=64, shared_prefill=True, head_once=True,
                       planned_chunks=True)
    assert not copied.head_once and once.head_once and once.planned_chunks and not copied.planned_chunks
    heads = []
    length = once._head_length
    once._head_length = lambda p, h: heads.append(length(p, h)) or heads[-1]
    for engine in (copied, once):
        engine.generate(ps, greedy_s)  # the second call reads whole sequences of the first from the cache
    assert heads[-1] == len(head) and all(n >= 16 for n in heads[1:])
    for p, c in zip(ps[:8], once.generate(ps, greedy_s)[:8], strict=True):
        assert c.token_ids == greedy_by_recompute(model, p, 16)
    for p, c in zip(ps, once.generate(ps, s), strict=True):
        assert (sequence_logprobs(model, p, c.token_ids) - torch.tensor(c.logprobs)).abs().max() < LOGPROB_TOL
    copied.generate(ps, greedy_s), copied.generate(ps, s)
    assert set(once.prefix_cache._entries) == set(copied.prefix_cache._entries)
    for tokens, entry in once.prefix_cache._entries.items():
        whole = kv_take(entry.kv, 0, len(tokens))
        assert (whole - kv_take(copied.prefix_cache._entries[tokens].kv, 0, len(tokens))).abs().max() < 1e-5
    holders = Counter(id(e.kv[0]) for e in once.prefix_cache._entries.values() if len(e.kv) == 2)
    assert max(holders.values()) >= 2  # a call's rows stored the head they attended once as one shared part
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        grouped = TorchEngine(model, tok, context=CTX, prefill_tokens=64, shared_prefill=True, head_once=True,
                              planned_chunks=True, row_threads=2)
        grouped.generate(ps, greedy_s)
        assert [c.token_ids for c in grouped.generate(ps, greedy_s)] == [greedy_by_recompute(model, p, 16) for p in ps]
    finally:
        torch.set_num_threads(threads)
    assert TorchEngine(model, tok, context=CTX, dtype="bfloat16").head_once


def test_prefill_chunks_greedy_fill_or_least_cost():
    """Greedy: as many rows as fit the token budget at the first row's width. Planned: a long row no longer
    pads many short ones to its width, a forward's fixed cost keeps similar rows together, and no chunk
    passes the budget unless one row alone does."""
    from rlcr.policy.torch_engine import prefill_chunks

    fresh = [133] + [60] * 30
    assert prefill_chunks(fresh, 4096, None) == [(0, 30), (30, 31)]
    assert prefill_chunks(fresh, 4096, 48) == [(0, 1), (1, 31)]
    assert prefill_chunks([40] * 100, 4096, 48) == [(0, 100)]
    assert prefill_chunks([61, 60, 59, 58], 4096, 48) == [(0, 4)]  # padding 6 tokens < a forward's cost
    assert prefill_chunks([5000, 3000, 10, 10], 4096, 48) == [(0, 1), (1, 2), (2, 4)]
    for plan in (prefill_chunks(fresh, 1000, 48), prefill_chunks(fresh, 1000, None)):
        assert all((b - a) * fresh[a] <= 1000 for a, b in plan)
        assert [a for a, _ in plan][1:] == [b for _, b in plan][:-1] and plan[0][0] == 0 and plan[-1][1] == 31


def test_cut_groups_make_the_costliest_group_cheapest():
    from rlcr.policy.torch_engine import cut_groups

    assert cut_groups([10] * 32, 2, 8, 64) == [0, 16, 32]  # equal rows: equal halves
    # a few long rows: the group that holds them pads every row to them, so it takes fewer rows
    lengths = [20] * 40 + [120] * 8
    a, cut, b = cut_groups(lengths, 2, 8, 64)

    def cost(i, j):
        return (j - i) * (lengths[j - 1] + 64)

    assert (a, b) == (0, 48) and 48 - cut < cut
    assert max(cost(0, cut), cost(cut, 48)) == min(max(cost(0, k), cost(k, 48)) for k in range(8, 41))
    assert cut_groups(list(range(30)), 3, 8, 10)[1:3] == [13, 22]
    three = cut_groups(list(range(40)), 3, 8, 0)
    assert three[0] == 0 and three[-1] == 40 and all(y - x >= 8 for x, y in zip(three, three[1:], strict=False))
