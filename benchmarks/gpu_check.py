"""GPU check of the `gpu` profile: one command on a CUDA machine, a table of what the GPU path costs.

    python benchmarks/gpu_check.py [--out DIR] [--json FILE] [--tasks 4] [--gen-prompts 64] [--gen-tokens 128]
                                   [--engine vllm|torch] [--backend deepspeed|torch] [--token-budget N] [--smoke]

It builds a ~0.5B Qwen2-shaped model from a config (random weights, the project's `numbers`
tokenizer; nothing from the hub), saves it as an HF folder, then measures:

    engine tokens/s     the torch engine and vLLM (bf16) generating the same batch of prompts
    RL iterations       two iterations of `train()` with the gpu profile's train/engine/org settings
                        (DeepSpeed ZeRO-2, bf16, gradient checkpointing) on one-digit sums, fewer tasks
    train tokens/s      perf/trainer_tokens_per_s of those iterations (prompt + completion tokens
                        through forward and backward), and the peak CUDA memory of the RL loop (its
                        rollout engine, in-process vLLM at 0.5 of the GPU or a bf16 torch engine, plus
                        the trainer)
    weight push         the loop's own push into its rollout engine before every rollout
                        (perf/weight_push_seconds, mean of 2), and its share of an iteration

`--engine torch` runs on a machine without vllm: vLLM is not measured (its row says so and why) and
the RL loop samples with the torch engine (engine.kind torch, bf16, on CUDA). `--backend torch` trains
with the torch backend (AdamW, bf16 autocast) where deepspeed is missing; the table names the engine
and backend the loop ran. `--smoke` runs the same code on the CPU with a 2-layer model of the same
shape family (a test of the code path, not a measurement: tests/test_gpu_check.py runs it).

Budget: the rollouts of the two iterations dominate. Measured on one H200 with `--engine torch
--backend deepspeed --token-budget 512`: 167 s wall, of which 61 s an iteration (55 s its rollout: the
torch engine's decode step took 50 ms at batch 1 and 52 ms at batch 64); at the profile's token budget
(1024) the first iteration alone took 149 s (README, "gpu_check on an H200"). Without CUDA,
or without the vllm / deepspeed package that --engine / --backend name, it stops at once, exit code 2,
naming what is missing. The results go to `--json` (default `<out>/gpu_check.json`), rewritten after
each measurement, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QWEN2_05B = {"hidden_size": 1280, "num_hidden_layers": 24, "num_attention_heads": 10, "num_key_value_heads": 2,
             "intermediate_size": 4352, "max_position_embeddings": 4096, "rope_theta": 1_000_000.0,
             "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
"""A Qwen2 decoder of ~0.5B parameters with the project's small `numbers` vocabulary: Qwen2.5-0.5B's
~136M embedding parameters (151936 x 896) moved into width (1280, head size 128 as in Qwen2.5) so
the decoder does ~0.5B parameters of work per token, which is what the timings are about."""

SMOKE = {**QWEN2_05B, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}
"""`--smoke`: the same config with 2 layers of width 64 (head size 16), for a CPU run of the code path."""


def missing_requirements(engine: str = "vllm", backend: str = "deepspeed", device: str = "cuda") -> list[str]:
    """What this machine lacks for the check with this engine, backend and device (empty: ready)."""
    import torch

    out = []
    if device == "cuda" and not torch.cuda.is_available():
        out.append(f"a CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)")
    for pkg in dict.fromkeys(p for p in (engine, backend) if p in ("vllm", "deepspeed")):
        if importlib.util.find_spec(pkg) is None:
            flag = "--engine torch" if pkg == "vllm" else "--backend torch"
            out.append(f"the {pkg} package (or {flag})")
    return out


def model_config(vocab_size: int, bos: int | None = None, eos: int | None = None, pad: int | None = None,
                 shape: dict | None = None):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab_size, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad,
                       **(shape or QWEN2_05B))


def parameter_count(config) -> int:
    """Parameters of the model `config` builds, counted on the meta device (no memory, no weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def build_folder(folder: Path, shape: dict | None = None) -> Path:
    """The ~0.5B model (or `shape`), random init (seed 0), with the numbers tokenizer, saved as a float32
    HF folder."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcr.policy.models import save_policy
    from rlcr.policy.tokenizer import build_tokenizer

    shape = shape or QWEN2_05B
    tok = build_tokenizer("numbers", model_max_length=shape["max_position_embeddings"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config(len(tok), tok.bos_token_id, tok.eos_token_id,
                                                          tok.pad_token_id, shape))
    return save_policy(model, tok, folder)


def gen_tokens_per_s(engine, prompts: list[list[int]], max_new: int) -> float:
    """Generated tokens per second of one batch of `prompts`, `max_new` tokens each, after a warm-up."""
    import torch

    from rlcr.policy.engine import Sampling

    sampling = Sampling(temperature=1.0, max_new_tokens=max_new, ignore_eos=True, seed=0)
    engine.generate(prompts[:2], sampling)  # warm-up (kernels, graphs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter()
    out = engine.generate(prompts, sampling)
    return sum(len(c.token_ids) for c in out) / (time.perf_counter() - t)


@contextlib.contextmanager
def stand_in_advantages(seed: int = 0):
    """The RL loop's advantages, except that an iteration whose advantages are all 0 gets a seeded N(0, 1)
    draw instead -> the list of iterations (True: replaced).

    A random-weight model earns the same reward in every episode (every turn breaks the protocol and
    every episode spends the whole token budget), so every advantage is 0 and the loop, which leaves
    zero-advantage turns out when kl_coef is 0, would train on nothing. What an update costs (its
    tokens, micro-batches, forwards, backwards and step) does not depend on the advantages' values,
    so with the stand-ins the timing is that of a run whose groups have unequal rewards."""
    import torch

    import rlcr.train.loop as loop

    real, used = loop.group_advantages, []
    gen = torch.Generator().manual_seed(seed)

    def advantages(rewards, groups, *args, **kwargs):
        adv = real(rewards, groups, *args, **kwargs)
        used.append(bool(len(adv)) and bool((adv == 0).all()))
        return torch.randn(len(adv), generator=gen, dtype=adv.dtype) if used[-1] else adv

    loop.group_advantages = advantages
    try:
        yield used
    finally:
        loop.group_advantages = real


PER_ITERATION = ("perf/iteration_seconds", "perf/weight_push_seconds", "perf/rollout_seconds",
                 "perf/update_seconds", "rollout/tokens", "perf/rollout_tokens_per_s", "train/turns",
                 "perf/trainer_tokens_per_s")
"""What each RL iteration records as it ends (a run cut short keeps the iterations it finished)."""


def iteration_tracker(record):
    """The loop's tracker: tracking off (NullTracker), but PER_ITERATION of every iteration recorded."""
    from rlcr.tracking import NullTracker

    class IterationTracker(NullTracker):
        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            record(f"RL iteration {step}", {k: round(metrics[k], 4) for k in PER_ITERATION if k in metrics})

    return IterationTracker()


BACKENDS = {"deepspeed": "DeepSpeed ZeRO-{zero} {bf16}, gradient checkpointing {gc}",
            "torch": "torch AdamW, {bf16} autocast, gradient checkpointing {gc} (--backend torch)"}

TORCH_BACKEND = {"train.zero_stage": 0, "train.gradient_checkpointing": False}
"""--backend torch: the DeepSpeed-only settings of the gpu profile turned off (params.yaml refuses them)."""


def vllm_not_measured() -> str:
    """The vLLM row's text when the check runs without it: why."""
    if importlib.util.find_spec("vllm") is None:
        return "not measured: the vllm package is not installed on this machine (--engine torch)"
    return "not measured: --engine torch"


def print_table(rows: dict) -> None:
    width = max(len(k) for k in rows)
    for k, v in rows.items():
        if isinstance(v, float):
            print(f"{k:<{width}}  {v:,.3f}")
        elif isinstance(v, int):
            print(f"{k:<{width}}  {v:,}")
        else:
            print(f"{k:<{width}}  {v}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="working folder (default: a temp folder)")
    ap.add_argument("--json", type=Path, default=None, help="results file (default: <out>/gpu_check.json)")
    ap.add_argument("--tasks", type=int, default=4, help="tasks per RL iteration (x the profile's group size)")
    ap.add_argument("--gen-prompts", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--engine", choices=("vllm", "torch"), default="vllm",
                    help="the RL loop's rollout engine (vllm: the gpu profile's; torch: no vLLM on this machine, "
                         "vLLM is not measured)")
    ap.add_argument("--backend", choices=("deepspeed", "torch"), default="deepspeed",
                    help="the RL loop's optimiser backend (deepspeed: the gpu profile's)")
    ap.add_argument("--token-budget", type=int, default=None,
                    help="org.token_budget of the RL episodes (default: the gpu profile's); fewer rounds, shorter rollouts")
    ap.add_argument("--smoke", action="store_true",
                    help="the code path on the CPU with a 2-layer model: a test, not a measurement")
    args = ap.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    lacking = missing_requirements(args.engine, args.backend, device)
    if lacking:
        print("gpu_check needs " + "; ".join(lacking) + ". Run it on a CUDA machine with vllm and deepspeed "
              "installed (or name --engine torch / --backend torch).", file=sys.stderr)
        return 2

    import torch

    from rlcr.config import load_params
    from rlcr.policy.models import load_policy
    from rlcr.policy.torch_engine import TorchEngine
    from rlcr.tasks import build_family
    from rlcr.train.loop import train

    t0 = time.perf_counter()
    cuda = device == "cuda"
    work = args.out or Path(tempfile.mkdtemp(prefix="gpu_check-"))
    work.mkdir(parents=True, exist_ok=True)
    json_path = args.json or work / "gpu_check.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    shape = SMOKE if args.smoke else QWEN2_05B
    rows: dict = {}

    def record(key: str, value) -> None:
        """One result: printed at once, and the results file rewritten (a run cut short keeps it)."""
        rows[key] = value
        print(f"[gpu_check] {key}: {value:,.3f}" if isinstance(value, float) else f"[gpu_check] {key}: {value}",
              flush=True)
        json_path.write_text(json.dumps(rows, indent=2))

    if cuda:
        record("device", f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    else:
        record("device", f"CPU (--smoke: a code-path test, not a measurement), torch {torch.__version__}")
    folder = build_folder(work / "model", shape)
    params = load_params(ROOT / "params.yaml", {"model.path": str(folder), "train.iterations": 2,
                                                "train.tasks_per_iteration": args.tasks,
                                                "train.checkpoint_every": 2, "train.eval_tasks": 0,
                                                "engine.kind": args.engine, "engine.device": device,
                                                "train.backend": args.backend,
                                                **(TORCH_BACKEND if args.backend == "torch" else {}),
                                                **({"org.token_budget": args.token_budget} if args.token_budget else {})},
                         profile="gpu")
    profile_budget = load_params(ROOT / "params.yaml", profile="gpu").org.token_budget
    tok = load_policy(folder)[1]
    record("parameters", parameter_count(model_config(len(tok), shape=shape)))
    prompts = [tok(f"task:\n| {i % 10}+{(i * 7) % 10}\n")["input_ids"] for i in range(args.gen_prompts)]

    torch_engine = TorchEngine.from_folder(folder, device=device, dtype="bfloat16")
    record("torch engine generated tokens/s (bf16)", gen_tokens_per_s(torch_engine, prompts, args.gen_tokens))
    del torch_engine
    if cuda:
        torch.cuda.empty_cache()
    if args.engine == "vllm":
        from rlcr.policy.vllm_engine import VllmEngine

        vllm_engine = VllmEngine.from_folder(folder, device=device, dtype="bfloat16", context=params.model.context,
                                             gpu_memory_utilization=0.3)
        record("vLLM generated tokens/s (bf16)", gen_tokens_per_s(vllm_engine, prompts, args.gen_tokens))
        vllm_engine.close()  # the loop builds its own
    else:
        record("vLLM generated tokens/s (bf16)", vllm_not_measured())

    cfg = params.train
    engine_name = (f"{'vLLM in-process' if args.engine == 'vllm' else 'torch engine'} "
                   f"({params.engine.dtype}, {params.engine.device})")
    backend_name = BACKENDS[cfg.backend].format(zero=cfg.zero_stage, bf16="bf16" if cfg.bf16 else "fp32",
                                                gc="on" if cfg.gradient_checkpointing else "off")
    record("RL loop: rollout engine", engine_name)
    record("RL loop: trainer backend", backend_name)
    record("RL loop: episodes per iteration", cfg.tasks_per_iteration * cfg.group_size)
    org = params.org
    record("RL loop: org.token_budget, max_turn_tokens",
           f"{org.token_budget}, {org.max_turn_tokens}"
           + (f" (the gpu profile's token_budget is {profile_budget}: --token-budget)"
              if org.token_budget != profile_budget else " (the gpu profile's)"))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    tasks = build_family("sum", {"digits": 1}).generate(0, 64, 1)
    with stand_in_advantages(cfg.seed) as replaced:
        res = train(params, folder, tasks, work / "policy", iteration_tracker(record), ckpt_dir=work / "ckpt",
                    register=False)
    hist = res.history
    record("RL loop: iterations with stand-in advantages (all rewards equal)",
           f"{sum(replaced)} of {len(replaced)} (seeded N(0, 1): a random-weight model earns one reward)")
    record("RL loop: turns trained per iteration", ", ".join(f"{h['train/turns']:.0f}" for h in hist))

    def mean(key: str) -> float:
        return statistics.mean(h[key] for h in hist)

    if cuda:
        record("peak CUDA memory of the RL loop (engine + trainer), GiB", torch.cuda.max_memory_allocated() / 2**30)
        record("peak CUDA memory reserved by torch in the RL loop, GiB", torch.cuda.max_memory_reserved() / 2**30)
    else:
        record("peak CUDA memory of the RL loop (engine + trainer), GiB", "not measured: CPU (--smoke)")
    iteration_s, push_s = mean("perf/iteration_seconds"), mean("perf/weight_push_seconds")
    record("RL iteration seconds (mean of 2)", iteration_s)
    record("RL iteration seconds, each", ", ".join(f"{h['perf/iteration_seconds']:.2f}" for h in hist))
    record("rollout seconds (mean of 2)", mean("perf/rollout_seconds"))
    record("rollout generated tokens (mean of 2)", mean("rollout/tokens"))
    record("rollout generated tokens/s (mean of 2)", mean("perf/rollout_tokens_per_s"))
    record("update seconds (mean of 2)", mean("perf/update_seconds"))
    record(f"training tokens/s, prompt + completion ({cfg.backend}, mean of 2)", mean("perf/trainer_tokens_per_s"))
    record("weight push to the rollout engine, seconds (mean of 2)", push_s)
    record("weight push share of an iteration", push_s / iteration_s)
    record("check wall seconds", time.perf_counter() - t0)
    print()
    print_table(rows)
    print(f"\n(results: {json_path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
