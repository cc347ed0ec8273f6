"""The manager's combine on its own: held-out combine observations, a policy's greedy answers, what goes wrong.

Scripted delegate and verify companies (rlcr/org/scripted.py, no worker errors) play the held-out sums of
data/tasks/eval.parquet (the built-in families) through the real scheduler, with the params.yaml org; every
CEO turn that combines its hires' posted results (`rlcr.behaviour.combine_is_right`) is kept with its
observation. The policy answers each observation greedily, and each answer is sorted:

    right       it delivers the sum of the posted results (plus the terms the CEO kept)
    copy        its last equation adds other operands than the scripted CEO's (a number copied wrong)
    arithmetic  the scripted CEO's operands, added wrong
    other       no equation with the right number of operands (malformed, another plan)

Each row is measured twice: on the held-out observations and on as many combine observations of the
TRAIN tasks of the same lengths, which the bootstrap imitated (a policy that memorised its traces
scores high on those only).
With --sft-steps the policy is first fine-tuned (`rlcr.train.sft.train_sft`, from the same start for
each value) on the combine turns alone of scripted episodes on the train tasks, or with --fresh-tasks
on fresh tasks of the train families (`rlcr.train.bootstrap.drill_tasks`, the drill's source); no
prompt is shared with the held-out ones (asserted): how far more combine examples take the sub-skill.

With --play N each row's policy also plays N held-out sums (all lengths) as a company and as a single
agent, sampled and greedy, through the real scheduler (`rlcr.train.bootstrap.quick_eval`, the bootstrap
stage's check): whether a better combine carries into whole episodes.

    python benchmarks/combine_skill.py [--policy models/bootstrap] [--sft-steps 0 200 600] [--lr 5e-4] [--fresh-tasks] [--play 96]

Prints a table; asserts nothing but the disjointness.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("right", "copy", "arithmetic", "other")


def combine_turns(tasks, params, len_fn, episodes: int, error_rates):
    """Kept CEO turns that combine hires' results, from scripted delegate/verify episodes on `tasks`."""
    from rlcr.behaviour import combine_is_right
    from rlcr.train.bootstrap import kept_turns, scripted_traces

    cfg = replace(params.bootstrap, episodes=episodes, styles={"delegate": 0.5, "verify": 0.5},
                  error_rates=error_rates, verify_error_rates=[])
    recs = scripted_traces(tasks, cfg, params.org, params.reward, len_fn)
    return [t for _, t in kept_turns(recs) if t.role == "ceo" and combine_is_right(t.prompt, t.completion)]


def task_line(prompt: str) -> str:
    """The task as the observation shows it (the line after `task:`)."""
    at = prompt.find("\ntask:\n")
    return prompt[at:].split("\n")[2] if at >= 0 else ""


def sort_answer(prompt: str, scripted: str, answer: str) -> str:
    """One of KINDS for a policy's `answer` to the observation the scripted CEO answered with `scripted`."""
    from rlcr.behaviour import combine_is_right
    from rlcr.org.scripted import terms_of

    if combine_is_right(prompt, answer):
        return "right"
    want = terms_of(scripted.split("=")[0]) or []
    eq = [line.split("=")[0] for line in answer.replace(";", "\n").splitlines() if "=" in line]
    got = terms_of(eq[-1]) if eq else None
    if not got or len(got) != len(want):
        return "other"
    return "arithmetic" if sorted(got) == sorted(want) else "copy"


def measure(model, tokenizer, turns, context: int, engine_cfg) -> tuple[Counter, list[tuple[str, str]]]:
    from rlcr.policy.bridge import decode_completion, prompt_ids
    from rlcr.policy.engine import Sampling
    from rlcr.policy.torch_engine import TorchEngine

    model.eval()
    eng = TorchEngine(model, tokenizer, device="cpu", dtype="float32", context=context)
    sampling = replace(Sampling.from_config(engine_cfg, seed=0), temperature=0.0)
    outs = eng.generate([prompt_ids(tokenizer, t.prompt) for t in turns], sampling)
    kinds, wrong = Counter(), []
    for t, o in zip(turns, outs, strict=True):
        answer = decode_completion(tokenizer, o.token_ids)
        kind = sort_answer(t.prompt, t.completion, answer)
        kinds[kind] += 1
        if kind != "right" and len(wrong) < 3:
            wrong.append((t.completion.replace("\n", " | "), answer.replace("\n", " | ")))
    return kinds, wrong


