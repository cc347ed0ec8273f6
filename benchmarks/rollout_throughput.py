"""Rollout throughput of the tiny policy: HF generate (per prompt, batched) vs our torch engine.

The load is one rollout round of the default experiment: 64 episodes x 3 agents = 192 prompts of
200-400 tokens, 48 new tokens each, sampled at temperature 1 with stops disabled so every engine
generates exactly the same number of tokens. Prints a table; asserts nothing.

    OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE python benchmarks/rollout_throughput.py
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from rlcr.config import ModelConfig  # noqa: E402
from rlcr.policy.engine import Sampling  # noqa: E402
from rlcr.policy.models import build_tiny  # noqa: E402
from rlcr.policy.torch_engine import TorchEngine  # noqa: E402


def cpu_seconds() -> float:
    """User + system CPU time of this process: unlike wall time, not inflated by other load."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Timer:
    """Wall and CPU seconds of a block."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), cpu_seconds()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, cpu_seconds() - self.cpu


def matmul_gflops(n: int = 1024, reps: int = 20) -> float:
    """Measured fp32 GFLOP/s of torch.mm on n x n matrices (the machine's practical ceiling)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    t = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b)
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


def flops_per_token(model, context_len: int) -> float:
    """2 x non-embedding params (matmuls) + attention (2 x 2 x layers x hidden x context) per token."""
    cfg = model.config
    params = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    params += cfg.vocab_size * cfg.hidden_size  # the tied lm_head matmul still runs
    return 2 * params + 4 * cfg.num_hidden_layers * cfg.hidden_size * context_len


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--naive-prompts", type=int, default=8, help="prompts timed for per-prompt HF generate")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    model, tok = build_tiny(ModelConfig(hidden_size=256, num_layers=4, num_heads=4, context=1024), seed=0)
    rng = random.Random(0)
    n_prompts = args.episodes * args.agents
    chars = list(range(4, len(tok)))  # printable characters, no specials
    prompts = [[tok.bos_token_id] + rng.choices(chars, k=rng.randint(200, 400)) for _ in range(n_prompts)]
    new = args.new_tokens
    gen_tokens = n_prompts * new
    mean_len = sum(map(len, prompts)) / n_prompts
    print(f"load: {n_prompts} prompts ({args.episodes} episodes x {args.agents} agents), "
          f"mean {mean_len:.0f} prompt tokens, {new} new tokens each, {args.threads} threads")

    rows = []
    with torch.inference_mode():
        # (a) HF generate, one prompt at a time (the straightforward implementation)
        with Timer() as t:
            for p in prompts[: args.naive_prompts]:
                model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                               do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new,
                               min_new_tokens=new, pad_token_id=tok.pad_token_id)
        scale = n_prompts / args.naive_prompts  # extrapolate the subset to the whole round
        rows.append(("HF generate, per prompt", t.wall * scale, t.cpu * scale))

        # (a') HF generate, all prompts in one left-padded batch
        L = max(map(len, prompts))
        ids = torch.full((n_prompts, L), tok.pad_token_id)
        att = torch.zeros(n_prompts, L, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, L - len(p):], att[i, L - len(p):] = torch.tensor(p), 1
        with Timer() as t:
            model.generate(ids, attention_mask=att, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                           max_new_tokens=new, min_new_tokens=new, pad_token_id=tok.pad_token_id)
        rows.append(("HF generate, batched (left pad)", t.wall, t.cpu))

    # (b) our engine: sorted chunked prefill + in-place KV cache
    engine = TorchEngine(model, tok)
    sampling = Sampling(temperature=1.0, max_new_tokens=new, ignore_eos=True, seed=0)
    engine.generate(prompts[:4], sampling)  # warm-up
    with Timer() as t:
        out = engine.generate(prompts, sampling)
    assert all(len(c.token_ids) == new for c in out)
    rows.append(("rlcr TorchEngine", t.wall, t.cpu))

    naive_wall, naive_cpu = rows[0][1], rows[0][2]
    print(f"\n{'engine':32s} {'gen tok/s':>9s} {'wall s':>7s} {'cpu s':>7s} {'x naive (wall)':>15s} {'x naive (cpu)':>14s}")
    for name, wall, cpu in rows:
        print(f"{name:32s} {gen_tokens / wall:9.0f} {wall:7.1f} {cpu:7.1f} {naive_wall / wall:15.1f} {naive_cpu / cpu:14.1f}")
    print(f"(per prompt: {args.naive_prompts} prompts timed, extrapolated to {n_prompts}; cpu s = user+sys of "
          "this process, robust to other load on the machine)")

    # distance to the hardware: all tokens processed (prompt + generated) x FLOPs per token
    gflops = matmul_gflops()
    fpt = flops_per_token(model, int(mean_len + new / 2))
    work = sum(map(len, prompts)) + gen_tokens
    achieved = work * fpt / rows[-1][1] / 1e9
    print(f"\nmodel: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, "
          f"{fpt / 1e6:.1f} MFLOP/token at {int(mean_len + new / 2)} tokens of context")
    print(f"machine: torch.mm 1024x1024 fp32 = {gflops:.1f} GFLOP/s on {args.threads} threads")
    print(f"engine: {work} tokens (prompt + generated) in {rows[-1][1]:.1f} s = {achieved:.1f} GFLOP/s "
          f"({100 * achieved / gflops:.0f}% of matmul peak)")


if __name__ == "__main__":
    main()
