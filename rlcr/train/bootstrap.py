"""Bootstrap: scripted organisations -> traces -> SFT warm start, and a quick held-out check.

RL from a collective reward needs a policy that already succeeds sometimes (measured: REINFORCE
from a 9% model learned nothing), so the shared policy first imitates hand-written organisations.

traces    Each episode plays a TRAIN task (cycled to `bootstrap.episodes`) with a style drawn from
          the `bootstrap.styles` weights: the solo, delegate and verify companies of
          `rlcr.org.scripted`, or `single` (the solo script under `org.single_agent`, so the
          baseline's observations are covered too), and a worker error rate drawn from
          `bootstrap.error_rates`. All run through `run_episodes` with the pipeline's own org
          config and the tokenizer's length function, so every observation is exactly what the
          scheduler renders for the learned policy later. A round of all episodes is one batch.
filter    An agent's turns are imitated only when everything the agent itself asserted is true:
          each equation it wrote holds, each APPROVE/REJECT fits the truth of the claim it judged,
          a SUBMIT it made verifies (a CEO whose episode ended with no right answer, submitted or
          not, is left out: it may have waited in vain). So the policy learns correct behaviour in
          situations that hold other agents' errors (a verifier sees a wrong post and rejects it; a
          CEO sees the REJECT and rehires) and never imitates an error. Whole failed episodes are not thrown away:
          that would hide exactly the situations verifiers exist for.
examples  One per kept turn: prompt_ids(observation) is context, completion_ids(turn) (text + eos)
          the loss-carrying target; THE encoding of `rlcr.policy.bridge`.
tails     A turn that copies or judges other agents' results (a manager's combine `12+3=15` of its
          workers' posts, a verifier's verdict) is rarer than the turns around it and was the weak
          sub-skill (measured: greedy CEOs combined the wrong numbers in most 4-term tasks while every
          worker was right). Options (off by default, measured in params.yaml's comment): such
          turns count `bootstrap.reuse_weight` times among the trace examples, and
          `bootstrap.tail_share` of the drill's examples are their observation's tail (from the
          status line: task or brief, then the posts) followed by the turn.
drill     (tiny only) `bootstrap.drill_share` of the steps train worked sums instead,
          `<bos>68+57+42+37=` -> `68+57=125;125+42=167;167+37=204\\n`: copying numbers from
          earlier text and adding two of them, the skills behind every role's turn, at ~30 tokens
          an example instead of ~400. Measured on 2 cores: the traces alone teach the protocol's
          format but too few sums to add (a sum is ~3 loss tokens in ~400).
sft       `rlcr.train.sft.train_sft`; first `bootstrap.drill_first` steps of the drill alone (a
          curriculum: arithmetic, then the protocol), then `bootstrap.steps` steps in which each is
          either a trace batch or a drill batch (`step_batches`), never both: a drill example
          padded to a trace's length is waste.

Instruct profiles (model.kind smollm2 / hf) take no SFT by default: the bootstrap policy is the
base model prompted with the protocol; models/bootstrap holds the materialized base folder's files
as HARD LINKS (copies across filesystems), see `link_base`. With `bootstrap.instruct_steps` > 0 they
take a short LoRA SFT on the same scripted traces instead (`instruct_sft`): every example's context
is `prompt_ids` of the observation, the chat template with the protocol system prompt that
`EnginePolicy` sends to the engine at rollout time, so SFT and rollouts see the same tokens; no
drill (the arithmetic drill is the tiny model's); the adapters are merged into models/bootstrap.

The quick check (`quick_eval`) runs held-out built-in sums (sum, signed_sum; each difficulty) as a
company and as a single agent, sampled at engine.temperature and greedy, through EnginePolicy and
the torch engine: the numbers that say whether RL will have a signal.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from rlcr.behaviour import behaviour_metrics, turn_is_correct
from rlcr.config import BootstrapConfig, EngineConfig, OrgConfig, Params, RewardConfig
from rlcr.org.episode import Generation, LengthFn, Request, run_episodes
from rlcr.org.records import EpisodeRecord
from rlcr.org.scripted import ScriptedOrg, render_sum
from rlcr.policy.bridge import EnginePolicy, completion_ids, prompt_ids, token_length_fn
from rlcr.policy.engine import Sampling
from rlcr.policy.tokenizer import encode
from rlcr.tasks import Task
from rlcr.train.sft import SFTExample, train_sft

STYLES = ("solo", "delegate", "verify", "single")


# ------------------------------------------------------------------------------------------ traces


@dataclass(frozen=True)
class TraceSpec:
    """How one scripted episode is played."""

    style: str
    error_rate: float


class _PerEpisode:
    """A policy that hands each request to the scripted organisation of its episode."""

    def __init__(self, orgs: dict[str, ScriptedOrg]):
        self.orgs = orgs

    def generate_batch(self, requests: Sequence[Request]) -> list[Generation]:
        return [Generation(self.orgs[r.episode_id].act(r)) for r in requests]


def draw_specs(n: int, cfg: BootstrapConfig) -> list[TraceSpec]:
    """n (style, error rate) draws from the configured mixture; a pure function of cfg.seed."""
    rng = random.Random(f"bootstrap-mixture:{cfg.seed}")
    styles = [s for s in STYLES if cfg.styles.get(s, 0) > 0]
    weights = [cfg.styles[s] for s in styles]
    out = []
    for _ in range(n):
        style = rng.choices(styles, weights)[0]
        out.append(TraceSpec(style, rng.choice(cfg.verify_error_rates if style == "verify" and cfg.verify_error_rates
                                                 else cfg.error_rates)))
    return out


def scripted_traces(tasks: Sequence[Task], cfg: BootstrapConfig, org: OrgConfig, reward: RewardConfig,
                    len_fn: LengthFn) -> list[EpisodeRecord]:
    """One scripted episode per task (tasks cycled to cfg.episodes), styles and error rates drawn
    from the mixture; company and single-agent episodes each run as one lock-step batch."""
    if not tasks:
        raise ValueError("no training tasks for the scripted traces")
    picked = [tasks[i % len(tasks)] for i in range(cfg.episodes)]
    specs = draw_specs(len(picked), cfg)
    records: list[EpisodeRecord] = []
    for single in (False, True):
        idx = [i for i, s in enumerate(specs) if (s.style == "single") == single]
        if not idx:
            continue
        ids = [f"boot{i}:{specs[i].style}:{picked[i].id}" for i in idx]
        orgs = {
            eid: ScriptedOrg(style="solo" if single else specs[i].style, error_rate=specs[i].error_rate,
                             verifier_error_rate=cfg.verifier_error_rate, seed=cfg.seed, len_fn=len_fn)
            for eid, i in zip(ids, idx, strict=True)
        }
        org_cfg = replace(org, single_agent=single)
        records += run_episodes([picked[i] for i in idx], _PerEpisode(orgs), org_cfg, reward,
                                len_fn=len_fn, episode_ids=ids)
    return records


# ------------------------------------------------------------------------------------------ filter


def correct_agents(record: EpisodeRecord) -> set[int]:
    """Agents all of whose own assertions are true (see the module docstring)."""
    bad = {t.agent for t in record.turns if not turn_is_correct(t.completion, t.prompt)}
    if record.episode.outcome < 1.0:  # a wrong answer, or none: its submitter (else the CEO, who waited in vain)
        bad.add(record.episode.submitter if record.episode.submitter >= 0 else 0)
    return {t.agent for t in record.turns} - bad


def kept_turns(records: Sequence[EpisodeRecord]):
    """(record, turn) pairs the bootstrap trains on."""
    for rec in records:
        good = correct_agents(rec)
        for t in rec.turns:
            if t.agent in good:
                yield rec, t


def trace_stats(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """What the traces hold: success by style, turns kept by role, lengths."""
    out: dict[str, float] = {"traces/episodes": len(records)}
    kept = list(kept_turns(records))
    all_turns = [t for r in records for t in r.turns]
    out["traces/turns"] = len(all_turns)
    out["traces/turns_kept"] = len(kept)
    out["traces/success"] = sum(r.episode.outcome for r in records) / max(1, len(records))
    by_style: dict[str, list[float]] = {}
    for r in records:
        by_style.setdefault(r.episode.episode_id.split(":")[1], []).append(r.episode.outcome)
    for s, v in sorted(by_style.items()):
        out[f"traces/{s}/episodes"] = len(v)
        out[f"traces/{s}/success"] = sum(v) / len(v)
    for role, n in sorted(Counter(t.role for _, t in kept).items()):
        out[f"traces/kept_turns/{role}"] = n
    if kept:
        out["traces/prompt_chars_mean"] = sum(len(t.prompt) for _, t in kept) / len(kept)
        out["traces/prompt_chars_max"] = max(len(t.prompt) for _, t in kept)
        out["traces/completion_chars_mean"] = sum(len(t.completion) for _, t in kept) / len(kept)
    return out



# ---------------------------------------------------------------------------------------- examples


def turn_example(tokenizer, prompt: str, completion: str) -> SFTExample:
    """prompt_ids(observation) as context, completion_ids(turn) as the loss-carrying target."""
    p, c = prompt_ids(tokenizer, prompt), completion_ids(tokenizer, completion)
    return SFTExample(tuple(p + c), tuple([0] * len(p) + [1] * len(c)))


def builds_on_others(turn) -> bool:
    """A verifier's turn, or a turn with an equation whose observation holds posts to it: the turns
    that copy and judge other agents' results (`bootstrap.reuse_weight`)."""
    return turn.role == "verifier" or ("=" in turn.completion and "\nfor you (" in turn.prompt)


