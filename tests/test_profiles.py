"""Every shipped profile of params.yaml changes what it says it changes, and nothing else.

For each `profiles.<name>` block: the resolved params differ from the tiny default in exactly the
keys the block lists (every override takes effect, no other value moves), and the profile's own
claims hold (model kind, fine-tuning, engine, dtype, backend). An empty non-default profile is
refused. What the smollm2 profile builds (the converted model, LoRA, the engine) is
tests/test_smollm2.py."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
import yaml  # noqa: E402

from rlcr.config import PROFILES, ConfigError, resolve  # noqa: E402
from rlcr.policy.models import build_tiny  # noqa: E402

RAW = yaml.safe_load((ROOT / "params.yaml").read_text())


def with_profile(name: str):
    raw = {**RAW, "profile": name}
    return resolve(raw)


def leaves(data, prefix: str = "") -> dict[str, object]:
    """Dotted leaf keys of nested mappings (lists are leaves)."""
    out = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        out.update(leaves(v, key + ".") if isinstance(v, dict) and v else {key: v})
    return out


def changed_keys(a, b) -> set[str]:
    la, lb = leaves(dataclasses.asdict(a)), leaves(dataclasses.asdict(b))
    return {k for k in la if la[k] != lb.get(k)} - {"profile"}


def block_keys(name: str) -> set[str]:
    """The leaf keys a profile block sets; list-valued sections (prepare.train/eval) count as one key."""
    return set(leaves(RAW["profiles"][name] or {}))


def declared(name: str) -> set[str]:
    """Leaf keys of the block whose value differs from the tiny default (a block may restate one)."""
    tiny = leaves(dataclasses.asdict(with_profile("tiny")))
    prof = leaves(dataclasses.asdict(with_profile(name)))
    return {k for k in block_keys(name) if any(t == k or t.startswith(k + ".") or t.startswith(k + "[")
                                              for t in tiny if tiny.get(t) != prof.get(t))}


def test_the_shipped_profiles_are_the_known_ones():
    assert set(RAW["profiles"]) == set(PROFILES)


def test_tiny_is_the_default_and_changes_nothing():
    tiny, default = with_profile("tiny"), resolve({k: v for k, v in RAW.items() if k != "profile"})
    assert changed_keys(tiny, default) == set() and RAW["profiles"]["tiny"] == {}
    assert (tiny.model.kind, tiny.model.tokenizer, tiny.train.finetune, tiny.train.backend) == ("tiny", "numbers", "full", "torch")
    assert (tiny.engine.kind, tiny.engine.device, tiny.engine.dtype) == ("torch", "cpu", "float32")


@pytest.mark.parametrize("name", ["quick", "hierarchy", "smollm2", "gpu"])
def test_a_profile_moves_exactly_the_keys_it_lists(name):
    tiny, prof = with_profile("tiny"), with_profile(name)
    moved = changed_keys(prof, tiny)
    lists = block_keys(name)
    assert moved, f"profile {name} changes nothing"
    # every moved value is one the block sets (or inside a list it sets), and every key it sets moved
    assert all(any(m == k or m.startswith(k + ".") for k in lists) for m in moved), moved
    assert declared(name) == lists, lists - declared(name)


def test_quick_is_the_tiny_design_cut_down():
    tiny, quick = with_profile("tiny"), with_profile("quick")
    assert quick.model.kind == "tiny" and quick.train.finetune == "full"
    n = lambda p: sum(x.numel() for x in build_tiny(p.model, 0)[0].parameters())  # noqa: E731
    assert n(quick) < n(tiny) / 2
    assert quick.train.iterations < tiny.train.iterations and quick.org.token_budget < tiny.org.token_budget


def test_hierarchy_adds_six_term_sums_a_depth_two_company_and_the_bootstrap_that_learns_it():
    from rlcr.org.episode import run_episodes
    from rlcr.org.scripted import ScriptedOrg
    from rlcr.policy.bridge import token_length_fn
    from rlcr.policy.tokenizer import build_tokenizer
    from rlcr.tasks import build_family
    from rlcr.train import bootstrap as B

    tiny, hier = with_profile("tiny"), with_profile("hierarchy")
    n = lambda p: sum(x.numel() for x in build_tiny(p.model, 0)[0].parameters())  # noqa: E731
    assert (hier.model.num_heads, tiny.model.num_heads) == (8, 4) and n(hier) == n(tiny)  # same size, more heads
    assert {d for f in hier.prepare.train for d in f.difficulties} == {1, 2, 3, 5}
    assert {(f.name, f.difficulties) for f in hier.prepare.eval} == {("sum", (1, 3, 5)), ("signed_sum", (1, 3, 5))}
    assert hier.train.eval_tasks == sum(f.n * len(f.difficulties) for f in hier.prepare.eval) == 192
    b = hier.bootstrap
    assert (b.reuse_episodes, b.reuse_splits, b.fresh_min_difficulty, b.steps) == (6000, True, 1, 1800)
    assert (tiny.bootstrap.reuse_episodes, tiny.bootstrap.reuse_splits) == (0, False)

    # a 6-term sum (difficulty 5): the scripted delegating CEO hires a lead, who hires workers
    len_fn = token_length_fn(build_tokenizer(hier.model.tokenizer))
    six = build_family("sum", {"digits": 1}).generate(3, 4, 5)
    recs = run_episodes(six, ScriptedOrg(style="delegate", len_fn=len_fn), hier.org, len_fn=len_fn)
    assert all(r.episode.outcome for r in recs)
    assert all({t.role for t in r.turns} == {"ceo", "lead", "worker"} for r in recs)
    # and the reuse episodes on 2-6 term sums give leads' combines to imitate
    specs = hier.prepare.train
    reuse = B.reuse_traces(specs, dataclasses.replace(b, reuse_episodes=60), hier.org, hier.reward, len_fn, set())
    combines = {t.role for _, t in B.kept_turns(reuse) if B.builds_on_others(t)}
    assert {"ceo", "lead"} <= combines
    # and the CEO's and leads' splits, which join them (`reuse_splits`)
    assert {t.role for _, t in B.kept_turns(reuse) if B.is_split(t)} == {"ceo", "lead"}


def test_smollm2_switches_model_and_fine_tuning():
    tiny, smol = with_profile("tiny"), with_profile("smollm2")
    assert (smol.model.kind, smol.train.finetune) == ("smollm2", "lora")
    assert (tiny.model.kind, tiny.train.finetune) == ("tiny", "full")
    assert smol.engine.kind == "torch" and smol.engine.dtype == "bfloat16" and smol.train.backend == "torch"
    assert smol.train.bf16 and not tiny.train.bf16 and tiny.engine.dtype == "float32"
    assert (smol.engine.sampler, tiny.engine.sampler) == ("inverse_cdf", "multinomial")
    assert smol.engine.shared_prefill and not tiny.engine.shared_prefill
    assert smol.model.context > tiny.model.context  # BPE observations and the protocol system prompt


def test_an_empty_profile_is_refused_with_its_name():
    raw = {**RAW, "profile": "gpu", "profiles": {**RAW["profiles"], "gpu": {}}}
    with pytest.raises(ConfigError, match="profiles.gpu: is empty"):
        resolve(raw)
    if not RAW["profiles"].get("gpu"):  # as shipped (no block): selecting gpu fails before any work
        with pytest.raises(ConfigError, match="profiles.gpu: is not defined"):
            with_profile("gpu")


def test_gpu_is_vllm_deepspeed_bf16_on_cuda_with_an_hf_model():
    gpu = with_profile("gpu")
    assert (gpu.engine.kind, gpu.engine.device, gpu.engine.dtype) == ("vllm", "cuda", "bfloat16")
    assert (gpu.train.backend, gpu.train.zero_stage, gpu.train.bf16, gpu.train.gradient_checkpointing) == (
        "deepspeed", 2, True, True)
    assert gpu.model.kind == "hf" and gpu.model.path and gpu.train.finetune == "full"
    families = {f.name for f in gpu.prepare.eval}
    default_rg = {f.name for f in with_profile("tiny").prepare.eval if f.name.startswith("rg/")}
    assert len(default_rg) == 12 and default_rg <= families and "humaneval" in families


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA: the refusal is for CPU machines")
def test_gpu_on_a_machine_without_cuda_stops_at_the_start_of_training_naming_the_setting(tmp_path):
    from rlcr.tasks import build_family
    from rlcr.tracking import NullTracker
    from rlcr.train.loop import train

    tasks = build_family("sum", {"digits": 1}).generate(0, 4, 1)
    with pytest.raises(RuntimeError, match=r"engine.device is 'cuda' but this machine has no CUDA device"):
        train(with_profile("gpu"), tmp_path / "no-policy-needed", tasks, tmp_path / "out", NullTracker())
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.ckpt").exists()  # nothing was started


def test_the_machine_check_names_vllm_and_deepspeed_when_missing(monkeypatch):
    import importlib.util

    from rlcr.config import TrainConfig
    from rlcr.train.backend import check_machine

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("vllm", "deepspeed") else real(name, *a))
    with pytest.raises(RuntimeError, match="engine.kind is 'vllm' but the vllm package is not installed"):
        check_machine("cpu", "vllm", TrainConfig())
    with pytest.raises(RuntimeError, match="train.backend is 'deepspeed' but the deepspeed package is not installed"):
        check_machine("cpu", "torch", TrainConfig(backend="deepspeed"))
    check_machine("cpu", "torch", TrainConfig())  # the tiny default passes
