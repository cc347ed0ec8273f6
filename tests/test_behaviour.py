"""Behaviour metrics against hand-counted values on fixed episodes."""

from __future__ import annotations

import pytest

from rlcr.behaviour import (
    aggregate,
    behaviour_metrics,
    claim_is_right,
    combine_is_right,
    episode_metrics,
    split_is_right,
    verdict,
)
from rlcr.config import OrgConfig
from rlcr.org import run_episodes
from rlcr.org.scripted import Replay, ScriptedOrg
from rlcr.tasks import build_family

TASK = build_family("sum").generate(0, 1, 3)[0]  # 68+57+42+37 = 204

# CEO hires 3 workers and a verifier; worker 2 errs (80), the verifier reviews worker 1's file and
# approves both results (one wrongly); worker 4 ("help out") only waits and once writes garbage.
SCRIPT = {
    (0, 1): "HIRE worker: add 68+57\nHIRE worker: add 42+37\nHIRE verifier: check the sums\nHIRE worker: help out",
    (1, 2): "WRITE s1.txt\n68+57=125",
    (2, 2): "POST @agent0 42+37=80",
    (3, 3): "READ s1.txt", (1, 3): "DONE", (2, 3): "DONE", (4, 3): "FOO bar",
    (3, 4): "POST @agent1 s1.txt is correct: 68+57=125\nPOST @agent0 APPROVE 42+37=80",
    (0, 5): "125+80=205\nSUBMIT 205", (3, 5): "DONE",
}
# a worker who never was asked to check, but approves anyway (verifier by behaviour only)
SCRIPT2 = {(0, 1): "HIRE worker: look around", (1, 2): "POST @agent0 LGTM\nDONE", (0, 3): "SUBMIT 204"}


@pytest.fixture(scope="module")
def fixed():
    return run_episodes([TASK], Replay(SCRIPT), OrgConfig())[0]


@pytest.fixture(scope="module")
def fixed2():
    return run_episodes([TASK], Replay(SCRIPT2), OrgConfig())[0]


def test_org_shape(fixed):
    m = episode_metrics(fixed)
    assert (m["org/size"], m["org/depth"], m["org/hires"]) == (5, 1, 4)
    assert (m["org/hires_worker"], m["org/hires_verifier"], m["org/hires_tester"], m["org/hires_lead"]) == (3, 1, 0, 0)


def test_verifier_detection(fixed, fixed2):
    m = episode_metrics(fixed)
    assert (m["org/verifiers_by_role"], m["org/verifiers_by_brief"], m["org/verifiers_by_behaviour"],
            m["org/verifiers_detected"]) == (1, 1, 1, 1)
    m2 = episode_metrics(fixed2)
    assert (m2["org/verifiers_by_role"], m2["org/verifiers_by_brief"], m2["org/verifiers_by_behaviour"]) == (0, 0, 1)


def test_false_approvals(fixed, fixed2):
    m = episode_metrics(fixed)
    # "68+57=125" approved (right), "42+37=80" approved (wrong)
    assert (m["behaviour/approvals"], m["behaviour/approvals_checked"], m["behaviour/false_approvals"]) == (2, 2, 1)
    assert m["behaviour/false_approval_rate"] == 0.5
    m2 = episode_metrics(fixed2)  # "LGTM" with no claim: an approval, not judged
    assert (m2["behaviour/approvals"], m2["behaviour/approvals_checked"]) == (1, 0)


def test_peer_review_and_collective_thinking(fixed):
    m = episode_metrics(fixed)
    assert m["behaviour/peer_reviews"] == 1  # agent3 READ agent1's s1.txt, then posted about it
    # completions' tokens (ceil(chars/4)): round 1: 25; 2: 1+6+6+1+1; 3: 1+1+1+3+2; 4: 1+18+1; 5: 6+1+1
    assert m["time/total_tokens"] == 76
    assert m["time/critical_path_tokens"] == 25 + 6 + 3 + 18 + 6
    # posts mentioning others: "POST @agent0 42+37=80" 6, "POST @agent1 s1.txt ..." 11, "POST @agent0 APPROVE ..." 8
    assert m["behaviour/collective_thinking"] == pytest.approx(25 / 76)
    assert m["behaviour/messages_per_agent"] == pytest.approx(3 / 5)