def observation_tail(prompt: str) -> str:
    """The observation from its status line (`round 3 of 12 | tokens left 466`) on: the task or brief
    and the posts to this agent, what a combine or a verdict copies from."""
    at = prompt.rfind("\nround ")
    return prompt[at + 1:] if at >= 0 else prompt


def tail_examples(records: Sequence[EpisodeRecord], tokenizer) -> list[SFTExample]:
    """One short example per kept turn that builds on others' results: the observation's tail, then
    the turn (loss on the turn only), ~50 tokens instead of ~400 (`bootstrap.tail_share`)."""
    return [turn_example(tokenizer, observation_tail(t.prompt), t.completion)
            for _, t in kept_turns(records) if builds_on_others(t)]


def mix_in(drill: list[SFTExample], extra: Sequence[SFTExample], share: float, seed: int) -> list[SFTExample]:
    """`drill` with a `share` of its places (spread evenly) taken by `extra` examples, shuffled and cycled."""
    if not extra or share <= 0:
        return drill
    pool = list(extra)
    random.Random(f"bootstrap-tails:{seed}").shuffle(pool)
    out, j = list(drill), 0
    for i in range(len(out)):
        if int((i + 1) * share) > int(i * share):
            out[i], j = pool[j % len(pool)], j + 1
    return out


