"""LoRA through peft (`train.finetune: lora`): the merged weights the engine serves compute what the
adapted model computes, the RL loop trains only the adapters and serves them after every step, and
bad settings fail with a message naming the key. On a tiny Llama: seconds."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from helpers import varied_tiny  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from rlcr.config import ConfigError, resolve  # noqa: E402
from rlcr.policy.lora import is_lora, serving_state, trainable_parameters, wrap_lora  # noqa: E402
from rlcr.policy.models import ADAPTER_DIR, build_tiny, load_policy, save_policy  # noqa: E402
from rlcr.tasks import build_family  # noqa: E402
from rlcr.tracking import NullTracker  # noqa: E402
from rlcr.train.loop import train  # noqa: E402


def params(**over):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    base = {"model.hidden_size": 64, "model.num_layers": 2, "model.num_heads": 4, "model.intermediate_size": 128,
            "model.context": 128, "org.max_agents": 2, "org.max_depth": 1, "org.max_rounds": 2,
            "org.token_budget": 48, "org.max_turn_tokens": 24, "org.max_obs_tokens": 100,
            "org.context_tokens": 128, "org.allow_leads": False, "org.roles": ["worker"],
            "engine.max_new_tokens": 24, "train.group_size": 4, "train.tasks_per_iteration": 2,
            "train.iterations": 2, "train.checkpoint_every": 2, "train.finetune": "lora", "train.lora_rank": 4,
            "train.lr": 1e-2, "train.kl_coef": 0.1, "reward.token_cost": 0.5, "tracking.enabled": False}
    return resolve(raw, {**base, **over})


def test_merged_serving_weights_compute_what_the_adapted_model_computes():
    p = params()
    model, tok = varied_tiny(p.model, 0)
    lora = wrap_lora(model, p.train)
    assert is_lora(lora) and not is_lora(model.get_base_model() if hasattr(model, "get_base_model") else model)
    trainable, total = trainable_parameters(lora)
    assert 0 < trainable < total / 5
    with torch.no_grad():  # B starts at 0: give the adapters a real effect
        for name, w in lora.named_parameters():
            if "lora_B" in name:
                w.normal_(0.0, 0.5)
    ids = torch.randint(0, len(tok), (3, 17), generator=torch.Generator().manual_seed(1))
    plain, _ = build_tiny(p.model, 1)  # another init: every weight must come from serving_state
    plain.load_state_dict(serving_state(lora))
    lora.eval()
    with torch.no_grad():
        want, got = lora(input_ids=ids).logits, plain(input_ids=ids).logits
        base_out = lora.get_base_model()
        with lora.disable_adapter():
            unadapted = base_out(input_ids=ids).logits
    assert (want - got).abs().max() < 1e-4 * want.abs().max()  # float rounding of W + BA vs W x + B(A x)
    assert (want - unadapted).abs().max() > 1e-2  # the adapters changed the output, and the merge has it


def test_rl_with_lora_trains_only_adapters_and_serves_them_after_every_step(tmp_path):
    p = params()
    start = save_policy(*varied_tiny(p.model, 0), tmp_path / "start")
    tasks = build_family("sum", {"digits": 1}).generate(0, 20, 1)
    res = train(p, start, tasks, tmp_path / "policy", NullTracker(), ckpt_dir=tmp_path / "ckpt", log=lambda *_: None)
    assert [h["train/steps"] for h in res.history] == [1.0, 1.0]  # kl_coef > 0: every turn is in the step
    # iteration 2 rolled out with the weights after step 1: the engine's logprobs match the trainer's
    assert res.history[1]["perf/logprob_mismatch_max"] < 1e-4
    out = tmp_path / "policy"
    assert (out / ADAPTER_DIR / "adapter_config.json").is_file()
    before, after = load_file(start / "model.safetensors"), load_file(out / "model.safetensors")
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(any(t in k for t in p.train.lora_targets) for k in changed)  # embeddings, norms frozen
    # the saved folder is the start + the saved adapter, merged
    from peft import PeftModel

    model, _ = load_policy(start)
    merged = serving_state(PeftModel.from_pretrained(model, str(out / ADAPTER_DIR)))
    assert all(torch.allclose(merged[k], after[k], atol=1e-6) for k in after)


def test_full_finetune_stays_the_default_and_lora_settings_are_checked():
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert resolve(raw).train.finetune == "full"
    for key, value, says in (("train.lora_rank", 0, "train.lora_rank"), ("train.lora_dropout", 1.0, "train.lora_dropout"),
                             ("train.lora_targets", [], "train.lora_targets"), ("train.finetune", "qlora", "train.finetune")):
        with pytest.raises(ConfigError, match=says):
            params(**{key: value})
    with pytest.raises(ConfigError, match="train.finetune: lora runs with train.backend torch"):
        params(**{"train.backend": "deepspeed"})
    p = params(**{"train.lora_targets": ["q_proj", "qkv"]})
    with pytest.raises(ValueError, match=r"\['qkv'\] name no linear layer"):
        wrap_lora(build_tiny(p.model, 0)[0], p.train)
