"""Bootstrap: scripted traces, the keep-correct-agents filter, the encoding, the drill, that SFT on
the traces teaches a role its action, the instruct path (hard links), and the stage via `dvc repro`."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import time

import pytest
import torch
import yaml

from rlcr.config import BootstrapConfig, load_params
from rlcr.org.protocol import parse_turn
from rlcr.policy.bridge import completion_ids, prompt_ids, token_length_fn
from rlcr.policy.engine import Sampling
from rlcr.policy.models import build_tiny, load_policy, save_policy
from rlcr.policy.tokenizer import build_tokenizer
from rlcr.policy.torch_engine import TorchEngine
from rlcr.tasks import build_family
from rlcr.train import bootstrap as B
from rlcr.train.sft import train_sft

PARAMS = load_params()
TOK = build_tokenizer("numbers")  # the tiny default
LEN = token_length_fn(TOK)
STEPS = int(os.environ.get("RLCR_TEST_SFT_STEPS", 100))


def sums(n: int, difficulty: int, seed: int = 0, family: str = "sum"):
    return build_family(family, {"digits": 2}).generate(seed, n, difficulty)


def cfg(**kw) -> BootstrapConfig:
    base = {"episodes": 60, "steps": 10, "warmup_steps": 1, "eval_tasks": 0}
    return BootstrapConfig(**{**base, **kw})


# ------------------------------------------------------------------------------- the filter


@pytest.mark.parametrize("text, ok", [
    ("POST @agent0 68+57=125\nDONE", True),
    ("POST @agent0 68+57=124\nDONE", False),
    ("68+57=125;125+42=167;167-37=130\nSUBMIT 130", True),
    ("68+57=125;125+42=168;168-37=131\nSUBMIT 131", False),  # one wrong step is enough
    ("42+37=79\nPOST @agent0 APPROVE 42+37=79\nDONE", True),
    ("42+37=79\nPOST @agent0 APPROVE 42+37=80\nDONE", False),  # approving a wrong claim
    ("42+37=79\nPOST @agent0 REJECT 42+37=80\nDONE", True),  # the claim is wrong by design
    ("42+37=79\nPOST @agent0 REJECT 42+37=79\nDONE", False),  # rejecting a right claim
    ("-15-20=-35\nSUBMIT -35", True),
    ("HIRE worker: 68+57\nHIRE worker: 42-37", True),  # briefs are not claims
    ("WAIT", True),
])
def test_turn_is_correct(text, ok):
    assert B.turn_is_correct(text) is ok


OBS = ("agent0 | role ceo | depth 0\nround 3 of 12 | tokens left 466\ntask:\n| 9+4+2+3\n"
       "for you (last 2 of 2):\n[#1 agent1 worker] @agent0 9+4=13\n[#2 agent2 worker] @agent0 2+3=5")


@pytest.mark.parametrize("text, ok", [
    ("13+5=18\nSUBMIT 18", True),  # both results copied from the posts
    ("3+6=9\nSUBMIT 9", False),  # holds, but 6 is in no content line (the round's 3 of 12 is not content)
    ("9+4=13;13+2=15;15+3=18\nSUBMIT 18", True),  # the task's terms, then its own results
    ("13+7=20\nSUBMIT 20", False),  # 7 copied from nowhere
    ("12+1=13\nSUBMIT 13", False),  # agent1 and post #1 are ids, not numbers to copy
    ("POST @agent0 APPROVE 9+4=13", True),
])
def test_operands_must_come_from_the_observation(text, ok):
    assert B.turn_is_correct(text, OBS) is ok


def test_only_agents_that_erred_are_dropped_and_verifiers_learn_from_wrong_posts():
    recs = B.scripted_traces(sums(40, 3), cfg(episodes=40, styles={"verify": 1.0}, error_rates=(0.3,)),
                             PARAMS.org, PARAMS.reward, LEN)
    wrong_workers = rejects_kept = 0
    for rec in recs:
        good = B.correct_agents(rec)
        for t in rec.turns:
            if not B.turn_is_correct(t.completion):
                assert t.agent not in good
                wrong_workers += t.role == "worker"
            if "REJECT" in t.completion and t.agent in good:
                rejects_kept += 1
        if rec.episode.outcome < 1:
            assert rec.episode.submitter not in good  # a wrong submission is never imitated
    assert wrong_workers > 0 and rejects_kept > 0


def test_mixture_follows_the_weights_and_single_episodes_run_as_single():
    c = cfg(episodes=400, styles={"solo": 1, "verify": 3, "single": 0}, error_rates=(0.0,))
    specs = B.draw_specs(400, c)
    counts = {s: sum(x.style == s for x in specs) for s in B.STYLES}
    assert counts["single"] == counts["delegate"] == 0 and 70 < counts["solo"] < 130
    assert specs == B.draw_specs(400, c)  # seeded
    recs = B.scripted_traces(sums(20, 3), cfg(episodes=20, styles={"single": 1, "delegate": 1}), PARAMS.org,
                             PARAMS.reward, LEN)
    for rec in recs:
        style = rec.episode.episode_id.split(":")[1]
        assert rec.episode.mode == ("single" if style == "single" else "company")
        if style == "delegate":
            assert rec.episode.n_agents == 3  # CEO + one worker per half of 4 terms


def test_examples_are_the_bridge_encoding_with_loss_on_the_turn_only():
    recs = B.scripted_traces(sums(10, 1) + sums(10, 3), cfg(episodes=20), PARAMS.org, PARAMS.reward, LEN)
    examples, too_long = B.trace_examples(recs, TOK, PARAMS.org.context_tokens)
    kept = list(B.kept_turns(recs))
    assert too_long == 0 and len(examples) == len(kept) > 0
    for ex, (_, turn) in zip(examples, kept, strict=True):
        p, c = prompt_ids(TOK, turn.prompt), completion_ids(TOK, turn.completion)
        assert list(ex.input_ids) == p + c and c[-1] == TOK.eos_token_id
        assert list(ex.loss_mask) == [0] * len(p) + [1] * len(c)
    short, dropped = B.trace_examples(recs, TOK, 200)
    assert dropped > 0 and all(len(e.input_ids) <= 200 for e in short)


def test_turns_that_build_on_others_results_are_weighted_and_verify_episodes_draw_their_own_rates():
    c = cfg(episodes=300, styles={"verify": 1, "delegate": 1}, error_rates=(0.0,), verify_error_rates=(0.5,))
    assert {(s.style, s.error_rate) for s in B.draw_specs(300, c)} == {("verify", 0.5), ("delegate", 0.0)}
    recs = B.scripted_traces(sums(12, 1) + sums(12, 3), cfg(episodes=24, styles={"verify": 1}), PARAMS.org,
                             PARAMS.reward, LEN)
    kept = [t for _, t in B.kept_turns(recs)]
    reused = [t for t in kept if B.builds_on_others(t)]
    assert {t.role for t in reused} == {"ceo", "verifier"}  # combines and verdicts, never a worker's own sum
    assert all("=" in t.completion for t in reused if t.role == "ceo")
    once, _ = B.trace_examples(recs, TOK, PARAMS.org.context_tokens)
    thrice, _ = B.trace_examples(recs, TOK, PARAMS.org.context_tokens, reuse_weight=3)
    assert len(thrice) == len(once) + 2 * len(reused)


SHAPES = [[87, 21, 96, 91], [87, 21], [108, 187], [5, -3], [4, 7, -2]]


def test_sum_shapes_are_the_prompts_and_subproblems_that_are_sums():
    from rlcr.tasks import SubProblem, Task

    task = Task("t1", "sum", "math", 3, "87+21+96+91", "295",
                (SubProblem("87+21", "108"), SubProblem("96+91", "187"), SubProblem("108+187", "295")))
    gcd = Task("t2", "rg/gcd", "math", 0, "Find the GCD of 12 and 18", "6")
    assert B.sum_shapes([task, gcd]) == [[87, 21, 96, 91], [87, 21], [96, 91], [108, 187]]


def test_drill_chains_are_true_and_only_the_worked_chain_carries_loss():
    seen, digits = set(), set()
    for ex in B.arithmetic_examples(300, TOK, seed=1, shapes=SHAPES):
        context = TOK.decode([i for i, m in zip(ex.input_ids, ex.loss_mask, strict=True) if not m])
        target = TOK.decode([i for i, m in zip(ex.input_ids, ex.loss_mask, strict=True) if m])
        assert context.startswith("<bos>") and context.endswith("=") and target.endswith("\n")
        terms = [int(t) for t in re.findall(r"[-+]?\d+", context[len("<bos>"):-1])]
        steps = target[:-1].split(";")
        assert len(steps) == len(terms) - 1 and 2 <= len(terms) <= 4
        acc = terms[0]
        for t, step in zip(terms[1:], steps, strict=True):
            left, result = step.split("=")
            assert [int(x) for x in re.findall(r"[-+]?\d+", left)] == [acc, t]  # operands copied
            acc += t
            assert int(result) == acc
        seen.add(any(t < 0 for t in terms))
        digits.add(tuple(len(str(abs(t))) for t in terms))
    assert seen == {True, False}  # signed and unsigned sums
    assert digits == {(2, 2, 2, 2), (2, 2), (3, 3), (1, 1), (1, 1, 1)}  # exactly the given sums
    assert B.arithmetic_examples(50, TOK, 3, SHAPES) == B.arithmetic_examples(50, TOK, 3, SHAPES)
    with pytest.raises(ValueError, match="no sum among the train tasks"):
        B.arithmetic_examples(5, TOK, 3, [])


def test_the_drill_never_shows_an_eval_prompt_and_draws_the_train_families_real_sums():
    from rlcr.config import FamilySpec
    from rlcr.tasks import build_family

    evals = build_family("sum", {"digits": 1}).generate(0, 30, 1) + build_family("sum", {"digits": 1}).generate(0, 8, 3)
    exclude = {t.prompt for t in evals}
    specs = (FamilySpec("sum", 40, (1, 3), {"digits": 1}), FamilySpec("rg/gcd", 4))
    fresh = B.drill_tasks(specs, seed=0, exclude=exclude, n=300)
    assert fresh and not {t.prompt for t in fresh} & exclude and {t.family for t in fresh} == {"sum"}
    shapes = B.sum_shapes(fresh)
    drilled = {TOK.decode([i for i, m in zip(e.input_ids, e.loss_mask, strict=True) if not m])[len("<bos>"):-1]
               for e in B.arithmetic_examples(4000, TOK, 0, shapes, exclude)}
    assert not drilled & exclude  # not even as a sub-problem of a fresh task
    # the real pair sums and combines: one-digit terms, partial sums of at most 18
    assert all(abs(int(t)) <= 36 for e in drilled for t in re.findall(r"[-+]?\d+", e))
    assert B.drill_tasks(specs, 0, exclude, 300) == fresh  # a pure function of its arguments


def test_fresh_trace_tasks_are_long_unseen_sums_spread_evenly_among_the_train_tasks():
    from rlcr.config import FamilySpec

    evals = sums(30, 1) + sums(8, 3)
    exclude = {t.prompt.replace(" ", "") for t in evals}  # as bootstrap_policy builds it
    specs = (FamilySpec("sum", 40, (1, 2, 3), {"digits": 2}), FamilySpec("rg/gcd", 4))
    train = build_family("sum", {"digits": 2}).generate(7, 40, 1)
    c = cfg(episodes=400, fresh_share=0.5, fresh_min_difficulty=2)
    fresh = B.fresh_trace_tasks(specs, c, exclude)
    assert fresh and {t.difficulty for t in fresh} == {2, 3} and {t.family for t in fresh} == {"sum"}
    assert not {t.prompt.replace(" ", "") for t in fresh} & exclude  # no eval prompt is a trace task
    assert B.fresh_trace_tasks(specs, c, exclude) == fresh  # seeded

    picked = B.trace_tasks(train, fresh, 400, 0.5)
    assert picked[0::2] == [train[i % 40] for i in range(200)]  # every other episode, the train split cycled
    assert picked[1::2] == [fresh[i % len(fresh)] for i in range(200)]
    for share, n_fresh in ((0.0, 0), (0.3, 120), (1.0, 400)):
        got = B.trace_tasks(train, fresh, 400, share)
        assert sum(t in fresh for t in got) == n_fresh and len(got) == 400
        assert all(sum(t in fresh for t in got[i:i + 10]) == round(10 * share) for i in range(0, 400, 10))  # spread
    # sums that stop below the minimum: their longest ones; no sum family at all: an error that says so
    assert {t.difficulty for t in B.fresh_trace_tasks(specs, cfg(fresh_share=0.5, fresh_min_difficulty=5), exclude)} == {3}
    with pytest.raises(ValueError, match="bootstrap.fresh_share > 0 needs a sum family"):
        B.fresh_trace_tasks((FamilySpec("rg/gcd", 4),), c, exclude)
    with pytest.raises(ValueError, match="bootstrap.fresh_share"):
        cfg(fresh_share=1.5)


def test_reuse_traces_are_distinct_unseen_company_episodes_whose_combines_and_verdicts_join_the_traces():
    from rlcr.config import FamilySpec

    evals = sums(30, 2) + sums(8, 3)
    exclude = {t.prompt.replace(" ", "") for t in evals}
    specs = (FamilySpec("sum", 40, (1, 2, 3), {"digits": 2}), FamilySpec("rg/gcd", 4))
    c = cfg(reuse_episodes=80, fresh_min_difficulty=2, error_rates=(0.0, 0.3))
    recs = B.reuse_traces(specs, c, PARAMS.org, PARAMS.reward, LEN, exclude)
    tasks = [json.loads(r.episode.task)["prompt"] for r in recs]
    assert len(recs) == 80 and len(set(tasks)) == 80  # each task once
    assert not {t.replace(" ", "") for t in tasks} & exclude  # no eval prompt
    assert {r.episode.episode_id.split(":")[1] for r in recs} == {"delegate", "verify"}  # the styles that combine
    assert [r.episode.task for r in B.reuse_traces(specs, c, PARAMS.org, PARAMS.reward, LEN, exclude)] == \
        [r.episode.task for r in recs]  # seeded
    fresh = {t.prompt for t in B.fresh_trace_tasks(specs, cfg(fresh_share=0.5, episodes=80), exclude)}
    assert len(set(tasks) - fresh) > 40  # a seed of their own: mostly other tasks than the fresh trace tasks

    examples, too_long = B.reuse_examples(recs, TOK, PARAMS.org.context_tokens)
    assert too_long == 0
    kept = [t for _, t in B.kept_turns(recs)]
    assert len(examples) == sum(B.builds_on_others(t) for t in kept) < len(kept)  # only combines and verdicts
    assert {t.role for t in kept if B.builds_on_others(t)} == {"ceo", "verifier"}
    assert B.reuse_examples(recs, TOK, 100) == ([], len(examples))  # too long for the context: left out, counted
    # with the splits: the managers' HIREs of sum briefs join them, once each
    with_splits, _ = B.reuse_examples(recs, TOK, PARAMS.org.context_tokens, splits=True)
    splits = [t for t in kept if B.is_split(t)]
    assert splits and {t.role for t in splits} == {"ceo"} and all(t.completion.startswith("HIRE") for t in splits)
    assert len(with_splits) == len(examples) + len(splits)
    # their own least difficulty: 4-term sums only, the fresh trace tasks keep theirs
    only_long = B.reuse_traces(specs, cfg(reuse_episodes=20, fresh_min_difficulty=2, reuse_min_difficulty=3), PARAMS.org,
                               PARAMS.reward, LEN, exclude)
    assert {json.loads(r.episode.task)["difficulty"] for r in only_long} == {3}
    assert {json.loads(r.episode.task)["difficulty"] for r in recs} == {2, 3}
    with pytest.raises(ValueError, match="bootstrap.reuse_min_difficulty"):
        cfg(reuse_min_difficulty=-1)
    with pytest.raises(ValueError, match="bootstrap.reuse_splits"):
        cfg(reuse_splits=True)  # no reuse episodes to take them from
    with pytest.raises(ValueError, match="bootstrap.reuse_episodes > 0 needs a sum family"):
        B.reuse_traces((FamilySpec("rg/gcd", 4),), c, PARAMS.org, PARAMS.reward, LEN, exclude)
    with pytest.raises(ValueError, match="bootstrap.reuse_episodes"):
        cfg(reuse_episodes=-1)
    with pytest.raises(ValueError, match="needs the delegate or verify style"):
        cfg(reuse_episodes=10, styles={"solo": 1.0})


def test_step_batches_spread_drill_steps_and_never_mix():
    lengths = [random.Random(i).randint(50, 900) for i in range(32)]
    batches = B.step_batches(trace_lengths=lengths, n_drill=40 * 8, steps=56, batch_size=4, drill_batch_size=8,
                             drill_share=40 / 56, seed=0)
    drill = [b for b in batches if b[0] >= 32]
    traces = [b for b in batches if b[0] < 32]
    assert len(batches) == 56 and len(drill) == B.drill_steps(56, 40 / 56) == 40
    assert all(all(i >= 32 for i in b) or all(i < 32 for i in b) for b in batches)
    assert sorted(i for b in drill for i in b) == list(range(32, 32 + 320))  # fresh drill examples
    assert len(traces) == 16 and all(len(b) == 4 for b in traces)
    assert sorted(i for b in traces[:8] for i in b) == list(range(32))  # each epoch sees every trace once
    assert batches == B.step_batches(lengths, 320, 56, 4, 8, 40 / 56, 0)
    with pytest.raises(ValueError, match="too few"):
        B.step_batches(lengths, 8, 56, 4, 8, 40 / 56, 0)


def test_length_batches_pad_less_than_random_batches():
    rng = random.Random(0)
    lengths = [rng.randint(200, 850) for _ in range(512)]
    batches = B.length_batches(lengths, 16, random.Random(1))
    assert sorted(i for b in batches for i in b) == list(range(512))

    def padded(bs):
        return sum(max(lengths[i] for i in b) * len(b) for b in bs)

    shuffled = list(range(512))
    rng.shuffle(shuffled)
    plain = [shuffled[i : i + 16] for i in range(0, 512, 16)]
    assert padded(batches) < 0.8 * padded(plain)


# ----------------------------------------------------------------------------------- learning


def kinds(text: str) -> list[str]:
    return [a.kind for a in parse_turn(text).actions]


def right_action(model, turns) -> float:
    """Share of turns where the model's greedy turn has the scripted turn's action kinds, e.g.
    [HIRE, HIRE] for a CEO with four terms in round 1, [SUBMIT] with two, [WAIT] while its workers
    work, [POST, DONE] for a worker: role- and situation-dependent protocol, not arithmetic."""
    eng = TorchEngine(model, TOK, context=model.config.max_position_embeddings)
    outs = eng.generate([prompt_ids(TOK, t.prompt) for t in turns], Sampling(temperature=0, max_new_tokens=40))
    return sum(kinds(TOK.decode(o.token_ids, skip_special_tokens=True)) == kinds(t.completion)
               for t, o in zip(turns, outs, strict=True)) / len(turns)


def test_sft_on_traces_teaches_each_role_its_action():
    """Learning test: a small model, delegate traces, ~30 s on one thread; held-out tasks."""
    torch.set_num_threads(1)
    org = dataclasses.replace(PARAMS.org, max_obs_tokens=256, context_tokens=320, max_turn_tokens=64)
    mcfg = dataclasses.replace(PARAMS.model, hidden_size=64, intermediate_size=172, num_layers=2, context=320)
    model, _ = build_tiny(mcfg, seed=0)
    c = cfg(episodes=200, styles={"delegate": 1.0}, error_rates=(0.0,), steps=STEPS, batch_size=16, lr=3e-3,
            warmup_steps=10)
    held = B.scripted_traces(sums(12, 1, seed=99) + sums(12, 3, seed=99), dataclasses.replace(c, episodes=24), org,
                             PARAMS.reward, LEN)
    held_turns = [t for _, t in B.kept_turns(held)]
    before = right_action(model, held_turns)
    recs = B.scripted_traces(sums(100, 1, seed=1) + sums(100, 3, seed=1), c, org, PARAMS.reward, LEN)
    examples, _ = B.trace_examples(recs, TOK, 320)
    t0 = time.perf_counter()
    train_sft(model, examples, c, TOK.pad_token_id)
    model.eval()
    after = right_action(model, held_turns)
    print(f"right action kinds on held-out turns: {before:.2f} -> {after:.2f} ({time.perf_counter() - t0:.0f} s)")
    assert {t.role for t in held_turns} == {"ceo", "worker"} and len(held_turns) > 50
    assert before < 0.1 and after > 0.6


# ------------------------------------------------------------------------------ instruct path


def test_instruct_profile_links_the_base_model(tmp_path):
    small = dataclasses.replace(PARAMS.model, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2)
    model, tok = build_tiny(small, seed=3)
    base = save_policy(model, tok, tmp_path / "base")
    params = dataclasses.replace(
        PARAMS, model=dataclasses.replace(small, kind="hf", path=str(base)),
        bootstrap=dataclasses.replace(PARAMS.bootstrap, eval_tasks=0))
    folder = tmp_path / "models/bootstrap"
    folder.mkdir(parents=True)
    (folder / "stale.bin").write_text("an older policy")
    res = B.bootstrap_policy(params, [], [], folder)
    assert res.base == str(base) and not folder.is_symlink() and not (folder / "stale.bin").exists()
    for f in base.iterdir():
        assert (folder / f.name).stat().st_ino == f.stat().st_ino  # hard links: no second copy on disk
    loaded, _ = load_policy(folder)
    for (k, v), (k2, v2) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(v, v2)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temp leftovers


def test_link_base_refuses_a_folder_without_a_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        B.link_base(tmp_path, tmp_path / "out")


# ------------------------------------------------------------------------------ stage end to end


@pytest.mark.slow
def test_stage_through_dvc_repro(project_copy):
    """prepare then bootstrap in a throwaway copy on small params: outs, metric, MLflow run, imports."""
    import subprocess

    from mlflow import MlflowClient

    root = project_copy
    data = yaml.safe_load((root / "params.yaml").read_text())
    data["prepare"]["train"] = [{"name": "sum", "n": 30, "difficulties": [1, 3]}]
    data["prepare"]["eval"] = [{"name": "sum", "n": 4, "difficulties": [1, 3]}, {"name": "rg/gcd", "n": 2}]
    data["bootstrap"].update(episodes=30, steps=12, batch_size=4, drill_share=0.5, drill_batch_size=16,
                             warmup_steps=2, eval_tasks=4, drill_first=4)
    data["profiles"]["tiny"] = {"model": {"hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "num_heads": 2}}
    (root / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    env = {**os.environ, "DVC_SITE_CACHE_DIR": str(root / ".state/dvc"), "RLCR_IMPORTS_OUT": str(root / "imports.json")}
    proc = subprocess.run(["dvc", "repro", "bootstrap"], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Running stage 'prepare'" in proc.stdout and "Running stage 'bootstrap'" in proc.stdout

    model, tok = load_policy(root / "models/bootstrap")
    assert model.config.hidden_size == 32 and len(tok) == len(TOK)
    metrics = json.loads((root / "metrics/bootstrap.json").read_text())
    for key in ("bootstrap/company/greedy/d3", "bootstrap/single/sampled/d1", "traces/episodes", "drill/examples",
                "losses/sft_final", "perf/tokens_per_s"):
        assert key in metrics, key
    assert metrics["traces/episodes"] == 30 and metrics["bootstrap/eval_tasks"] == 4
    assert 0 < metrics["traces/fresh_tasks"] <= 15  # bootstrap.fresh_share 0.5 of the episodes

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rlcr-collective-rewards")
    (run,) = client.search_runs([exp.experiment_id], "tags.`rlcr.stage` = 'bootstrap'")
    assert run.info.status == "FINISHED" and run.data.params["bootstrap.steps"] == "12"
    assert "losses/sft" in run.data.metrics and "bootstrap/company/greedy/d3" in run.data.metrics
    assert len(client.get_metric_history(run.info.run_id, "losses/sft")) >= 2
    assert any(a.path == "bootstrap" for a in client.list_artifacts(run.info.run_id))

    # every rlcr module the stage imported is a declared dependency
    deps = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["bootstrap"]["deps"]
    imported = json.loads((root / "imports.json").read_text())
    missing = [m for m in imported if not any(m == d or m.startswith(d.rstrip("/") + "/") for d in deps)]
    assert not missing, f"stage imports modules dvc.yaml does not list: {missing}"

    again = subprocess.run(["dvc", "repro", "bootstrap"], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "Running stage" not in again.stdout


def test_a_long_sum_is_drilled_as_the_parts_roles_add_never_whole():
    terms = list(range(1, 10)) * 3 + [4, 5]  # 29 terms
    shapes = B.long_sum_shapes(terms)
    assert max(len(s) for s in shapes) <= B.LONG_PART + 2 and terms not in shapes
    # the flat split's worker parts (29 terms: 5 parts, 6+6+6+6+5), then the manager's sum of their results
    assert shapes[:5] == [terms[0:6], terms[6:12], terms[12:18], terms[18:24], terms[24:29]]
    assert shapes[5] == [sum(p) for p in shapes[:5]]
    assert [sum(terms[:10])] + terms[10:19] in shapes  # a single agent's second turn: running sum, next terms
    task = build_family("sum", {"digits": 1}).generate(0, 1, 31)[0]
    assert B.sum_shapes([task]) == B.long_sum_shapes(task.meta["terms"])


def test_a_ceo_whose_episode_ends_without_a_right_answer_is_not_imitated():
    from rlcr.config import OrgConfig
    from rlcr.org import run_episodes
    from rlcr.org.scripted import Replay

    # the CEO waits for a result that never comes; its worker's own turn is right and stays
    script = {(0, 1): "HIRE worker: 6+5", (1, 2): "6+5=11\nDONE"}
    task = build_family("sum", {"digits": 1}).generate(0, 1, 1)[0]
    rec = run_episodes([task], Replay(script, default="WAIT"), OrgConfig(max_rounds=4))[0]
    assert rec.episode.submitter < 0 and rec.episode.outcome == 0.0
    assert B.correct_agents(rec) == {1}