def trace_examples(records: Sequence[EpisodeRecord], tokenizer, context: int,
                   reuse_weight: int = 1) -> tuple[list[SFTExample], int]:
    """(examples of the kept turns, a turn that builds on others' results `reuse_weight` times; how
    many turns did not fit `context` and were left out)."""
    out, too_long = [], 0
    for _, t in kept_turns(records):
        ex = turn_example(tokenizer, t.prompt, t.completion)
        if len(ex.input_ids) > context:
            too_long += 1
            continue
        out += [ex] * (reuse_weight if builds_on_others(t) else 1)
    return out, too_long


_SUM = re.compile(r"^-?\d+(?:[-+]\d+)+$")


LONG_PART = 8
"""Sums longer than this are never added in one go by the scripted roles: a worker gets a part of at
most this many terms, a single agent adds about this many per turn (the per-turn cap)."""


def sum_shapes(tasks: Sequence[Task]) -> list[list[int]]:
    """The sums the company's roles actually add, from the tasks' prompts and sub-problems: a short
    sum (`87+21+96+91`), its pairs (`87+21`, `96+91`) and the combine (`108+187`). A long sum (more
    than LONG_PART terms) is never added whole: its shapes are the parts a worker gets (the flat split
    of the task-file protocol, `HIRE <k> worker: task.txt`), the manager's sum of those parts' results,
    and the stretches a single agent adds per turn (its running sum, then the next LONG_PART + 1 terms)."""
    out: list[list[int]] = []
    for t in tasks:
        exprs = [e.replace(" ", "") for e in (t.prompt, *(sp.prompt for sp in t.subproblems))]
        sums = [[int(x) for x in re.findall(r"[-+]?\d+", e)] for e in exprs if _SUM.match(e)]
        if not sums or len(sums[0]) <= LONG_PART:
            out += sums
            continue
        terms = sums[0]
        out += long_sum_shapes(terms)
    return out


def long_sum_shapes(terms: Sequence[int]) -> list[list[int]]:
    """What the roles add of one long sum (see sum_shapes)."""
    from rlcr.org.protocol import split_lines
    from rlcr.org.scripted import flat_parts

    parts = [list(terms[a - 1 : b]) for a, b in split_lines(1, len(terms), flat_parts(len(terms)))]
    out = [*parts, [sum(p) for p in parts]]
    w = LONG_PART + 1
    out.append(list(terms[: w + 1]))
    for i in range(w, len(terms) - 1, w):
        out.append([sum(terms[: i + 1]), *terms[i + 1 : i + 1 + w]])
    return out


def drill_tasks(specs, seed: int, exclude: set[str], n: int = 2000) -> list[Task]:
    """Fresh tasks of the train split's sum families (`sum`, `signed_sum`: any family whose tasks carry
    a reduction tree of sums), drawn with seeds of their own, without any task whose prompt is in
    `exclude` (the eval prompts): the source of the drill's sums."""
    from rlcr.tasks import build_family

    out: list[Task] = []
    for i, spec in enumerate(specs):
        if spec.name not in ("sum", "signed_sum"):
            continue
        family = build_family(spec.name, spec.options)
        for d in spec.difficulties:
            # a long sum yields ~11 shapes (sum_shapes), a short one 1-4: fewer long tasks keep the mix
            k = n // 4 if d + 1 > LONG_PART else n
            tasks = family.generate(derived_drill_seed(seed, i, d), k, d)
            out += [t for t in tasks if t.prompt.replace(" ", "") not in exclude]
    return out


def fresh_sum_tasks(specs, min_difficulty: int, seed: int, n: int, exclude: set[str],
                    option: str) -> tuple[list[Task], int]:
    """(`drill_tasks` of the train split's sum families with `seed`, no prompt in `exclude`; the least
    difficulty kept of them: `min_difficulty`, or their longest where all stop below it).
    No sum family: an error naming `bootstrap.<option>`, the option that asked for fresh tasks."""
    tasks = drill_tasks(specs, seed, exclude, n=n)
    if not tasks:
        raise ValueError(f"bootstrap.{option} > 0 needs a sum family (sum, signed_sum) in prepare.train "
                         f"(or set bootstrap.{option}: 0)")
    return tasks, min(min_difficulty, max(t.difficulty for t in tasks))


