"""The RL loop's mechanics: token alignment, counterfactual credit, NaN refusal, exact resume in a
fresh process, DeepSpeed ZeRO-0 = torch. (Whether the product's experiment learns is
tests/test_learning.py, on the default design.)

The starting policy of these tests is a tiny Llama SFT'd (module fixture, ~20-40 s) on a CEO that
either solves a one-digit pair sum (`5+6=11` then `SUBMIT 11`) or says `DONE`, half and half: a
policy whose updates are visible, not a claim about learning.
This file is also the subprocess runner of the resume test (`python tests/test_train_loop.py run ...`).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
import torch  # noqa: E402

from rlcr.config import BootstrapConfig, ConfigError  # noqa: E402
from rlcr.org.episode import Generation, run_episodes  # noqa: E402
from rlcr.org.records import EpisodeRecord, EpisodeRow, TurnRow  # noqa: E402
from rlcr.org.scripted import ScriptedOrg  # noqa: E402
from rlcr.policy.bridge import completion_ids, prompt_ids, token_length_fn  # noqa: E402
from rlcr.policy.models import build_tiny, load_policy, save_policy  # noqa: E402
from rlcr.policy.tokenizer import encode  # noqa: E402
from rlcr.tasks import build_family  # noqa: E402
from rlcr.tracking import NullTracker  # noqa: E402
from rlcr.train.checkpoint import CheckpointError, list_checkpoints  # noqa: E402
from rlcr.train.credit import counterfactual_credit, find_hires, without_hire  # noqa: E402
from rlcr.train.loop import (  # noqa: E402
    TurnSample,
    agent_samples,
    collate_turns,
    completion_logprobs,
    micro_batches,
    train,
    turn_samples,
)
from rlcr.train.loss import sequence_logprobs  # noqa: E402
from rlcr.train.sft import SFTExample, train_sft  # noqa: E402
from tests.helpers import params_with  # noqa: E402

TIMING = ("perf/", "credit/seconds")
"""Metric keys that measure wall time: everything else must repeat exactly."""


def tiny_params(reward: dict | None = None, **train):
    """The repo's params.yaml with a one-digit-sum company small enough for tests (obs ~100 tokens)."""
    over = {
        "reward": reward or {},
        "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 128, "context": 128},
        "org": {"max_agents": 2, "max_depth": 1, "max_rounds": 2, "token_budget": 48, "max_turn_tokens": 24,
                "max_obs_tokens": 100, "context_tokens": 128, "allow_leads": False, "roles": ["worker"]},
        "engine": {"max_new_tokens": 24},
        "train": {"lr": 1e-4, "group_size": 8, "tasks_per_iteration": 8, "iterations": 2, "checkpoint_every": 1,
                  "keep_last": 2, "seed": 0, **train},
        "tracking": {"enabled": False},
    }
    return params_with(over)


def sum_tasks(seed: int, n: int):
    return build_family("sum", {"digits": 1}).generate(seed, n, 1)


def make_start_policy(folder: Path, steps: int = 240) -> Path:
    """SFT a tiny model on a CEO that solves the pair sum (p=0.5) or idles with DONE (p=0.5)."""
    params = tiny_params()
    model, tok = build_tiny(params.model, seed=0)
    L = token_length_fn(tok)
    solo = ScriptedOrg("solo", len_fn=L)

    class HalfIdle:
        def generate_batch(self, reqs):
            return [Generation("DONE" if random.Random(r.episode_id).random() < 0.5 else solo.act(r)) for r in reqs]

    tasks = sum_tasks(0, 200) * 4
    records = run_episodes(tasks, HalfIdle(), params.org, params.reward, len_fn=L,
                           episode_ids=[f"sft{i}" for i in range(len(tasks))])
    examples = []
    for rec in records:
        t = rec.turns[0]
        p, c = prompt_ids(tok, t.prompt), completion_ids(tok, t.completion)
        examples.append(SFTExample(tuple(p + c), tuple([0] * len(p) + [1] * len(c))))
    # drill of the last lines of the observation + the solving turn: the skill, at 1/3 of the tokens
    rng = random.Random(0)
    for _ in range(2000):
        ids, mask = encode(tok, "", bos=True), [0]
        while len(ids) < 80:
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            ctx = encode(tok, f"task:\n| {a}+{b}\n", bos=False)
            out = encode(tok, f"{a}+{b}={a + b}\nSUBMIT {a + b}", bos=False) + [tok.eos_token_id]
            ids += ctx + out
            mask += [0] * len(ctx) + [1] * len(out)
        examples.append(SFTExample(tuple(ids), tuple(mask)))
    train_sft(model, examples, BootstrapConfig(steps=steps, batch_size=32, lr=3e-3, warmup_steps=10), tok.pad_token_id)
    return save_policy(model, tok, folder)