def test_free_riding_and_malformed(fixed):
    m = episode_metrics(fixed)
    assert (m["behaviour/idle_agents"], m["behaviour/idle_share"]) == (1, 0.25)
    assert (m["behaviour/malformed_turns"], m["behaviour/turns"]) == (1, 17)
    assert m["rollout/outcome"] == 0.0 and m["rollout/rounds"] == 5


def test_aggregate_pools_rates(fixed, fixed2):
    agg = aggregate([episode_metrics(fixed), episode_metrics(fixed2)])
    assert agg["episodes"] == 2
    assert agg["behaviour/false_approval_rate"] == 0.5  # 1 false of 2 checked, pooled
    n2 = len(fixed2.turns)
    assert agg["behaviour/malformed_rate"] == pytest.approx(1 / (17 + n2))
    assert agg["org/size"] == (5 + 2) / 2
    assert behaviour_metrics([fixed, fixed2]) == agg
    assert aggregate([]) == {"episodes": 0.0}


def test_verdict_words():
    assert verdict("APPROVE 1+1=2") == "approve"
    assert verdict("this is not correct") == "reject"
    assert verdict("incorrect: 1+1=3") == "reject"
    assert verdict("here is 1+1=2") is None
    assert claim_is_right("@agent5 ok 125+79=204", TASK) is True
    assert claim_is_right("1+2+3=7", TASK) is False
    assert claim_is_right("looks fine", TASK) is None


def test_scripted_rubber_stamp_verifiers_show_up_as_false_approvals():
    tasks = build_family("sum").generate(4, 30, 3)
    careful = behaviour_metrics(run_episodes(tasks, ScriptedOrg("verify", error_rate=0.2, seed=2), OrgConfig(max_rounds=40)))
    lazy = behaviour_metrics(run_episodes(tasks, ScriptedOrg("verify", error_rate=0.2, rubber_stamp=1.0, seed=2),
                                          OrgConfig(max_rounds=40)))
    assert careful["behaviour/false_approvals"] == 0
    assert lazy["behaviour/false_approval_rate"] > 0.1
    assert lazy["rollout/outcome"] < careful["rollout/outcome"]


def test_a_rate_with_no_events_is_left_out_and_its_counts_say_why(fixed):
    solo = [m for m in (episode_metrics(fixed),) if m]  # an org that hired and checked
    agg = aggregate(solo)
    assert agg["behaviour/approvals_checked_total"] == solo[0]["behaviour/approvals_checked"]
    empty = {**solo[0], "behaviour/approvals_checked": 0.0, "behaviour/false_approvals": 0.0, "org/hires": 0.0,
             "behaviour/idle_agents": 0.0}
    agg = aggregate([empty])
    assert "behaviour/false_approval_rate" not in agg and "behaviour/idle_share" not in agg  # n/a, never 0.0
    assert agg["behaviour/approvals_checked_total"] == 0 and agg["org/hires_total"] == 0


def test_each_roles_sub_skill_counts_its_well_formed_true_turns(fixed):
    m = episode_metrics(fixed)
    # workers 1, 2, 4 join in round 2 (the Replay's default turn is WAIT): 1 writes 68+57=125 then
    # DONE, 2 posts the false 42+37=80 then DONE, 4 waits, writes FOO bar (malformed), waits twice
    assert (m["skill/worker/turns"], m["skill/worker/correct_turns"]) == (8, 6)
    # the verifier waits, READs, APPROVEs the false 42+37=80, then DONE
    assert (m["skill/verifier/turns"], m["skill/verifier/correct_turns"]) == (4, 3)
    assert (m["skill/ceo/turns"], m["skill/ceo/correct_turns"]) == (5, 5)  # 125+80=205 holds (its input was wrong)
    agg = aggregate([m])
    assert agg["skill/verifier/turn_correct"] == pytest.approx(3 / 4)
    assert "skill/lead/turn_correct" not in agg  # no lead: no rate, never 0