def fresh_trace_tasks(specs, cfg: BootstrapConfig, exclude: set[str]) -> list[Task]:
    """The fresh tasks of the scripted traces (`bootstrap.fresh_share`): the drill's source (`drill_tasks`,
    no prompt in `exclude`) in a seeded shuffle, the first `cfg.episodes` of them, those of difficulty >=
    `cfg.fresh_min_difficulty` kept (>= the longest the train split's sums have, where they stop below it)."""
    tasks, low = fresh_sum_tasks(specs, cfg.fresh_min_difficulty, cfg.seed, cfg.episodes, exclude, "fresh_share")
    random.Random(f"bootstrap-traces:{cfg.seed}").shuffle(tasks)
    return [t for t in tasks[: cfg.episodes] if t.difficulty >= low] or [t for t in tasks if t.difficulty >= low]


def reuse_traces(specs, cfg: BootstrapConfig, org: OrgConfig, reward: RewardConfig, len_fn: LengthFn,
                 exclude: set[str]) -> list[EpisodeRecord]:
    """`cfg.reuse_episodes` scripted delegate and verify episodes (their `cfg.styles` ratio) on fresh
    tasks of difficulty >= `cfg.reuse_min_difficulty` (0: `cfg.fresh_min_difficulty`), drawn like the
    drill's with a seed of their own (no prompt in `exclude`), each task once while there are enough."""
    least = cfg.reuse_min_difficulty or cfg.fresh_min_difficulty
    tasks, low = fresh_sum_tasks(specs, least, cfg.seed + 1, cfg.reuse_episodes, exclude, "reuse_episodes")
    distinct = list({t.prompt: t for t in tasks if t.difficulty >= low}.values())
    random.Random(f"bootstrap-reuse:{cfg.seed}").shuffle(distinct)
    styles = {s: cfg.styles.get(s, 0.0) for s in ("delegate", "verify")}
    return scripted_traces(distinct, replace(cfg, episodes=cfg.reuse_episodes, styles=styles), org, reward, len_fn)


def is_split(turn) -> bool:
    """A manager's turn that HIREs workers or leads with briefs that carry terms (`bootstrap.reuse_splits`)."""
    from rlcr.behaviour import split_is_right

    return split_is_right(turn.prompt, turn.completion) is not None


def reuse_examples(records: Sequence[EpisodeRecord], tokenizer, context: int,
                   splits: bool = False) -> tuple[list[SFTExample], int]:
    """(one example per kept turn of `records` that builds on others' results, or with `splits` is a
    manager's split, and fits `context`; how many such turns did not fit and were left out)."""
    out = [turn_example(tokenizer, t.prompt, t.completion) for _, t in kept_turns(records)
           if builds_on_others(t) or (splits and is_split(t))]
    fits = [e for e in out if len(e.input_ids) <= context]
    return fits, len(out) - len(fits)


def trace_tasks(train: Sequence[Task], fresh: Sequence[Task], n: int, share: float) -> list[Task]:
    """`n` episodes' tasks: episode i is fresh when floor((i + 1) * share) > floor(i * share) (a `share`
    of them, spread evenly), else the next train task; each list is cycled in its order."""
    out, k_train, k_fresh = [], 0, 0
    for i in range(n):
        if int((i + 1) * share) > int(i * share):
            out.append(fresh[k_fresh % len(fresh)])
            k_fresh += 1
        else:
            out.append(train[k_train % len(train)])
            k_train += 1
    return out


def derived_drill_seed(seed: int, spec: int, difficulty: int) -> int:
    """A generator seed for the drill that no prepare split uses (prepare seeds are small integers)."""
    return 1_000_003 * (seed + 1) + 1009 * spec + difficulty


def _chain(terms: list[int]) -> str:
    """`68+57=125;125+42=167;167+37=204`: the sum worked left to right, as the solo script writes it."""
    steps, acc = [], terms[0]
    for t in terms[1:]:
        steps.append(f"{render_sum([acc, t])}={acc + t}")
        acc += t
    return ";".join(steps)