@pytest.fixture(scope="module")
def start_policy(tmp_path_factory) -> Path:
    return make_start_policy(tmp_path_factory.mktemp("start") / "policy")


def untimed(history):
    return [{k: v for k, v in h.items() if not k.startswith(TIMING)} for h in history]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_policy(folder)[0].state_dict()


# ------------------------------------------------------------------------------ pure pieces


def test_collate_shares_each_prompt_and_aligns_old_logprobs_with_completion_tokens():
    a = TurnSample(prompt=(1, 10, 11), completion=(20, 21, 2), old_logprobs=(-0.1, -0.2, -0.3), advantage=0.5)
    b = TurnSample(prompt=(1, 12), completion=(22,), old_logprobs=(-0.4,), advantage=-1.0)
    a2 = TurnSample(prompt=(1, 10, 11), completion=(23, 2), old_logprobs=(-0.5, -0.6), advantage=0.25)
    batch = collate_turns([a, b, a2], pad_id=0)
    assert batch["prompts"].tolist() == [[1, 10, 11], [0, 1, 12]]  # distinct prompts, left-padded
    assert batch["prompt_mask"].tolist() == [[1, 1, 1], [0, 1, 1]]
    assert batch["prompt_index"].tolist() == [0, 1, 0]
    assert batch["completions"].tolist() == [[20, 21, 2], [22, 0, 0], [23, 2, 0]]
    assert batch["loss_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
    assert torch.equal(batch["old_logprobs"], torch.tensor([[-0.1, -0.2, -0.3], [-0.4, 0, 0], [-0.5, -0.6, 0]]))
    assert batch["advantages"].tolist() == [0.5, -1.0, 0.25]


def test_shared_prompt_logprobs_and_gradients_equal_a_full_forward_per_turn():
    model, _ = build_tiny(tiny_params().model, seed=0)
    g = torch.Generator().manual_seed(0)
    rand = lambda n: tuple(torch.randint(4, 90, (n,), generator=g).tolist())  # noqa: E731
    p1, p2 = (1, *rand(30)), (1, *rand(17))
    turns = [TurnSample(p, rand(n), (0.0,) * n, 1.0) for p, n in ((p1, 5), (p1, 9), (p2, 1), (p2, 7), (p1, 2))]
    lp, _ = completion_logprobs(model, collate_turns(turns, pad_id=0))
    (lp * collate_turns(turns, 0)["loss_mask"]).sum().backward()
    shared = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    total = 0
    for i, t in enumerate(turns):
        ids = torch.tensor([t.prompt + t.completion])
        full = sequence_logprobs(model, ids, torch.ones_like(ids))[0, len(t.prompt) - 1 :]  # (C,)
        assert torch.allclose(full, lp[i, : len(t.completion)], atol=1e-5)
        total = total + full.sum()
    total.backward()
    assert all(torch.allclose(a, p.grad, atol=1e-5) for a, p in zip(shared, model.parameters(), strict=True))


def test_micro_batches_keep_the_token_budget_and_shared_prompts_together():
    p1, p2 = tuple(range(40)), tuple(range(1, 21))
    samples = [TurnSample(p, tuple(range(n)), (0.0,) * n, 1.0) for p, n in
               ((p1, 10), (p2, 5), (p1, 20), (p2, 30), (p1, 8), (p2, 2))]
    batches = micro_batches(samples, max_tokens=120)
    assert sorted(len(s.completion) for b in batches for s in b) == [2, 5, 8, 10, 20, 30]
    for b in batches:
        cost = len({s.prompt for s in b}) * max(len(s.prompt) for s in b) + len(b) * max(len(s.completion) for s in b)
        assert cost <= 120 or len(b) == 1
    assert [len(b) for b in micro_batches(samples, max_tokens=10_000)] == [6]


def _record(eid, rewards, turns):
    ep = EpisodeRow(eid, "t", "sum", "{}", agent_rewards=json.dumps({str(k): v for k, v in rewards.items()}))
    return EpisodeRecord(ep, [TurnRow(eid, "t", r, a, role, -1 if a == 0 else 0, int(a > 0), f"obs{a}", "x",
                                      token_ids="[5]", logprobs="[-1.0]", prompt_tokens=3)
                              for a, r, role in turns])


def test_agent_samples_and_turns_carry_each_agents_reward_and_the_engines_prompt_cut():
    recs = [_record("e0", {0: 1.0, 1: 1.0}, [(0, 1, "ceo"), (1, 2, "worker"), (0, 2, "ceo")]),
            _record("e1", {0: 0.0}, [(0, 1, "ceo")])]
    s = agent_samples(recs, group_of=[7, 7])
    assert s.keys == [("e0", 0), ("e0", 1), ("e1", 0)]
    assert s.rewards == [1.0, 1.0, 0.0] and s.groups == [7, 7, 7] and s.roles == ["ceo", "worker", "ceo"]
    _, tok = build_tiny(tiny_params().model, 0)
    turns = turn_samples(recs, tok, {("e0", 0): 0.5, ("e0", 1): 0.5, ("e1", 0): 0.0}, keep_zero=False)
    assert [t.advantage for t in turns] == [0.5, 0.5, 0.5]  # e1's zero-advantage turn is left out
    # prompt_tokens 3 < len(<bos>obs0) = 5: the engine dropped the left 2, so the trainer does too
    assert turns[0].prompt == tuple(prompt_ids(tok, "obs0")[-3:]) and turns[0].completion == (5,)


# ----------------------------------------------------------------------- counterfactual credit


def test_without_hire_removes_exactly_that_hire_line():
    text = "HIRE worker: 1+2\nthinking\nHIRE verifier: check @agent1\nPOST hi"
    assert without_hire(text, 0, 8) == "thinking\nHIRE verifier: check @agent1\nPOST hi"
    assert without_hire(text, 1, 8) == "HIRE worker: 1+2\nthinking\nPOST hi"
    assert without_hire(text, 2, 8) is None
    assert without_hire("WRITE a.txt\nHIRE worker: x", 0, 8) is None  # that line is file content


def test_counterfactual_replays_up_to_the_hire_exactly_and_credits_the_difference():
    params = params_with({"org": {"max_rounds": 3}})
    tasks = build_family("sum", {"digits": 2}).generate(0, 4, 3)  # 4 terms: the CEO hires two workers
    scripted = ScriptedOrg("delegate")
    recs = run_episodes(tasks, scripted, params.org, params.reward, episode_ids=[f"e{i}" for i in range(4)])
    assert all(r.episode.outcome == 1.0 for r in recs)
    hires = find_hires(recs)
    assert len(hires) == 8 and {h.round for h in hires} == {1}
    # without a worker the scripted CEO rehires it in round 2 and has no round left to submit: D = 1
    credit, stats = counterfactual_credit(recs, scripted, params.org, params.reward, lambda s: (len(s) + 3) // 4,
                                          n_hires=3, rng=random.Random(0))
    assert stats["credit/extra_episodes"] == 3 and stats["credit/hires_credited"] == 3
    assert stats["credit/replay_mismatch"] == 0  # the replayed rounds saw exactly the original observations
    assert len(credit) == 3 and set(credit.values()) == {1.0}
    assert all(agent in (1, 2) for _, agent in credit)


# ---------------------------------------------------------------------------------- the loop


def test_loop_logs_namespaced_metrics_and_engine_matches_trainer(start_policy, tmp_path):
    # a token cost makes rewards differ inside every group, so every iteration has turns to train
    params = tiny_params(reward={"token_cost": 0.1}, iterations=2, counterfactual_hires=2)
    res = train(params, start_policy, sum_tasks(0, 50), tmp_path / "policy", NullTracker(),
                ckpt_dir=tmp_path / "ckpt", log=lambda *_: None)
    h = res.history[-1]
    for key in ("reward/mean", "rollout/success", "adv/mean", "adv/std", "losses/pg", "losses/kl",
                "losses/clip_frac", "losses/entropy", "charts/lr", "perf/tokens_per_s", "perf/logprob_mismatch",
                "org/size", "behaviour/malformed_rate", "credit/extra_episodes", "credit/seconds"):
        assert key in h, key
    assert all(h["train/turns"] > 0 for h in res.history)
    # the KV-cached engine and the trainer's full forward give the same logprobs (fp32, CPU)
    assert max(x["perf/logprob_mismatch_max"] for x in res.history) < 1e-4
    assert res.history[0]["losses/clip_frac"] == 0.0  # one on-policy step: the ratio is 1
    assert [p.name for p in list_checkpoints(tmp_path / "ckpt")] == ["ckpt-1.pt", "ckpt-2.pt"]
    assert (tmp_path / "policy/config.json").is_file()


def test_single_share_spreads_single_agent_groups_over_iterations():
    from rlcr.train.loop import single_count

    for share, groups in ((0.0, 8), (0.1, 8), (0.25, 8), (1 / 3, 5), (1.0, 8)):
        counts = [single_count(i, groups, share) for i in range(30)]
        assert all(0 <= c <= groups for c in counts)
        for n in range(1, 31):  # after any number of iterations, the share of all groups played so far
            assert sum(counts[:n]) == round(share * groups * n)
    with pytest.raises(ConfigError, match="train.single_share"):
        tiny_params(single_share=1.5)


def test_single_share_trains_the_single_agent_mode_on_its_own_groups(start_policy, tmp_path, monkeypatch):
    from rlcr.train import loop

    played = []

    def spy(tasks, policy, org, *args, **kw):  # the real scheduler, each call's mode recorded
        records = run_episodes(tasks, policy, org, *args, **kw)
        played.append((org.single_agent, len(tasks), {r.episode.mode for r in records},
                       {kw["episode_ids"][0].split(":")[1], kw["episode_ids"][-1].split(":")[1]}))
        return records

    monkeypatch.setattr(loop, "run_episodes", spy)
    params = tiny_params(reward={"token_cost": 0.1}, iterations=2, single_share=0.25)
    res = train(params, start_policy, sum_tasks(0, 50), tmp_path / "policy", NullTracker(),
                ckpt_dir=tmp_path / "ckpt", log=lambda *_: None)
    # 8 groups of 8 a iteration: 6 as a company, then the last 2 (g6, g7) alone, with the same budget
    assert [p[:3] for p in played] == [(False, 48, {"company"}), (True, 16, {"single"})] * 2
    assert played[1][3] == {"g6", "g7"}
    for h in res.history:
        assert h["rollout/episodes"] == 64 and h["rollout/single_episodes"] == 16
        assert 0.0 <= h["rollout/single_success"] <= 1.0 and h["train/turns"] > 0
    # off by default: the company alone, no single-agent keys, the same resume key as before the option
    assert "rollout/single_episodes" not in train(
        tiny_params(iterations=1), start_policy, sum_tasks(0, 50), tmp_path / "p2", NullTracker(),
        ckpt_dir=tmp_path / "c2", log=lambda *_: None).history[0]
    assert "single_share" not in loop.resume_key(tiny_params())["train"]


def test_bf16_on_the_torch_backend_runs_bf16_matmuls_on_fp32_weights(start_policy, tmp_path):
    from rlcr.config import TrainConfig
    from rlcr.train.backend import TorchBackend
    from rlcr.train.loss import Refusals, policy_loss

    model = load_policy(start_policy)[0]
    g = torch.Generator().manual_seed(0)
    batch = {"prompts": torch.randint(4, 20, (2, 6), generator=g), "prompt_mask": torch.ones(2, 6, dtype=torch.long),
             "prompt_index": torch.arange(2), "completions": torch.randint(4, 20, (2, 8), generator=g),
             "loss_mask": torch.ones(2, 8), "old_logprobs": torch.full((2, 8), -3.0),
             "advantages": torch.tensor([1.0, -1.0])}
    steps = {}
    for bf16 in (False, True):
        backend = TorchBackend(load_policy(start_policy)[0], TrainConfig(lr=1e-3, bf16=bf16))
        with backend.autocast():
            assert backend.model.lm_head(torch.zeros(1, model.config.hidden_size)).dtype == (
                torch.bfloat16 if bf16 else torch.float32)
            new_lp, logits = completion_logprobs(backend.model, batch)
        assert logits.dtype == torch.float32  # log-softmax in fp32 either way
        loss, _ = policy_loss(new_lp, batch["old_logprobs"], batch["advantages"], batch["loss_mask"], logits=logits)
        backend.backward(loss)
        assert all(p.grad.dtype == torch.float32 for p in backend.model.parameters() if p.grad is not None)
        backend.step(Refusals())
        steps[bf16] = ({k: v - model.state_dict()[k] for k, v in backend.model_state().items()}, new_lp.detach())
    (d32, lp32), (d16, lp16) = steps[False], steps[True]
    assert all(v.dtype == torch.float32 for v in d16.values())
    gap = float((lp16 - lp32).abs().max())
    assert 0 < gap < 0.1, gap  # bf16 rounding, not another model
    moved = torch.cat([d32[k].flatten() for k in d32]).abs() > 5e-4  # Adam's first step moves ~lr
    agree = (torch.cat([d16[k].flatten() for k in d16]).sign() == torch.cat([d32[k].flatten() for k in d32]).sign())
    assert float(agree[moved].float().mean()) > 0.95

    # the loop trains through it: the bf16 trainer's logprobs differ from the fp32 engine's by bf16 rounding
    res = train(tiny_params(reward={"token_cost": 0.1}, iterations=1, bf16=True), start_policy, sum_tasks(0, 50),
                tmp_path / "policy", NullTracker(), ckpt_dir=tmp_path / "ckpt", log=lambda *_: None)
    h = res.history[0]
    assert h["train/turns"] > 0 and h["train/refused_updates"] == 0
    assert 1e-4 < h["perf/logprob_mismatch_max"] < 0.5, h["perf/logprob_mismatch_max"]


def test_kl_to_the_start_and_off_policy_minibatches_show_in_the_losses(start_policy, tmp_path):
    params = tiny_params(iterations=2, kl_coef=0.1, minibatches=2, per_role_groups=True)
    res = train(params, start_policy, sum_tasks(0, 50), tmp_path / "policy", NullTracker(),
                ckpt_dir=tmp_path / "ckpt", log=lambda *_: None)
    first, second = res.history
    assert first["train/steps"] == 2 and first["train/turns"] >= 64  # kl keeps zero-advantage turns too
    assert 0.0 <= first["losses/kl"] < second["losses/kl"]  # the policy moves away from the reference
    assert first["losses/ratio_mean"] != 1.0  # the second minibatch is off-policy


def test_nan_in_rollout_logprobs_is_refused_and_never_reaches_the_weights(start_policy, tmp_path, monkeypatch):
    from rlcr.policy import torch_engine

    real = torch_engine.TorchEngine.generate

    def poisoned(self, prompts, sampling):  # a real NaN in what the engine hands the trainer
        out = real(self, prompts, sampling)
        for c in out:
            if c.logprobs:
                c.logprobs[0] = float("nan")
        return out

    monkeypatch.setattr(torch_engine.TorchEngine, "generate", poisoned)
    params = tiny_params(iterations=2)
    res = train(params, start_policy, sum_tasks(0, 50), tmp_path / "policy", NullTracker(),
                ckpt_dir=tmp_path / "ckpt", log=lambda *_: None)
    assert res.refused_updates == 2 and res.history[-1]["train/refused_updates"] == 2
    before, after = weights(start_policy), weights(tmp_path / "policy")
    assert all(torch.equal(before[k], after[k]) for k in before)


def _run(start: Path, out: Path, ckpt: Path, iterations: int, report: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, __file__, "run", str(start), str(out), str(ckpt), str(iterations), str(report)],
                          env=env, capture_output=True, text=True, timeout=600)


