"""The round scheduler with scripted policies on built-in tasks."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest

from rlcr.config import ConfigError, OrgConfig, RewardConfig
from rlcr.org import run_episodes
from rlcr.org.episode import Generation, approx_tokens
from rlcr.org.records import read_parquet, to_frames, write_parquet
from rlcr.org.scripted import Replay, ScriptedOrg
from rlcr.tasks import build_family

TASK4 = build_family("sum").generate(0, 1, 3)[0]  # 68+57+42+37 = 204
BIG = dict(max_agents=256, max_depth=8, max_rounds=60, token_budget=100_000, max_turn_tokens=1000,
           max_obs_tokens=8000, context_tokens=9000, board_posts_shown=50)


def cfg(**over) -> OrgConfig:
    return OrgConfig(**over)


def test_task_fixture_is_the_documented_example():
    assert (TASK4.prompt, TASK4.answer) == ("68+57+42+37", "204")


def test_one_batch_call_per_round_across_all_episodes():
    tasks = build_family("sum").generate(0, 3, 3)
    pol = Replay({(0, 1): "HIRE worker: a\nHIRE worker: b", (0, 3): "SUBMIT 1"})
    recs = run_episodes(tasks, pol, cfg())
    assert pol.calls == 3
    # round 1: three CEOs; rounds 2-3: three CEOs and six workers, all in one call each
    assert [len(r) for r in pol.requests] == [3, 9, 9]
    assert {r.episode_id for r in pol.requests[1]} == {e.episode.episode_id for e in recs}
    assert all(e.episode.end_reason == "submit" and e.episode.rounds == 3 for e in recs)


def test_hires_join_next_round_and_org_chart_is_recorded():
    pol = Replay({(0, 1): "HIRE lead: part one", (1, 2): "HIRE worker: sub part", (0, 4): "SUBMIT 204"})
    rec = run_episodes([TASK4], pol, cfg())[0]
    org = rec.episode.org()
    assert [(m["agent"], m["role"], m["parent"], m["depth"], m["round"]) for m in org] == [
        (0, "ceo", -1, 0, 1), (1, "lead", 0, 1, 2), (2, "worker", 1, 2, 3)]
    assert [(t.round, t.agent) for t in rec.turns] == [(1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2), (4, 0), (4, 1), (4, 2)]
    assert rec.episode.outcome == 1.0 and rec.episode.max_depth == 2


def test_org_size_depth_and_lead_limits():
    c = cfg(max_agents=3, max_depth=1)
    pol = Replay({(0, 1): "HIRE lead: x\nHIRE worker: y\nHIRE worker: z", (1, 2): "HIRE worker: w", (2, 2): "HIRE worker: v"})
    rec = run_episodes([TASK4], pol, dataclasses.replace(c, max_rounds=2))[0]
    t1 = rec.turns[0]
    assert t1.n_actions == 2 and "org is full" in t1.errors
    pol = Replay({(0, 1): "HIRE lead: x\nHIRE worker: y", (1, 2): "HIRE worker: w", (2, 2): "HIRE worker: v"})
    rec = run_episodes([TASK4], pol, dataclasses.replace(c, max_rounds=2, max_agents=4))[0]
    lead_turn, worker_turn = rec.turns[2], rec.turns[3]
    assert "depth limit" in lead_turn.errors and not lead_turn.malformed  # a limit, not a protocol error
    assert "not available" in worker_turn.errors and worker_turn.malformed  # workers cannot hire
    no_leads = cfg(allow_leads=False, max_rounds=2)
    rec = run_episodes([TASK4], Replay({(0, 1): "HIRE lead: x", (1, 2): "HIRE worker: y"}), no_leads)[0]
    assert "not available" in rec.turns[2].errors


def test_unknown_role_is_malformed():
    rec = run_episodes([TASK4], Replay({(0, 1): "HIRE wizard: x"}), cfg(max_rounds=1))[0]
    assert rec.turns[0].malformed and "unknown role" in rec.turns[0].errors


def test_ends_at_max_rounds_truncated():
    rec = run_episodes([TASK4], Replay({}), cfg(max_rounds=3))[0]
    assert (rec.episode.end_reason, rec.episode.truncated, rec.episode.rounds, rec.episode.outcome) == ("max_rounds", True, 3, 0.0)


def test_ends_when_nobody_is_left():
    rec = run_episodes([TASK4], Replay({}, default="DONE"), cfg())[0]
    assert rec.episode.end_reason == "idle" and rec.episode.rounds == 1


def test_shared_token_budget_is_never_exceeded():
    chatty = Replay({(0, 1): "HIRE worker: a\nHIRE worker: b\nHIRE worker: c"}, default="POST " + "blah " * 200)
    c = cfg(token_budget=300, max_turn_tokens=64)
    rec = run_episodes([TASK4], chatty, c)[0]
    e = rec.episode
    assert e.end_reason == "budget" and e.truncated
    assert e.budget_used <= c.token_budget
    assert all(t.completion_tokens <= t.max_new_tokens <= c.max_turn_tokens for t in rec.turns)
    assert any(t.finish_reason == "cut" for t in rec.turns)


def test_budget_can_charge_prompt_tokens_too():
    c = cfg(token_budget=500, count_prompt_tokens=True, max_turn_tokens=32)
    rec = run_episodes([TASK4], Replay({}), c)[0]
    assert rec.episode.end_reason == "budget"
    assert rec.episode.budget_used == rec.episode.prompt_tokens + rec.episode.total_tokens <= 500


def test_policy_token_counts_win_over_the_length_function():
    class Counted:
        def generate_batch(self, reqs):
            return [Generation("SUBMIT 204", prompt_tokens=7, completion_tokens=3, token_ids=[1, 2, 3],
                               logprobs=[-0.5, -0.25, -1.0], finish_reason="stop") for _ in reqs]

    t = run_episodes([TASK4], Counted(), cfg())[0].turns[0]
    assert (t.prompt_tokens, t.completion_tokens, t.finish_reason) == (7, 3, "stop")
    assert json.loads(t.token_ids) == [1, 2, 3] and json.loads(t.logprobs) == [-0.5, -0.25, -1.0]


def test_observation_fits_its_budget_with_any_length_function():
    noisy = Replay({(0, 1): "HIRE worker: w\nHIRE worker: v"}, default="POST " + "talk " * 60 + "\nWRITE f.txt\n" + "x" * 500)
    for len_fn in (approx_tokens, len, lambda s: len(s.encode()) // 2 + 1):
        c = cfg(max_obs_tokens=200, context_tokens=400, max_turn_tokens=150, max_rounds=6)
        rec = run_episodes([TASK4], noisy, c, len_fn=len_fn)[0]
        assert all(len_fn(t.prompt) <= 200 for t in rec.turns)
        for t in rec.turns:  # the header and the task or brief survive the cut
            assert t.prompt.startswith(f"agent{t.agent} | role") and ("task:\n| 68+57" in t.prompt or "brief:\n| " in t.prompt)


def test_what_an_agent_works_from_comes_last_and_survives_a_tight_budget():
    pol = Replay({(0, 1): "HIRE worker: 68+57\nHIRE worker: 42+37", (1, 2): "POST @agent0 68+57=125",
                  (2, 2): "POST @agent0 42+37=79"}, default="WAIT")
    rec = run_episodes([TASK4], pol, cfg(max_rounds=3), len_fn=len)[0]
    ceo2, ceo3 = (next(t.prompt for t in rec.turns if t.agent == 0 and t.round == r) for r in (2, 3))
    lines = ceo3.split("\n")
    assert lines[0] == "agent0 | role ceo | you lead the company | depth 0"
    status = next(i for i, line in enumerate(lines) if line.startswith("round 3 of 3 | tokens left "))
    # status, then the task, then the posts for the CEO, and nothing after them
    assert lines[status + 1 : status + 3] == ["task:", "| 68+57+42+37"]
    assert lines[status + 3] == "for you (last 2 of 2):"
    assert lines[status + 4 :] == ["[#1 agent1 worker] @agent0 68+57=125", "[#2 agent2 worker] @agent0 42+37=79"]
    assert any(line.startswith("org (") for line in lines[:status]) and "round" not in "\n".join(lines[:status])
    # successive observations of an agent share everything above the status line (prefix cache)
    assert ceo2.startswith("\n".join(lines[:status]))
    # a budget that holds little more than the status and the task keeps exactly those, in that order
    tight = run_episodes([TASK4], Replay({}, default="WAIT"), cfg(max_obs_tokens=54, context_tokens=200,
                                                                  max_turn_tokens=64), len_fn=len)[0]
    first = tight.turns[0].prompt
    assert len(first) <= 54 and first.split("\n")[-3:] == ["round 1 of 24 | tokens left 4096", "task:", "| 68+57+42+37"]


def test_run_without_runner_is_an_error_observation_and_with_runner_shows_output():
    pol = Replay({(0, 1): "WRITE main.py\nprint(1)", (0, 2): "RUN main.py", (0, 3): "SUBMIT 1"})
    rec = run_episodes([TASK4], pol, cfg())[0]
    assert "code execution not available" in rec.turns[1].errors and not rec.turns[1].malformed
    calls = []
    runner = lambda files, path: calls.append((dict(files), path)) or "1\n"  # noqa: E731
    rec = run_episodes([TASK4], pol, cfg(), runner=runner)[0]
    assert calls == [({"main.py": "print(1)"}, "main.py")]
    assert "output of RUN main.py" in rec.turns[2].prompt


def test_single_agent_mode_runs_through_the_same_scheduler():
    c = cfg(single_agent=True)
    rec = run_episodes([TASK4], Replay({(0, 1): "POST hi\nHIRE worker: x", (0, 2): "SUBMIT 204"}), c)[0]
    assert rec.episode.mode == "single" and rec.episode.n_agents == 1
    assert rec.turns[0].malformed and "\nactions: WRITE READ SUBMIT WAIT DONE\n" in rec.turns[0].prompt
    solo = run_episodes([TASK4], ScriptedOrg("solo"), c)[0]
    assert solo.episode.outcome == 1.0
    assert solo.turns[0].completion == "68+57=125;125+42=167;167+37=204\nSUBMIT 204"
    assert solo.episode.critical_path_tokens == solo.episode.total_tokens  # one agent: time = tokens


def test_scripted_orgs_solve_error_free_and_verify_hires_verifiers():
    tasks = build_family("sum").generate(0, 4, 5)
    for style in ("solo", "delegate", "verify"):
        recs = run_episodes(tasks, ScriptedOrg(style), cfg(max_agents=32))
        assert all(r.episode.outcome == 1.0 and r.episode.malformed_turns == 0 for r in recs), style
    roles = [m["role"] for m in recs[0].episode.org()]
    assert "verifier" in roles and "lead" in roles


def test_delegate_and_verify_beats_solo_when_workers_err():
    tasks = build_family("sum").generate(1, 40, 7)  # 8 terms
    acc = {}
    for style in ("solo", "delegate", "verify"):
        recs = run_episodes(tasks, ScriptedOrg(style, error_rate=0.1, seed=3), cfg(**BIG))
        acc[style] = sum(r.episode.outcome for r in recs) / len(recs)
    assert acc["verify"] >= acc["solo"] + 0.1, acc
    assert acc["verify"] > acc["delegate"], acc


def test_critical_path_beats_solo_time_on_long_tasks_not_on_short_ones():
    c = cfg(**BIG)
    long_tasks = build_family("sum").generate(2, 2, 127)  # 128 terms
    solo = run_episodes(long_tasks, ScriptedOrg("solo"), c)
    org = run_episodes(long_tasks, ScriptedOrg("verify", error_rate=0.02, seed=1), c)
    for s, o in zip(solo, org, strict=True):
        assert o.episode.critical_path_tokens < s.episode.total_tokens, (o.episode.critical_path_tokens, s.episode.total_tokens)
        assert o.episode.total_tokens > s.episode.total_tokens  # the company spends more tokens in all
    # on a 4-term task, communication overhead eats the parallel gain (the report's Q2)
    s4 = run_episodes([TASK4], ScriptedOrg("solo"), c)[0]
    o4 = run_episodes([TASK4], ScriptedOrg("verify"), c)[0]
    assert o4.episode.critical_path_tokens > s4.episode.total_tokens


def test_scripted_org_stays_within_a_tight_budget():
    tasks = build_family("sum").generate(0, 3, 7)
    c = cfg(token_budget=40, max_turn_tokens=32)
    for style in ("solo", "verify"):
        for r in run_episodes(tasks, ScriptedOrg(style), c):
            assert r.episode.budget_used <= 40
    assert all(r.episode.outcome == 1.0 for r in run_episodes(tasks, ScriptedOrg("solo"), c))


def test_same_seed_same_episodes():
    tasks = build_family("sum").generate(0, 3, 7)
    a = run_episodes(tasks, ScriptedOrg("verify", error_rate=0.2, seed=5), cfg(**BIG), RewardConfig())
    b = run_episodes(tasks, ScriptedOrg("verify", error_rate=0.2, seed=5), cfg(**BIG), RewardConfig())
    strip = lambda df: df.drop(columns=[c for c in df.columns if "seconds" in c])  # noqa: E731
    for x, y in zip(to_frames(a), to_frames(b), strict=True):
        pd.testing.assert_frame_equal(strip(x), strip(y))


def test_records_round_trip_through_parquet(tmp_path):
    tasks = build_family("signed_sum").generate(0, 2, 3)
    recs = run_episodes(tasks, ScriptedOrg("verify", error_rate=0.3), cfg(), RewardConfig(kind="mixed"))
    write_parquet(recs, tmp_path / "t.parquet", tmp_path / "e.parquet")
    back = read_parquet(tmp_path / "t.parquet", tmp_path / "e.parquet")
    assert back == recs
    turns, episodes = to_frames(recs)
    pd.testing.assert_frame_equal(turns, pd.read_parquet(tmp_path / "t.parquet"))
    pd.testing.assert_frame_equal(episodes, pd.read_parquet(tmp_path / "e.parquet"))
    assert len(to_frames([])[0].columns) == len(turns.columns)


# ------------------------------------------------------------ the task file and briefs naming its parts


def test_task_is_a_workspace_file_and_a_brief_naming_a_part_shows_its_lines():
    script = {(0, 1): "HIRE worker: task.txt:2-3\nHIRE worker: task.txt:4-9", (1, 2): "WAIT", (2, 2): "WAIT"}
    rec = run_episodes([TASK4], Replay(script), cfg(max_rounds=2, task_file="task.txt"))[0]
    ceo = rec.turns[0].prompt
    assert "| task.txt 4 lines, the task" in ceo
    hire1, hire2 = (t.prompt for t in rec.turns if t.round == 2 and t.agent in (1, 2))
    assert hire1.endswith("brief:\n| task.txt:2-3\npart task.txt:2-3:\n| +57\n| +42") or "part task.txt:2-3:\n| +57\n| +42" in hire1
    assert "part task.txt:4-9: none (task.txt has 4 lines)" in hire2  # a range past the end names nothing


def test_one_hire_line_hires_several_agents_on_consecutive_parts_of_a_file():
    script = {(0, 1): "HIRE 2 worker: task.txt\nHIRE 2 verifier: check the sum\nHIRE 3 worker: task.txt:2-4",
              (0, 2): "HIRE 3 worker: task.txt:1-2\nHIRE 2 worker: notes.txt"}
    rec = run_episodes([TASK4], Replay(script), cfg(max_rounds=2, max_agents=8, task_file="task.txt"))[0]
    org = {m["agent"]: (m["role"], m["brief"]) for m in rec.episode.org()}
    assert org == {0: ("ceo", ""), 1: ("worker", "task.txt:1-2"), 2: ("worker", "task.txt:3-4"),
                   3: ("verifier", "check the sum"), 4: ("verifier", "check the sum"),
                   5: ("worker", "task.txt:2"), 6: ("worker", "task.txt:3"), 7: ("worker", "task.txt:4")}
    first, second = (t for t in rec.turns if t.agent == 0)
    events = json.loads(first.events)
    assert events[0] == {"kind": "HIRE", "agent": 1, "role": "worker", "cut": False, "agents": [1, 2]}
    assert json.loads(first.actions)[0] == {"kind": "HIRE", "arg": "worker", "body": "task.txt", "count": 2}
    assert not first.malformed and "- hired agent1, agent2 (worker); they start next round" in second.prompt
    # refused whole, with the reason: more parts than lines, more hires than room; nothing half-hired
    errors = json.loads(second.errors)
    assert errors == ["HIRE refused: task.txt:1-2 has 2 lines, fewer than 3 parts",
                      "HIRE refused: org is full (8 agents)"]
    hire = next(t for t in rec.turns if t.agent == 2)
    assert "part task.txt:3-4:\n| +42\n| +37" in hire.prompt


def test_no_task_file_when_switched_off_and_runners_see_the_task_file_when_on():
    rec = run_episodes([TASK4], Replay({}, default="DONE"), cfg(task_file=""))[0]
    assert "lines, the task" not in rec.turns[0].prompt
    calls = []
    runner = lambda files, path: calls.append(dict(files)) or "ok"  # noqa: E731
    run_episodes([TASK4], Replay({(0, 1): "WRITE a.py\nprint(1)", (0, 2): "RUN a.py"}), cfg(max_rounds=2, task_file="task.txt"),
                 runner=runner)
    assert calls == [{"a.py": "print(1)", "task.txt": "68\n+57\n+42\n+37"}]


def test_scripted_briefs_name_parts_instead_of_retyping_terms():
    from rlcr.policy.bridge import token_length_fn
    from rlcr.policy.tokenizer import build_tokenizer

    L = token_length_fn(build_tokenizer("numbers"))  # the tiny default's token counts
    tasks = build_family("sum", {"digits": 1}).generate(3, 4, 31)  # 32 terms
    for style in ("delegate", "verify"):
        on = run_episodes(tasks, ScriptedOrg(style, len_fn=L), cfg(**BIG, task_file="task.txt"), len_fn=L)
        off = run_episodes(tasks, ScriptedOrg(style, len_fn=L), cfg(**BIG, task_file=""), len_fn=L)
        assert all(r.episode.outcome == 1.0 and r.episode.malformed_turns == 0 for r in on + off), style
        briefs = [m["brief"] for m in on[0].episode.org() if m["parent"] >= 0]
        assert briefs and all("task.txt:" in b for b in briefs), briefs
        assert not any("+" in b for b in briefs), briefs  # no term re-typed
        # naming parts makes delegation cheap: the company's critical path shrinks on long tasks
        cp = lambda rs: sum(r.episode.critical_path_tokens for r in rs)  # noqa: E731
        assert cp(on) < cp(off), (style, cp(on), cp(off))


def test_read_a_part_and_own_working_carry_a_single_agent_over_turns():
    from rlcr.policy.bridge import token_length_fn
    from rlcr.policy.tokenizer import build_tokenizer

    L = token_length_fn(build_tokenizer("numbers"))
    tasks = build_family("signed_sum", {"digits": 1}).generate(5, 6, 31)  # 32 terms: no 64-token turn holds the chain
    c = cfg(single_agent=True, max_rounds=12, token_budget=512, max_turn_tokens=64, max_obs_tokens=896,
            context_tokens=1024, task_file="task.txt", show_working=True)
    for r in run_episodes(tasks, ScriptedOrg("solo", len_fn=L), c, len_fn=L):
        assert r.episode.outcome == 1.0 and r.episode.malformed_turns == 0 and r.episode.rounds >= 4
        first, second = r.turns[0], r.turns[1]
        assert "\nREAD task.txt:" in first.completion
        assert "- your working: " in second.prompt and "- part task.txt:" in second.prompt
        assert second.completion.startswith(first.completion.split("\n")[0].rsplit("=", 1)[1] + ("+" if "+" in second.completion[:6] else "-"))


def test_working_is_shown_only_when_asked():
    script = {(0, 1): "6+5=11\nWAIT"}
    on = run_episodes([TASK4], Replay(script), cfg(max_rounds=2, show_working=True))[0]
    off = run_episodes([TASK4], Replay(script), cfg(max_rounds=2))[0]
    assert "- your working: 6+5=11" in on.turns[1].prompt and "your working" not in off.turns[1].prompt


def test_read_part_errors_are_observations():
    script = {(0, 1): "READ task.txt:3-9\nREAD task.txt:9-3\nREAD task.txt:2", (0, 2): "DONE"}
    rec = run_episodes([TASK4], Replay(script), cfg(max_rounds=2, task_file="task.txt"))[0]
    t1, t2 = rec.turns[0], rec.turns[1]
    assert t1.n_errors == 2 and t1.n_actions == 1  # past the end; backwards range
    assert "task.txt has 4 lines" in t2.prompt and "- part task.txt:2:\n| +57" in t2.prompt


def long_profile():
    """params.yaml's `long` profile and its tokenizer's length function."""
    import pathlib

    from rlcr.config import load_params
    from rlcr.policy.bridge import token_length_fn
    from rlcr.policy.tokenizer import build_tokenizer

    p = load_params(pathlib.Path(__file__).resolve().parents[1] / "params.yaml", profile="long")
    return p, token_length_fn(build_tokenizer(p.model.tokenizer))


def test_long_profile_holds_tasks_where_delegating_is_faster_and_short_ones_where_it_is_not():
    p, L = long_profile()
    assert (p.org.task_file, p.org.show_working) == ("task.txt", True)
    lengths = {d + 1 for f in p.prepare.eval for d in f.difficulties}
    assert {2, 4, 16} <= lengths and 16 in {d + 1 for f in p.prepare.train for d in f.difficulties}

    def time_of(style: str, terms: int) -> float:
        tasks = build_family("signed_sum", {"digits": 1}).generate(11, 4, terms - 1)
        org = dataclasses.replace(p.org, single_agent=style == "solo")
        recs = run_episodes(tasks, ScriptedOrg(style, len_fn=L), org, len_fn=L)
        assert all(r.episode.outcome == 1.0 for r in recs), style
        return sum(r.episode.critical_path_tokens for r in recs)

    assert time_of("delegate", 16) < 0.7 * time_of("solo", 16)
    assert time_of("verify", 16) < 0.9 * time_of("solo", 16)  # checkers hired with the workers, adding alongside
    assert time_of("delegate", 4) > time_of("solo", 4)
    tasks = build_family("sum", {"digits": 1}).generate(7, 1, 15)
    first = run_episodes(tasks, ScriptedOrg("delegate", len_fn=L), p.org, len_fn=L)[0].turns[0]
    assert first.completion == "HIRE 4 worker: task.txt"  # one line hires four workers on four parts


def test_a_verifier_hired_with_its_worker_adds_meanwhile_and_then_only_compares():
    p, L = long_profile()
    task = build_family("sum", {"digits": 1}).generate(7, 1, 15)[0]
    for err, verdict in ((0.0, "APPROVE"), (1.0, "REJECT")):  # a worker that errs on every addition is caught
        rec = run_episodes([task], ScriptedOrg("verify", error_rate=err, len_fn=L), p.org, len_fn=L)[0]
        ceo = [t.completion for t in rec.turns if t.agent == 0]
        assert ceo[0] == "HIRE 4 worker: task.txt\nHIRE 4 verifier: task.txt"
        checker = [t for t in rec.turns if t.role == "verifier" and t.agent == 5]
        first, second = checker[0], checker[1]
        assert first.round == 2 and first.completion.endswith("\nWAIT") and "=" in first.completion  # its own chain
        assert "- your working: " in second.prompt  # the result it carries over
        assert second.completion.startswith(f"POST @agent0 {verdict} ") and second.completion.count("=") == 1


def test_a_flat_split_gives_every_worker_two_terms_and_three_terms_are_not_split():
    from rlcr.org.protocol import split_lines
    from rlcr.org.scripted import flat_parts

    assert [flat_parts(n) for n in (2, 3, 4, 5, 9, 16, 32)] == [1, 1, 2, 2, 3, 4, 6]
    for n in range(4, 41):
        assert all(b - a >= 1 for a, b in split_lines(1, n, flat_parts(n))), n
    # every length of the task file protocol ends with the right answer when nobody errs (a one-term
    # part posts no equation, so its manager used to wait for a claim until the last round)
    c = cfg(max_agents=9, max_rounds=12, token_budget=768, task_file="task.txt", show_working=True)
    for terms in (2, 3, 4, 5, 16):
        tasks = build_family("signed_sum", {"digits": 1}).generate(3, 4, terms - 1)
        for style in ("delegate", "verify"):
            recs = run_episodes(tasks, ScriptedOrg(style), c)
            assert [r.episode.outcome for r in recs] == [1.0] * 4, (terms, style)


def test_min_hires_refuses_a_submit_before_the_company_has_hired():
    """org.min_hires: a lone CEO's SUBMIT is refused with the reason (a limit, not a protocol error), the
    episode goes on, and the same SUBMIT after a hire ends it."""
    script = {(0, 1): "SUBMIT 204", (0, 2): "HIRE worker: 68+57", (0, 3): "SUBMIT 204"}
    rec = run_episodes([TASK4], Replay(script), cfg(min_hires=1, max_rounds=4))[0]
    first = rec.turns[0]
    assert not first.malformed and json.loads(first.errors) == [
        "SUBMIT refused: the company must hire 1 first (0 hired)"]
    assert json.loads(first.events) == [{"kind": "SUBMIT", "refused": json.loads(first.errors)[0]}]
    assert "SUBMIT refused" in rec.turns[1].prompt  # the CEO sees why next round
    assert rec.episode.end_reason == "submit" and rec.episode.rounds == 3 and rec.episode.outcome == 1.0
    assert run_episodes([TASK4], Replay({(0, 1): "SUBMIT 204"}), cfg())[0].episode.rounds == 1  # 0: no rule


def test_min_hires_is_checked_against_the_org_and_spares_a_single_agent():
    with pytest.raises(ConfigError, match="org.min_hires.*max_agents - 1 = 2"):
        cfg(min_hires=3, max_agents=3)
    alone = run_episodes([TASK4], Replay({(0, 1): "SUBMIT 204"}), cfg(min_hires=1, single_agent=True))[0]
    assert alone.episode.rounds == 1 and alone.episode.outcome == 1.0  # a single agent cannot hire: exempt
    with pytest.raises(ConfigError, match="org.min_hires"):
        cfg(min_hires=-1)