def arithmetic_examples(n: int, tokenizer, seed: int, shapes: Sequence[Sequence[int]],
                        exclude: set[str] = frozenset()) -> list[SFTExample]:
    """n drill examples `<bos>6+5+4+3=` -> `6+5=11;11+4=15;15+3=18\n`, each one of `shapes` (the terms of
    a sum: `sum_shapes` of fresh tasks of the train families, so the drill adds exactly what the roles
    add: the tasks' one-digit terms, their pair sums and the partial sums a manager combines), drawn
    uniformly; a sum whose expression is in `exclude` (an eval prompt) is never drilled.

    The target is the whole worked chain: the operands copied from the left side, each partial sum,
    and the line end. That is the two skills every role's turn needs, without the observation around
    them: copy numbers from earlier text (a brief, a task, a post) and add two numbers. Drawing the
    terms at random instead (same digits, any value: two-digit partial sums as 10-99) drilled a space
    ~40x larger than the tasks use and left two-term accuracy at 30% after 600 steps (measured)."""
    if tokenizer.chat_template is not None:
        raise ValueError("the arithmetic drill is for the tiny tokenizers (model.kind tiny)")
    pool = [list(t) for t in shapes if render_sum(t) not in exclude]
    if not pool:
        raise ValueError("no sum among the train tasks to drill (bootstrap.drill_share > 0 needs sum tasks)")
    rng = random.Random(f"bootstrap-arithmetic:{seed}")
    encoded = {}  # each distinct sum encoded once: (context ids, target ids)
    bos = (tokenizer.bos_token_id,)
    out = []
    for _ in range(n):
        terms = tuple(rng.choice(pool))
        if terms not in encoded:
            encoded[terms] = (bos + tuple(encode(tokenizer, render_sum(terms) + "=", bos=False)),
                              tuple(encode(tokenizer, _chain(list(terms)) + "\n", bos=False)))
        lhs, rhs = encoded[terms]
        out.append(SFTExample(lhs + rhs, (0,) * len(lhs) + (1,) * len(rhs)))
    return out