def test_resume_in_a_fresh_process_equals_an_uninterrupted_run_bit_for_bit(start_policy, tmp_path):
    n = 2
    full = _run(start_policy, tmp_path / "full", tmp_path / "ckpt_full", 2 * n, tmp_path / "full.json")
    half = _run(start_policy, tmp_path / "half", tmp_path / "ckpt", n, tmp_path / "half.json")
    assert full.returncode == 0 and half.returncode == 0, full.stderr + half.stderr
    # a writer killed mid-write leaves a temp file, and a torn newer file must be skipped too
    (tmp_path / "ckpt" / ".ckpt-3.abc.tmp").write_bytes(b"half a checkpoint")
    (tmp_path / "ckpt" / "ckpt-3.pt").write_bytes((tmp_path / "ckpt" / f"ckpt-{n}.pt").read_bytes()[:1000])
    rest = _run(start_policy, tmp_path / "resumed", tmp_path / "ckpt", 2 * n, tmp_path / "resumed.json")
    assert rest.returncode == 0, rest.stderr
    assert f"resumed from {tmp_path / 'ckpt' / f'ckpt-{n}.pt'} at iteration {n}" in rest.stdout
    a, b = json.loads((tmp_path / "full.json").read_text()), json.loads((tmp_path / "resumed.json").read_text())
    assert b["resumed_from"] == n and len(b["history"]) == 2 * n
    assert untimed(a["history"]) == untimed(b["history"])  # every logged metric, exactly
    wa, wb = weights(tmp_path / "full"), weights(tmp_path / "resumed")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # bit for bit
    assert not torch.equal(wa["model.embed_tokens.weight"], weights(start_policy)["model.embed_tokens.weight"])


