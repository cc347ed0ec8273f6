"""The RUN action for real: workspace files run in the bubblewrap sandbox, one property per test."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from helpers import sandbox_processes

from rlcr.config import OrgConfig
from rlcr.org import run_episodes
from rlcr.org.episode import Generation, Request
from rlcr.org.runner import SandboxRunner, describe, tail
from rlcr.org.scripted import Replay, read_view
from rlcr.sandbox import SandboxResult, SandboxUnavailable
from rlcr.tasks import build_family

TASK4 = build_family("sum").generate(0, 1, 3)[0]  # 68+57+42+37 = 204
CFG = OrgConfig(single_agent=True, max_rounds=6)
_STDOUT = re.compile(r"^\| stdout \(\d+ chars[^)]*\):\n\| (.*)$", re.MULTILINE)


@dataclass
class Coder:
    """A scripted agent that solves a task by code, reading only its observation: WRITE solve.py
    (by default a program printing the task's expression), RUN it, SUBMIT the last line it printed
    (or 0 if there was none)."""

    program: str | None = None

    def generate_batch(self, requests: Sequence[Request]) -> list[Generation]:
        return [Generation(self.act(r.prompt)) for r in requests]

    def act(self, obs: str) -> str:
        if "output of RUN solve.py" in obs:
            m = _STDOUT.search(obs)
            return f"SUBMIT {m.group(1).strip() if m else 0}"
        if "| solve.py " in obs:  # listed in the workspace: written last round
            return "RUN solve.py"
        return "WRITE solve.py\n" + (self.program or f"print({read_view(obs).text})")


def test_agent_writes_a_program_runs_it_and_submits_its_output():
    rec = run_episodes([TASK4], Coder(), CFG, runner=SandboxRunner(timeout_s=5))[0]
    assert rec.episode.outcome == 1.0 and rec.episode.answer == "204"
    assert [json.loads(t.actions)[0]["kind"] for t in rec.turns] == ["WRITE", "RUN", "SUBMIT"]
    seen = rec.turns[2].prompt  # the output shows up in the observation after the RUN
    assert "RUN solve.py: exit code 0" in seen and "| 204" in seen


def test_infinite_loop_is_reported_as_timed_out_and_the_episode_goes_on():
    pol = Coder(program="while True:\n    pass\n")
    rec = run_episodes([TASK4], pol, CFG, runner=SandboxRunner(timeout_s=1))[0]
    run_turn, next_turn = rec.turns[1], rec.turns[2]
    assert "refused" not in json.loads(run_turn.events)[0] and run_turn.env_seconds >= 1
    assert "RUN solve.py: timed out after 1 s (killed)" in next_turn.prompt
    assert rec.episode.end_reason == "submit" and rec.episode.answer == "0" and rec.episode.outcome == 0.0


def test_other_workspace_files_sit_alongside_the_entry():
    files = {"lib/helper.py": "def half(x):\n    return x // 2\n",
             "lib/main.py": "import helper\nprint(helper.half(408))\n", "data.txt": "ignored"}
    out = SandboxRunner()(files, "lib/main.py")
    assert out.splitlines()[0].startswith("RUN lib/main.py: exit code 0")
    assert out.splitlines()[-2:] == ["204", "stderr: (empty)"]


def test_a_crash_shows_the_end_of_the_traceback():
    out = SandboxRunner()({"bad.py": "print('before')\n1/0\n"}, "bad.py")
    assert "exit code 1" in out and "before" in out
    assert out.rstrip().endswith("ZeroDivisionError: division by zero")


def test_long_output_is_cut_to_its_tail_and_the_cut_is_said():
    out = SandboxRunner(max_chars=300)({"loud.py": "for i in range(5000):\n    print(i)\n"}, "loud.py")
    assert out.split("\n")[-2] == "4999" and "\n0\n" not in out
    assert "first " in out and len(out) < 300 + 200


def test_the_program_cannot_change_the_workspace():
    evil = "open('x.txt', 'w').write('planted')\nopen('w.py', 'w').write('print(666)')\nprint('ok')\n"
    pol = Replay({(0, 1): "WRITE w.py\n" + evil, (0, 2): "RUN w.py", (0, 3): "RUN w.py", (0, 4): "SUBMIT 1"})
    rec = run_episodes([TASK4], pol, CFG, runner=SandboxRunner())[0]
    last = rec.turns[3].prompt
    assert "| ok" in last and "666" not in last
    assert "x.txt" not in last and "| w.py " in last


def test_running_a_missing_file_is_an_error_for_the_agent_not_a_crash():
    pol = Replay({(0, 1): "RUN nothing.py", (0, 2): "SUBMIT 204"})
    rec = run_episodes([TASK4], pol, CFG, runner=SandboxRunner())[0]
    assert "no file nothing.py" in rec.turns[0].errors and "no file nothing.py" in rec.turns[1].prompt
    assert rec.episode.outcome == 1.0


def test_without_a_runner_run_is_not_offered():
    rec = run_episodes([TASK4], Coder(), CFG)[0]
    assert "RUN" not in rec.turns[0].prompt.split("actions: ")[1].split("\n")[0]
    assert "code execution not available" in rec.turns[1].errors


def test_a_missing_sandbox_stops_the_rollout(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap to be found: the environment is broken
    with pytest.raises(SandboxUnavailable):
        run_episodes([TASK4], Coder(), CFG, runner=SandboxRunner())


def test_describe_and_tail_are_plain_text_rules():
    assert tail("abcdef", 4) == ("cdef", 2) and tail("ab", 4) == ("ab", 0) and tail("ab", 0) == ("", 2)
    r = SandboxResult(returncode=0, stdout="x" * 10, stderr="y" * 1000, timed_out=False, truncated=False, seconds=0.5)
    out = describe("a.py", r, 100)
    # stdout uses 10 of its 50; stderr gets the other 90
    assert "x" * 10 in out and "y" * 90 in out and "y" * 91 not in out and "first 910 cut" in out
    with pytest.raises(ValueError, match="positive"):
        SandboxRunner(timeout_s=0)


@dataclass
class PerEpisode:
    """Replay policies by episode id: episodes of one rollout that act differently."""

    scripts: dict[str, Replay]

    def generate_batch(self, requests: Sequence[Request]) -> list[Generation]:
        return [self.scripts[r.episode_id].generate_batch([r])[0] for r in requests]


def test_200_runs_in_one_round_of_64_episodes_all_run():
    # each run forks a child that outlives it: every process of every run must be gone before the next
    program = "import os, time\nif os.fork() == 0:\n    time.sleep(30)\nprint(len(open('main.py').read()))\n"
    runs = [4 if i < 8 else 3 for i in range(64)]  # 8 * 4 + 56 * 3 = 200, all in round 2
    ids = [f"e{i}" for i in range(64)]
    pol = PerEpisode({e: Replay({(0, 1): "WRITE main.py\n" + program, (0, 2): "\n".join(["RUN main.py"] * n),
                                 (0, 3): "SUBMIT 204"}) for e, n in zip(ids, runs, strict=True)})
    recs = run_episodes([TASK4] * 64, pol, CFG, runner=SandboxRunner(timeout_s=5), episode_ids=ids)
    events = [ev for r in recs for ev in json.loads(r.turns[1].events)]
    assert len(events) == 200 and all(ev["kind"] == "RUN" and "refused" not in ev for ev in events)
    shown = [r.turns[2].prompt for r in recs]
    assert sum(p.count("RUN main.py: exit code 0") for p in shown) == 200
    assert all(r.episode.outcome == 1.0 for r in recs) and sandbox_processes() == []
