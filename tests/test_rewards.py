"""Collective, individual and mixed rewards on fixed episodes with hand-worked values."""

from __future__ import annotations

import json

import pytest

from rlcr.config import OrgConfig, RewardConfig
from rlcr.org import run_episodes
from rlcr.org.scripted import Replay, ScriptedOrg
from rlcr.rewards import (
    agent_rewards,
    collective_reward,
    delivered_value,
    individual_rewards,
    malformed_shares,
    occurs,
)
from rlcr.tasks import build_family

TASK = build_family("sum").generate(0, 1, 3)[0]  # 68+57+42+37 = 204; sub-problems 68+57, 42+37, 125+79
HIRE = "HIRE worker: add 68+57\nHIRE worker: add 42+37\nHIRE verifier: check the sums"


def episode(worker2: str, submit: str):
    script = {(0, 1): HIRE, (1, 2): "POST @agent0 68+57=125\nDONE", (2, 2): worker2 + "\nDONE",
              (3, 3): "POST @agent0 APPROVE all of it, 204 is right\nDONE", (0, 4): submit}
    return run_episodes([TASK], Replay(script), OrgConfig())[0]


def test_delivered_value():
    assert delivered_value("@agent0 68+57=125") == "125"
    assert delivered_value("125 @agent2") == "125"
    assert delivered_value("68+57=125;125+42=167") == "167"
    assert delivered_value("the sum is -12.5 I think") == "-12.5"
    assert delivered_value("no numbers") is None


def test_occurs_is_whole_expression():
    assert occurs("68+57", "please add 68 + 57 now")
    assert occurs("68+57", "68+57+42+37")
    assert not occurs("68+57", "168+57")
    assert not occurs("68+57", "68+570")
    assert not occurs("12-5", "-12-5")
    assert occurs("-12-5", "68+57-12-5")


def test_collective_pays_everyone_the_verified_outcome():
    good = episode("POST @agent0 42+37=79", "SUBMIT 204")
    bad = episode("POST @agent0 42+37=80", "SUBMIT 205")
    assert agent_rewards(good, RewardConfig(), 4096) == {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}
    assert agent_rewards(bad, RewardConfig(), 4096) == {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}


def test_individual_pays_only_own_verified_deliveries():
    good = episode("POST @agent0 42+37=79", "SUBMIT 204")
    bad = episode("POST @agent0 42+37=80", "SUBMIT 205")
    # submitter: the outcome; workers: their own sub-problem; the verifier's brief has no sub-problem
    assert individual_rewards(good) == {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.0}
    assert individual_rewards(bad) == {0: 0.0, 1: 1.0, 2: 0.0, 3: 0.0}


def test_mixed_is_the_alpha_blend():
    bad = episode("POST @agent0 42+37=80", "SUBMIT 205")
    assert agent_rewards(bad, RewardConfig(kind="mixed", alpha=0.25), 4096) == {0: 0.0, 1: 0.75, 2: 0.0, 3: 0.0}
    good = episode("POST @agent0 42+37=79", "SUBMIT 204")
    assert agent_rewards(good, RewardConfig(kind="mixed", alpha=0.25), 4096) == {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.25}


def test_only_the_final_delivery_counts():
    spray = episode("POST @agent0 42+37=79\nPOST @agent0 or maybe 80", "SUBMIT 204")
    assert individual_rewards(spray)[2] == 0.0


def test_token_cost():
    good = episode("POST @agent0 42+37=79", "SUBMIT 204")
    total = good.episode.total_tokens
    assert collective_reward(good, token_cost=0.5, budget=1000) == pytest.approx(1.0 - 0.5 * total / 1000)
    own = sum(t.completion_tokens for t in good.turns if t.agent == 1)
    assert individual_rewards(good, 0.5, 1000)[1] == pytest.approx(1.0 - 0.5 * own / 1000)


def test_malformed_cost_takes_the_share_of_each_agents_own_malformed_turns():
    script = {(0, 1): HIRE, (1, 2): "POST @agent0 68+57=125\nDONE", (2, 2): "the sum is 79",  # no action
              (2, 3): "POST @agent0 42+37=79\nDONE", (3, 3): "SUBMIT 204\nDONE", (0, 4): "SUBMIT 204"}
    rec = run_episodes([TASK], Replay(script), OrgConfig())[0]  # the verifier may not SUBMIT
    assert [(t.agent, t.round) for t in rec.turns if t.malformed] == [(2, 2), (3, 3)]
    assert malformed_shares(rec) == {0: 0.0, 1: 0.0, 2: 0.5, 3: 0.5}  # the verifier WAITed in round 2
    assert agent_rewards(rec, RewardConfig(), 4096) == {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}
    assert agent_rewards(rec, RewardConfig(malformed_cost=0.4), 4096) == {0: 1.0, 1: 1.0, 2: 0.8, 3: 0.8}
    assert agent_rewards(rec, RewardConfig(kind="individual", malformed_cost=0.4), 4096) == {
        0: 1.0, 1: 1.0, 2: 0.8, 3: -0.2}
    with pytest.raises(ValueError, match="reward.malformed_cost"):
        RewardConfig(malformed_cost=-0.1)


def test_rewards_are_written_into_the_record():
    recs = run_episodes([TASK], ScriptedOrg("verify"), OrgConfig(), RewardConfig(kind="individual"))
    r = recs[0]
    per_agent = {int(k): v for k, v in json.loads(r.episode.agent_rewards).items()}
    assert all(t.reward == per_agent[t.agent] for t in r.turns)
    assert r.episode.reward == pytest.approx(sum(per_agent.values()) / len(per_agent))
    roles = {m["agent"]: m["role"] for m in r.episode.org()}
    # scripted verify org on 4 terms: CEO submits, 2 workers on sub-problems, 2 verifiers with no sub-problem
    assert sorted((roles[i], v) for i, v in per_agent.items()) == [
        ("ceo", 1.0), ("verifier", 0.0), ("verifier", 0.0), ("worker", 1.0), ("worker", 1.0)]


def test_scripted_lead_gets_no_individual_credit_for_a_non_subproblem():
    task = build_family("sum").generate(0, 1, 7)[0]  # 8 terms: leads get 4-term briefs
    r = run_episodes([task], ScriptedOrg("delegate"), OrgConfig(max_agents=32), RewardConfig(kind="individual"))[0]
    rewards = {int(k): v for k, v in json.loads(r.episode.agent_rewards).items()}
    roles = {m["agent"]: m["role"] for m in r.episode.org()}
    assert {rewards[i] for i in rewards if roles[i] == "lead"} == {0.0}
    assert {rewards[i] for i in rewards if roles[i] == "worker"} == {1.0}
    assert r.episode.reward != 1.0  # differs from the collective reward of the same episode