def test_resume_refuses_a_checkpoint_written_with_other_params(start_policy, tmp_path):
    train(tiny_params(iterations=1), start_policy, sum_tasks(0, 20), tmp_path / "p", NullTracker(),
          ckpt_dir=tmp_path / "ckpt", log=lambda *_: None)
    with pytest.raises(CheckpointError, match="other train/org/reward/engine params"):
        train(tiny_params(iterations=2, lr=1e-3), start_policy, sum_tasks(0, 20), tmp_path / "p", NullTracker(),
              ckpt_dir=tmp_path / "ckpt", log=lambda *_: None)


DS_SCRIPT = """
import copy, json, sys
import torch
sys.path.insert(0, {root!r})
from rlcr.config import TrainConfig
from rlcr.policy.models import load_policy
from rlcr.train.backend import DeepSpeedBackend, TorchBackend
from rlcr.train.loss import Refusals, policy_loss, sequence_logprobs
model, tok = load_policy({start!r})
torch.manual_seed(0)
ids = torch.randint(4, 20, (4, 24)); attn = torch.ones_like(ids)
mask = torch.zeros(4, 23); mask[:, 10:] = 1
old = sequence_logprobs(model, ids, attn).detach(); adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
out = {{}}
for b in (TorchBackend(copy.deepcopy(model), TrainConfig(lr=1e-3)),
          DeepSpeedBackend(copy.deepcopy(model), TrainConfig(lr=1e-3, backend="deepspeed", zero_stage=0))):
    loss, _ = policy_loss(sequence_logprobs(b.model, ids, attn), old, adv, mask)
    b.backward(loss); b.step(Refusals())
    out[b.name] = {{k: v.detach().clone() for k, v in b.model_state().items()}}
start = model.state_dict()
print(json.dumps({{"max_diff": max(float((out["torch"][k] - out["deepspeed"][k]).abs().max()) for k in start),
                   "moved": max(float((out["torch"][k] - start[k]).abs().max()) for k in start)}}))
"""


