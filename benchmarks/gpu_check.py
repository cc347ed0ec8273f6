"""GPU check of the `gpu` profile: one command on a CUDA machine, a table of what the GPU path costs.

    python benchmarks/gpu_check.py [--out DIR] [--tasks 4] [--gen-prompts 64] [--gen-tokens 128]

It builds a ~0.5B Qwen2-shaped model from a config (random weights, the project's `numbers`
tokenizer; nothing from the hub), saves it as an HF folder, then measures:

    engine tokens/s     the torch engine and vLLM (bf16) generating the same batch of prompts
    RL iterations       two iterations of `train()` with the gpu profile's train/engine/org settings
                        (DeepSpeed ZeRO-2, bf16, gradient checkpointing) on one-digit sums, fewer tasks
    train tokens/s      perf/trainer_tokens_per_s of those iterations (prompt + completion tokens
                        through forward and backward), and the peak CUDA memory of the RL loop (its
                        in-process vLLM, 0.5 of the GPU, plus the trainer)
    weight push         the loop's own push into its vLLM before every rollout
                        (perf/weight_push_seconds, mean of 2), and its share of an iteration

Budget: under 8 minutes on one 80 GB GPU (the rollouts of the two iterations dominate). Without CUDA,
vllm or deepspeed it stops at once, exit code 2, naming what is missing. What CPU tests check of it
(tests/test_gpu_check.py): the model config's size (a meta-device build) and the fail-fast exit.
"""

from __future__ import annotations

import argparse
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


def missing_requirements() -> list[str]:
    """What this machine lacks for the check (empty: ready)."""
    import torch

    out = []
    if not torch.cuda.is_available():
        out.append(f"a CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)")
    for pkg in ("vllm", "deepspeed"):
        if importlib.util.find_spec(pkg) is None:
            out.append(f"the {pkg} package")
    return out


def model_config(vocab_size: int, bos: int | None = None, eos: int | None = None, pad: int | None = None):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab_size, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, **QWEN2_05B)


def parameter_count(config) -> int:
    """Parameters of the model `config` builds, counted on the meta device (no memory, no weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def build_folder(folder: Path) -> Path:
    """The ~0.5B model, random init (seed 0), with the numbers tokenizer, saved as a float32 HF folder."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlcr.policy.models import save_policy
    from rlcr.policy.tokenizer import build_tokenizer

    tok = build_tokenizer("numbers", model_max_length=QWEN2_05B["max_position_embeddings"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config(len(tok), tok.bos_token_id, tok.eos_token_id,
                                                          tok.pad_token_id))
    return save_policy(model, tok, folder)


def gen_tokens_per_s(engine, prompts: list[list[int]], max_new: int) -> float:
    from rlcr.policy.engine import Sampling

    sampling = Sampling(temperature=1.0, max_new_tokens=max_new, ignore_eos=True, seed=0)
    engine.generate(prompts[:2], sampling)  # warm-up (kernels, graphs)
    t = time.perf_counter()
    out = engine.generate(prompts, sampling)
    return sum(len(c.token_ids) for c in out) / (time.perf_counter() - t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="working folder (default: a temp folder)")
    ap.add_argument("--tasks", type=int, default=4, help="tasks per RL iteration (x the profile's group size)")
    ap.add_argument("--gen-prompts", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    lacking = missing_requirements()
    if lacking:
        print("gpu_check needs " + "; ".join(lacking) + ". Run it on a CUDA machine with vllm and deepspeed "
              "installed.", file=sys.stderr)
        return 2

    import torch

    from rlcr.config import load_params
    from rlcr.policy.models import load_policy
    from rlcr.policy.torch_engine import TorchEngine
    from rlcr.policy.vllm_engine import VllmEngine
    from rlcr.tasks import build_family
    from rlcr.tracking import NullTracker
    from rlcr.train.loop import train

    t0 = time.perf_counter()
    work = args.out or Path(tempfile.mkdtemp(prefix="gpu_check-"))
    folder = build_folder(work / "model")
    params = load_params(ROOT / "params.yaml", {"model.path": str(folder), "train.iterations": 2,
                                                "train.tasks_per_iteration": args.tasks,
                                                "train.checkpoint_every": 2, "train.eval_tasks": 0},
                         profile="gpu")
    tok = load_policy(folder)[1]
    prompts = [tok(f"task:\n| {i % 10}+{(i * 7) % 10}\n")["input_ids"] for i in range(args.gen_prompts)]

    torch_engine = TorchEngine.from_folder(folder, device="cuda", dtype="bfloat16")
    torch_tps = gen_tokens_per_s(torch_engine, prompts, args.gen_tokens)
    del torch_engine
    torch.cuda.empty_cache()
    vllm_engine = VllmEngine.from_folder(folder, device="cuda", dtype="bfloat16", context=params.model.context,
                                         gpu_memory_utilization=0.3)
    vllm_tps = gen_tokens_per_s(vllm_engine, prompts, args.gen_tokens)
    vllm_engine.close()  # the loop builds its own

    torch.cuda.reset_peak_memory_stats()
    tasks = build_family("sum", {"digits": 1}).generate(0, 64, 1)
    res = train(params, folder, tasks, work / "policy", NullTracker(), ckpt_dir=work / "ckpt", register=False)
    peak_gb = torch.cuda.max_memory_allocated() / 2**30
    iteration_s = statistics.mean(h["perf/iteration_seconds"] for h in res.history)
    train_tps = statistics.mean(h["perf/trainer_tokens_per_s"] for h in res.history)
    push_s = statistics.mean(h["perf/weight_push_seconds"] for h in res.history)

    rows = {"parameters": parameter_count(model_config(len(tok))),
            "torch engine generated tokens/s (bf16)": torch_tps,
            "vLLM generated tokens/s (bf16)": vllm_tps,
            "ZeRO-2 bf16 training tokens/s (prompt + completion)": train_tps,
            "peak CUDA memory of the RL loop (vLLM + trainer), GiB": peak_gb,
            "RL iteration seconds (mean of 2)": iteration_s,
            "weight push to vLLM, seconds (mean of 2)": push_s,
            "weight push share of an iteration": push_s / iteration_s,
            "check wall seconds": time.perf_counter() - t0}
    width = max(len(k) for k in rows)
    for k, v in rows.items():
        print(f"{k:<{width}}  {v:,.3f}" if isinstance(v, float) else f"{k:<{width}}  {v:,}")
    (work / "gpu_check.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