def play(model, tokenizer, held, params, n: int) -> str:
    """Success by task length of `n` held-out sums played as a company and as a single agent, sampled
    and greedy (the bootstrap stage's held-out check), as one line."""
    from rlcr.train.bootstrap import quick_eval

    m = quick_eval(model, tokenizer, held, n, params.org, params.reward, params.engine,
                   min(params.model.context, params.org.context_tokens), params.bootstrap.seed)
    lengths = sorted({t.difficulty for t in held})
    return "; ".join(f"{org} {how} " + " / ".join(f"d{d} {m[f'bootstrap/{org}/{how}/d{d}']:.2f}" for d in lengths
                                                 if f"bootstrap/{org}/{how}/d{d}" in m)
                     for org in ("company", "single") for how in ("sampled", "greedy"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", default=str(ROOT / "models/bootstrap"))
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--tasks", default=str(ROOT / "data/tasks"), help="the prepare stage's train/eval parquet folder")
    ap.add_argument("--sft-steps", type=int, nargs="+", default=[0])
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--train-episodes", type=int, default=4000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fresh-tasks", action="store_true", help="SFT turns from fresh train-family tasks, not the train split")
    ap.add_argument("--play", type=int, default=0, help="also play this many held-out sums per row (0: no episodes)")
    args = ap.parse_args()

    import pandas as pd
    import torch

    from rlcr.config import load_params
    from rlcr.policy.bridge import token_length_fn
    from rlcr.policy.models import load_policy
    from rlcr.tasks.suite import from_frame
    from rlcr.train.bootstrap import drill_tasks, turn_example
    from rlcr.train.sft import train_sft

    torch.set_num_threads(args.threads)
    params = load_params(args.params)
    _, tokenizer = load_policy(args.policy)
    len_fn = token_length_fn(tokenizer)
    builtin = ("sum", "signed_sum")
    train = [t for t in from_frame(pd.read_parquet(Path(args.tasks) / "train.parquet")) if t.family in builtin]
    held = [t for t in from_frame(pd.read_parquet(Path(args.tasks) / "eval.parquet")) if t.family in builtin]
    assert not {t.prompt for t in train} & {t.prompt for t in held}, "held-out tasks share prompts with training"
    held_turns = combine_turns(held, params, len_fn, episodes=2 * len(held), error_rates=[0.0])
    lengths = {t.difficulty for t in held}  # the same task lengths: a 3-term combine adds one pair sum, a 4-term one two
    seen = [t for t in train if t.difficulty in lengths]
    seen_turns = combine_turns(seen, params, len_fn, episodes=2 * len(held), error_rates=[0.0])[:len(held_turns)]
    source = train
    if args.fresh_tasks:
        source = drill_tasks(params.prepare.train, params.bootstrap.seed, {t.prompt.replace(" ", "") for t in held})
        trained_lengths = {t.difficulty for t in train}
        source = [t for t in source if t.difficulty in trained_lengths]
    train_turns = combine_turns(source, params, len_fn, episodes=args.train_episodes, error_rates=params.bootstrap.error_rates)
    assert not {t.prompt for t in train_turns} & {t.prompt for t in held_turns}
    print(f"policy {args.policy}: {len(held_turns)} held-out combine observations ({len(held)} eval sums), "
          f"{len(train_turns)} SFT combine turns from {'fresh train-family' if args.fresh_tasks else 'the train'} tasks "
          f"({len({task_line(t.prompt) for t in train_turns})} distinct tasks), {args.threads} threads")
    print("| combine-only SFT steps | observations | right | copy error | arithmetic error | other | SFT s |")
    print("|---|---|---|---|---|---|---|")
    examples = [turn_example(tokenizer, t.prompt, t.completion) for t in train_turns]
    for steps in args.sft_steps:
        model, _ = load_policy(args.policy)
        took = 0.0
        if steps:
            cfg = replace(params.bootstrap, steps=steps, lr=args.lr, warmup_steps=10, batch_size=16)
            t0 = time.perf_counter()
            train_sft(model, examples, cfg, pad_id=tokenizer.pad_token_id)
            took = time.perf_counter() - t0
        for name, turns in (("held-out", held_turns), ("train tasks", seen_turns)):
            kinds, wrong = measure(model, tokenizer, turns, params.org.context_tokens, params.engine)
            n = sum(kinds.values())
            if not n:
                print(f"| {steps} | {name} | no combine observations | | | | |")
                continue
            print(f"| {steps} | {name} | " + " | ".join(f"{kinds[k] / n:.2f} ({kinds[k]})" for k in KINDS) + f" | {took:.0f} |")
            for want, got in wrong if name == "held-out" else []:
                print(f"    scripted `{want}`  policy `{got}`")
        if args.play:
            print(f"    episodes, {args.play} held-out sums: {play(model, tokenizer, held, params, args.play)}")


if __name__ == "__main__":
    main()