def test_deepspeed_zero0_takes_the_same_step_as_torch(start_policy):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, "-c", DS_SCRIPT.format(root=str(ROOT), start=str(start_policy))],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"DeepSpeed ZeRO-0 vs torch after one step: max |diff| {res['max_diff']:.2e}, step size {res['moved']:.2e}")
    assert res["moved"] > 1e-5  # the step did something
    assert res["max_diff"] <= 1e-6, res  # same AdamW, same clipping: equal to float32 round-off


@pytest.mark.slow
def test_two_ranks_train_data_parallel_and_only_rank_0_writes(start_policy, tmp_path):
    """torchrun with 2 CPU ranks (gloo): each rank rolls out its own tasks, gradients are averaged,
    rank 0 alone checkpoints and writes the policy; a second launch resumes from it."""
    from helpers import torchrun_cmd

    def launch(iterations: int) -> subprocess.CompletedProcess:
        cmd, env = torchrun_cmd(__file__, "run", str(start_policy), str(tmp_path / "out"), str(tmp_path / "ckpt"),
                                str(iterations), str(tmp_path / "report.json"), "deepspeed")
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)

    first = launch(1)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert [p.name for p in list_checkpoints(tmp_path / "ckpt")] == ["ckpt-1.pt"]
    second = launch(2)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert second.stdout.count("resumed from") == 1  # printed by rank 0 only
    r0 = json.loads((tmp_path / "report.json").read_text())
    r1 = json.loads((tmp_path / "report.json.rank1").read_text())
    assert r0["resumed_from"] == r1["resumed_from"] == 1 and len(r0["history"]) == len(r1["history"]) == 2
    assert untimed(r0["history"])[-1] != untimed(r1["history"])[-1]  # each rank rolled out its own tasks
    assert (tmp_path / "out/config.json").is_file()


# ------------------------------------------------------------------------- subprocess runner


def _main(argv: list[str]) -> None:
    start, out, ckpt, iterations, report, *backend = argv
    params = tiny_params(iterations=int(iterations), **({"backend": backend[0]} if backend else {}))
    res = train(params, Path(start), sum_tasks(0, 50), Path(out), NullTracker(), ckpt_dir=Path(ckpt))
    rank = os.environ.get("RANK", "0")
    Path(f"{report}.rank{rank}" if rank != "0" else report).write_text(
        json.dumps({"history": res.history, "resumed_from": res.resumed_from}))


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "run":
    _main(sys.argv[2:])