def length_batches(lengths: Sequence[int], batch_size: int, rng: random.Random, pool: int = 16) -> list[list[int]]:
    """One epoch of batches over all examples, each batch of similar lengths: shuffle, cut into pools
    of `pool` batches, sort each pool by length, cut it into batches, shuffle the batch order. Padding
    to the longest of a batch then wastes little (a random 16 of 200-850-token traces pads ~40%)."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    out: list[list[int]] = []
    for i in range(0, len(order), pool * batch_size):
        part = sorted(order[i : i + pool * batch_size], key=lambda j: lengths[j])
        out += [part[k : k + batch_size] for k in range(0, len(part), batch_size)]
    rng.shuffle(out)
    return out


def step_batches(trace_lengths: Sequence[int], n_drill: int, steps: int, batch_size: int, drill_batch_size: int,
                 drill_share: float, seed: int) -> list[list[int]]:
    """The example indices of each SFT step over `traces + drill` (drill indices start at len(traces)).

    Drill steps are spread evenly (step s is one when floor((s+1) * share) > floor(s * share)) and
    take fresh drill examples in order; the other steps take trace batches of similar lengths
    (`length_batches`), epoch after epoch. Batches never mix the two: a 30-token drill example padded
    to a 400-token trace is waste."""
    rng = random.Random(f"bootstrap-batches:{seed}")
    n_traces = len(trace_lengths)
    out: list[list[int]] = []
    epoch: list[list[int]] = []
    drill_at = n_traces
    for s in range(steps):
        if int((s + 1) * drill_share) > int(s * drill_share):
            out.append(list(range(drill_at, min(drill_at + drill_batch_size, n_traces + n_drill))))
            drill_at += drill_batch_size
            continue
        if not epoch:
            epoch = length_batches(trace_lengths, batch_size, rng)
        out.append(epoch.pop())
    if any(not b for b in out):
        raise ValueError(f"{n_drill} drill examples are too few for {steps} steps at drill_share {drill_share}")
    return out


def drill_steps(steps: int, drill_share: float) -> int:
    """How many of `steps` are drill steps (see step_batches)."""
    return int(steps * drill_share)


# -------------------------------------------------------------------------------------- evaluation


def _eval_tasks(tasks: Sequence[Task], n: int) -> list[Task]:
    """About n built-in sum tasks, the same number from each (family, difficulty), in file order."""
    groups: dict[tuple[str, int], list[Task]] = {}
    for t in tasks:
        if t.family in ("sum", "signed_sum"):
            groups.setdefault((t.family, t.difficulty), []).append(t)
    if not groups:
        return []
    per = max(1, n // len(groups))
    return [t for key in sorted(groups) for t in groups[key][:per]]


def drill_accuracy(model, tokenizer, shapes: Sequence[Sequence[int]], n: int = 512) -> dict[str, float]:
    """Greedy exact match of the worked chain (operands copied, every partial sum right) on each
    distinct sum of `shapes` (at most n: the first n in sorted order), by number of terms. Given the
    eval tasks' prompts and sub-problems, it measures the sub-skills on sums the drill never showed as
    a whole (`arithmetic_examples` excludes the eval prompts)."""
    from rlcr.policy.torch_engine import TorchEngine

    distinct = sorted({tuple(t) for t in shapes})[:n]
    if not distinct:
        return {}
    prompts = [encode(tokenizer, render_sum(t) + "=") for t in distinct]
    targets = [encode(tokenizer, _chain(list(t)) + "\n", bos=False) for t in distinct]
    n = len(prompts)
    eng = TorchEngine(model, tokenizer, context=model.config.max_position_embeddings)
    outs = eng.generate(prompts, Sampling(temperature=0.0, max_new_tokens=max(len(t) for t in targets),
                                          stop=("\n",)))
    hits: dict[int, list[bool]] = {}
    for terms, t, o in zip(distinct, targets, outs, strict=True):
        hits.setdefault(len(terms), []).append(o.token_ids[: len(t)] == t)
    out = {"drill/accuracy": sum(sum(v) for v in hits.values()) / n}
    out.update({f"drill/accuracy/{k}_terms": sum(v) / len(v) for k, v in sorted(hits.items())})
    return out


def quick_eval(model, tokenizer, tasks: Sequence[Task], n_tasks: int, org: OrgConfig, reward: RewardConfig,
               engine: EngineConfig, context: int, seed: int) -> dict[str, float]:
    """Held-out success of the policy as a company and as a single agent, sampled at the engine's
    temperature and greedy: `bootstrap/<company|single>/<sampled|greedy>/d<k>` and the mean over
    difficulties without the `/d<k>`; each role's sub-skill `.../skill/<role>/turn_correct` (with
    its turn counts, rlcr.behaviour)."""
    from rlcr.policy.torch_engine import TorchEngine

    picked = _eval_tasks(tasks, n_tasks)
    if not picked:
        return {}
    eng = TorchEngine.from_config(model, tokenizer, engine, context)
    len_fn = token_length_fn(tokenizer)
    out: dict[str, float] = {"bootstrap/eval_tasks": len(picked)}
    for mode in ("company", "single"):
        for how, temperature in (("sampled", engine.temperature), ("greedy", 0.0)):
            sampling = Sampling.from_config(engine, seed=seed)
            sampling = replace(sampling, temperature=temperature)
            recs = run_episodes(picked, EnginePolicy(eng, tokenizer, sampling), replace(org, single_agent=mode == "single"),
                                reward, len_fn=len_fn, episode_ids=[f"eval:{t.id}" for t in picked])
            key = f"bootstrap/{mode}/{how}"
            out[key] = sum(r.episode.outcome for r in recs) / len(recs)
            for d in sorted({t.difficulty for t in picked}):
                part = [r.episode.outcome for r, t in zip(recs, picked, strict=True) if t.difficulty == d]
                out[f"{key}/d{d}"] = sum(part) / len(part)
                for fam in sorted({t.family for t in picked}):
                    part = [r.episode.outcome for r, t in zip(recs, picked, strict=True)
                            if t.difficulty == d and t.family == fam]
                    if part:
                        out[f"{key}/{fam}/d{d}"] = sum(part) / len(part)
            out[f"{key}/malformed_turns"] = sum(r.episode.malformed_turns for r in recs) / max(1, sum(r.episode.n_turns for r in recs))
            skills = behaviour_metrics(recs, len_fn)  # each role's sub-skill: its turns well-formed and true
            out.update({f"{key}/{k}": v for k, v in skills.items() if k.startswith("skill/")})
    model.train(False)
    return out


# ------------------------------------------------------------------------------------- the stage


def link_base(base: str | Path, folder: str | Path) -> Path:
    """models/bootstrap for an instruct model: the base folder's files HARD-LINKED into `folder`
    (copied when hard links are impossible, e.g. across filesystems), written atomically like
    `save_policy`. A real folder, not a symlink: DVC, MLflow and the engines see an ordinary HF
    folder, and no file is stored twice on disk."""
    base, folder = Path(base), Path(folder)
    if not (base / "config.json").is_file():
        raise FileNotFoundError(f"{base} is not an HF model folder (no config.json)")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(base, tmp, copy_function=link, symlinks=False)
    old = None
    if folder.exists() or folder.is_symlink():
        old = folder.parent / f".{folder.name}.old-{uuid.uuid4().hex[:8]}"
        folder.rename(old)
    tmp.rename(folder)
    if old is not None:
        shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
    return folder


def assert_held_out(train_tasks: Sequence[Task], eval_tasks: Sequence[Task]) -> None:
    """Raise when a task the SFT traces play is also an eval task (same id or same prompt, spaces
    ignored): the held-out check must measure tasks the bootstrap never imitated."""
    seen = {t.id for t in eval_tasks} | {t.prompt.replace(" ", "") for t in eval_tasks}
    shared = [t.id for t in train_tasks if t.id in seen or t.prompt.replace(" ", "") in seen]
    if shared:
        raise ValueError(f"{len(shared)} SFT trace tasks are also eval tasks (first: {shared[0]}): "
                         "the held-out check would not be held out")


def instruct_sft(model, tokenizer, params: Params, train_tasks: Sequence[Task], eval_tasks: Sequence[Task],
                 on_step: Callable[[int, dict[str, float]], None] | None = None):
    """`bootstrap.instruct_steps` steps of LoRA SFT of an instruct model on the scripted traces ->
    (the model with the adapters merged, metrics, per-step metrics).

    The traces are `scripted_traces` with the pipeline's org config and the tokenizer's length
    function, the kept turns `trace_examples` (context: `prompt_ids`, the rollout prompt); batches
    of similar lengths (`step_batches` without drill). LoRA, not a full fine-tune: measured on 2
    cores, one SmolLM2-135M example of ~400 tokens took 5.4 s forward+backward with adapters on
    `train.lora_targets` and 7.3 s fully (weight gradients and AdamW over 135M values), the frozen
    base also keeps the instruct model's other skills; the adapters are shaped by `train.lora_*`."""
    from rlcr.policy.lora import lora_summary, wrap_lora

    cfg = params.bootstrap
    assert_held_out(train_tasks, eval_tasks)
    metrics: dict[str, float] = {}
    t0 = time.perf_counter()
    records = scripted_traces(train_tasks, cfg, params.org, params.reward, token_length_fn(tokenizer))
    metrics.update(trace_stats(records))
    traces, too_long = trace_examples(records, tokenizer, params.model.context, cfg.reuse_weight)
    if not traces:
        raise ValueError("no scripted turn was kept for SFT: check bootstrap.error_rates and the org limits")
    batches = step_batches([len(e.input_ids) for e in traces], 0, cfg.instruct_steps, cfg.batch_size,
                           cfg.drill_batch_size, 0.0, cfg.seed)
    metrics.update({"traces/examples": len(traces), "traces/too_long": too_long,
                    "traces/tokens": sum(len(e.input_ids) for e in traces),
                    "perf/prepare_s": time.perf_counter() - t0})
    adapted = wrap_lora(model, params.train)
    metrics.update(lora_summary(adapted))
    t1, seen, steps = time.perf_counter(), [0.0], []

    def log(step: int, m: dict[str, float]) -> None:
        seen[0] += m["perf/tokens"]
        m = {**m, "perf/tokens_per_s": seen[0] / max(1e-9, time.perf_counter() - t1)}
        steps.append(m)
        if on_step is not None:
            on_step(step, m)

    sft = train_sft(adapted, traces, replace(cfg, steps=cfg.instruct_steps), tokenizer.pad_token_id,
                    on_step=log, batches=batches, bf16=params.train.bf16)
    merged = adapted.merge_and_unload().eval()
    tail = max(1, len(sft.losses) // 10)
    metrics.update({
        "bootstrap/sft_steps": float(cfg.instruct_steps),
        "losses/sft_first": steps[0]["losses/sft"],
        "losses/sft_final": sum(sft.losses[-tail:]) / tail if sft.losses else float("nan"),
        "train/refused_updates": float(sft.refusals.count),
        "perf/sft_s": time.perf_counter() - t1,
        "perf/tokens_per_s": seen[0] / max(1e-9, time.perf_counter() - t1),
    })
    return merged, metrics, steps


@dataclass
class BootstrapResult:
    """What the stage reports: metrics for MLflow and metrics/bootstrap.json, per-step SFT metrics."""

    metrics: dict[str, float] = field(default_factory=dict)
    steps: list[dict[str, float]] = field(default_factory=list)
    base: str = ""
    """Instruct profiles: the base folder models/bootstrap was linked from."""


def bootstrap_policy(params: Params, train_tasks: Sequence[Task], eval_tasks: Sequence[Task], folder: str | Path,
                     on_step: Callable[[int, dict[str, float]], None] | None = None) -> BootstrapResult:
    """Write the bootstrap policy to `folder` and check it on held-out tasks (see the module docstring)."""
    from rlcr.policy.models import build_tiny, load_policy, materialize, save_policy

    cfg, res = params.bootstrap, BootstrapResult()
    t0 = time.perf_counter()
    if params.model.kind != "tiny" and cfg.instruct_steps:
        # instruct model + a short LoRA SFT on the scripted traces, merged (`instruct_sft`)
        base = materialize(params.model, folder, cfg.seed)  # smollm2: converted once; hf: model.path
        res.base = str(base)
        # fp32 weights whatever engine.dtype: the SFT trains them as the RL trainer does (train.bf16: bf16
        # autocast), and the saved policy is the base plus the merged adapters, not a bf16 rounding of it
        model, tok = load_policy(base, device=params.engine.device)
        model, sft_metrics, res.steps = instruct_sft(model, tok, params, train_tasks, eval_tasks, on_step)
        res.metrics.update(sft_metrics)
        save_policy(model, tok, folder)  # a new folder: the base's files (hard-linked elsewhere) stay as they are
    elif params.model.kind != "tiny":
        # instruct model: prompted with the protocol as it is, no SFT
        base = materialize(params.model, folder, cfg.seed)  # smollm2: converted once; hf: model.path
        link_base(base, folder)
        res.base = str(base)
        model, tok = load_policy(folder, device=params.engine.device, dtype=params.engine.dtype)
    else:
        model, tok = build_tiny(params.model, cfg.seed)
        # traces
        exclude = {t.prompt.replace(" ", "") for t in eval_tasks}
        picked = train_tasks
        if cfg.fresh_share > 0:
            fresh = fresh_trace_tasks(params.prepare.train, cfg, exclude)
            picked = trace_tasks(train_tasks, fresh, cfg.episodes, cfg.fresh_share)
            res.metrics["traces/fresh_tasks"] = len({t.prompt for t in picked} - {t.prompt for t in train_tasks})
        records = scripted_traces(picked, cfg, params.org, params.reward, token_length_fn(tok))
        res.metrics.update(trace_stats(records))
        context = min(params.model.context, params.org.context_tokens)
        traces, too_long = trace_examples(records, tok, context, cfg.reuse_weight)
        if cfg.reuse_episodes:
            reuse = reuse_traces(params.prepare.train, cfg, params.org, params.reward, token_length_fn(tok), exclude)
            extra, extra_too_long = reuse_examples(reuse, tok, context, cfg.reuse_splits)
            traces += extra
            res.metrics.update({"traces/reuse_tasks": len({r.episode.task_id for r in reuse}),
                                "traces/reuse_examples": len(extra), "traces/reuse_too_long": extra_too_long})
        if not traces:
            raise ValueError("no scripted turn was kept for SFT: check bootstrap.error_rates and the org limits")
        n_drill = drill_steps(cfg.steps, cfg.drill_share) * cfg.drill_batch_size
        shapes = sum_shapes(drill_tasks(params.prepare.train, cfg.seed, exclude))
        drill = arithmetic_examples(n_drill, tok, cfg.seed, shapes, exclude) if n_drill else []
        tails = tail_examples(records, tok) if cfg.tail_share > 0 else []
        drill = mix_in(drill, tails, cfg.tail_share, cfg.seed)
        batches = step_batches([len(e.input_ids) for e in traces], len(drill), cfg.steps, cfg.batch_size, cfg.drill_batch_size,
                               cfg.drill_share, cfg.seed)
        res.metrics.update({"traces/examples": len(traces), "traces/too_long": too_long,
                            "traces/tokens": sum(len(e.input_ids) for e in traces), "drill/examples": len(drill),
                            "drill/tail_examples": len(tails)})
        res.metrics["perf/prepare_s"] = time.perf_counter() - t0
        # sft
        t1, seen = time.perf_counter(), [0.0]

        def log(step: int, m: dict[str, float]) -> None:
            seen[0] += m["perf/tokens"]
            m = {**m, "perf/tokens_per_s": seen[0] / max(1e-9, time.perf_counter() - t1),
                 "charts/drill_step": float(batches[step][0] >= len(traces))}
            res.steps.append(m)
            if on_step is not None:
                on_step(step, m)

        if cfg.drill_first:  # curriculum: the arithmetic alone first, with its own schedule
            first = arithmetic_examples(cfg.drill_first * cfg.drill_batch_size, tok, cfg.seed + 1, shapes, exclude)
            pre_cfg = replace(cfg, steps=cfg.drill_first, batch_size=cfg.drill_batch_size,
                              warmup_steps=min(cfg.warmup_steps, cfg.drill_first - 1))
            pre = train_sft(model, first, pre_cfg,
                            tok.pad_token_id, batches=[list(range(i * cfg.drill_batch_size, (i + 1) * cfg.drill_batch_size))
                                                       for i in range(cfg.drill_first)])
            res.metrics["losses/drill_first_final"] = sum(pre.losses[-10:]) / max(1, len(pre.losses[-10:]))
            res.metrics["perf/drill_first_s"] = time.perf_counter() - t1
        sft = train_sft(model, [*traces, *drill], cfg, tok.pad_token_id, on_step=log, batches=batches)
        model.eval()
        save_policy(model, tok, folder)
        losses = [m["losses/sft"] for m in res.steps if not m["charts/drill_step"]]
        drills = [m["losses/sft"] for m in res.steps if m["charts/drill_step"]]
        tail = max(1, len(losses) // 10)
        res.metrics.update({
            "losses/sft_final": sum(losses[-tail:]) / tail if losses else float("nan"),
            "losses/drill_final": sum(drills[-tail:]) / min(tail, len(drills)) if drills else float("nan"),
            "train/refused_updates": float(sft.refusals.count),
            "perf/sft_s": time.perf_counter() - t1,
            "perf/tokens_per_s": seen[0] / max(1e-9, time.perf_counter() - t1),
        })
        held_out = sum_shapes([t for t in eval_tasks if t.family in ("sum", "signed_sum")])
        res.metrics.update(drill_accuracy(model, tok, held_out) if drill else {})
    # held-out check
    t2 = time.perf_counter()
    if cfg.eval_tasks:
        context = min(params.model.context, params.org.context_tokens) if params.model.kind == "tiny" else params.model.context
        res.metrics.update(quick_eval(model, tok, eval_tasks, cfg.eval_tasks, params.org, params.reward,
                                      params.engine, context, cfg.seed))
    res.metrics["perf/eval_s"] = time.perf_counter() - t2
    res.metrics["perf/total_s"] = time.perf_counter() - t0
    return res


__all__ = ["STYLES", "BootstrapResult", "assert_held_out", "bootstrap_policy", "instruct_sft", "link_base", "TraceSpec", "arithmetic_examples", "sum_shapes", "long_sum_shapes",
           "drill_tasks", "drill_accuracy", "correct_agents", "draw_specs", "kept_turns",
           "step_batches", "length_batches", "drill_steps", "quick_eval", "scripted_traces", "trace_examples", "trace_stats", "builds_on_others",
           "observation_tail", "tail_examples", "fresh_sum_tasks", "reuse_traces", "reuse_examples", "is_split", "mix_in", "turn_example", "turn_is_correct"]