def test_a_managers_combine_is_judged_against_its_hires_results():
    obs = ("agent0 | role ceo | you lead the company | depth 0\norg (3 agents, nearest first):\n| agent0 ceo\n| agent1 worker <- agent0: 9+3\n"
           "| agent2 worker <- agent0: 7-4\nround 3 of 12 | tokens left 466\ntask:\n| 9+3+7-4+5\n"
           "for you (last 2 of 2):\n[#1 agent1 worker] @agent0 9+3=12\n[#2 agent2 worker] @agent0 7-4=3")
    assert combine_is_right(obs, "12+3=15;15+5=20\nSUBMIT 20")  # the hires' results + the term no hire got
    assert not combine_is_right(obs, "10+3=13\nSUBMIT 13")  # holds as arithmetic, but 10 is no hire's result
    assert combine_is_right(obs, "WAIT") is None and combine_is_right(obs.split("for you")[0], "SUBMIT 20") is None
    tasks = build_family("sum").generate(4, 20, 3)
    for style in ("delegate", "verify"):
        m = behaviour_metrics(run_episodes(tasks, ScriptedOrg(style, seed=2), OrgConfig(max_rounds=40)))
        assert m["skill/ceo/combines_total"] == 20 and m["skill/ceo/combine_correct"] == 1.0, style


def test_a_combine_of_hires_on_task_file_parts_is_judged_by_the_lines_they_got():
    # `task.txt:1-2` names lines, not the terms 1 and -2: the hires got the first four terms, the CEO kept 5
    obs = ("agent0 | role ceo | you lead the company | depth 0\norg (3 agents, nearest first):\n| agent0 ceo\n"
           "| agent1 worker <- agent0: task.txt:1-2\n| agent2 worker <- agent0: task.txt:3-4\nfiles:\n"
           "| task.txt 5 lines, the task\nround 3 of 12 | tokens left 466\ntask:\n| 9+3+7-4+5\n"
           "for you (last 2 of 2):\n[#1 agent1 worker] @agent0 9+3=12\n[#2 agent2 worker] @agent0 7-4=3")
    assert combine_is_right(obs, "12+3=15;15+5=20\nSUBMIT 20")
    assert not combine_is_right(obs, "12+3=15\nSUBMIT 15")
    tasks = build_family("signed_sum", {"digits": 1}).generate(4, 10, 15)  # 16 terms: HIRE 4 worker: task.txt
    c = OrgConfig(max_rounds=12, max_agents=9, token_budget=768, task_file="task.txt", show_working=True)
    for style in ("delegate", "verify"):
        m = behaviour_metrics(run_episodes(tasks, ScriptedOrg(style, seed=2), c))
        assert m["skill/ceo/combines_total"] == 10 and m["skill/ceo/combine_correct"] == 1.0, style


def test_a_managers_split_is_judged_against_its_own_task():
    obs = ("agent0 | role ceo | you lead the company | depth 0\norg (1 agents, nearest first):\n| agent0 ceo\n"
           "round 1 of 12 | tokens left 500\ntask:\n| 3-6-4-1-1+0")
    assert split_is_right(obs, "HIRE lead: 3-6-4-1\nHIRE worker: -1+0")
    assert split_is_right(obs, "HIRE worker: -1+0\nHIRE lead: 3-6-4-1")  # any order
    assert split_is_right(obs, "HIRE worker: 3-6\nHIRE worker: -4-1")  # the CEO keeps the rest
    # the policy's copy errors (a 6-term held-out task, greedy): a term twice, a term dropped, a sign lost
    assert not split_is_right(obs, "HIRE lead: 3-6-4-1\nHIRE worker: -1-1")  # -1-1 is a run, but it reuses a term
    assert not split_is_right(obs, "HIRE lead: 3-6-4-1-0\nHIRE worker: -1+0")  # 3-6-4-1-0 is no run
    assert not split_is_right(obs, "HIRE worker: 6-4")  # -6-4 with its sign lost
    assert split_is_right(obs, "WAIT") is None and split_is_right(obs, "HIRE verifier: check the sums") is None
    assert split_is_right(obs, "HIRE 2 worker: task.txt:1-3") is None  # a task-file part copies nothing
    # every scripted split is right: a lead (4 terms) and a worker (2) for 6 terms, the lead's own split
    six = build_family("signed_sum", {"digits": 1}).generate(5, 12, 5)
    for style in ("delegate", "verify"):
        m = behaviour_metrics(run_episodes(six, ScriptedOrg(style, seed=2), OrgConfig(max_rounds=40)))
        assert m["skill/ceo/splits_total"] == 12 and m["skill/ceo/split_correct"] == 1.0, style
        assert m["skill/lead/splits_total"] == 12 and m["skill/lead/split_correct"] == 1.0, style
    m = behaviour_metrics(run_episodes(build_family("sum").generate(4, 5, 1), ScriptedOrg("solo"), OrgConfig()))
    assert m["skill/ceo/splits_total"] == 0 and "skill/ceo/split_correct" not in m  # no split: no rate
