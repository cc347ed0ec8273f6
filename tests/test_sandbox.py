"""The sandbox under hostile code, one property per test."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import sandbox_processes

from rlcr.config import OrgConfig, RewardConfig
from rlcr.org import run_episodes
from rlcr.org.scripted import Replay
from rlcr.sandbox import SandboxLimits, SandboxUnavailable, run_python, safe_relpath
from rlcr.tasks import build_family, verify
from rlcr.tasks.base import Task

FORK_BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"


def test_plain_code_runs_and_prints():
    r = run_python("print(sum(range(10)))")
    assert r.ok and r.stdout.strip() == "45"


def test_infinite_loop_is_killed_at_the_timeout():
    r = run_python("while True:\n    pass\n", limits=SandboxLimits(timeout_s=1.5))
    assert r.timed_out and not r.ok and 1.5 <= r.seconds < 10
    assert sandbox_processes() == []


def test_fork_bomb_then_a_normal_run_at_once_succeeds():
    r = run_python(FORK_BOMB, limits=SandboxLimits(timeout_s=1, max_processes=16))
    assert r.timed_out and sandbox_processes() == []
    assert run_python("print('next')").stdout == "next\n"
    assert sandbox_processes() == []


SIGTERM_IGNORING_CHILD = (
    "import os, signal, time\n"
    "if os.fork() == 0:\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "    time.sleep(60)\n"
)
SETSID_DAEMON = (  # double fork: the daemon's parent exits, it is nobody's child in its own session
    "import os, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        time.sleep(60)\n"
    "    os._exit(0)\n"
    "os.wait()\n"
)


@pytest.mark.parametrize("code", [SIGTERM_IGNORING_CHILD, SETSID_DAEMON], ids=["sigterm-ignoring-child", "setsid-daemon"])
def test_a_process_left_behind_by_a_program_that_exits_is_gone_when_the_call_returns(code):
    r = run_python(code + "print('parent exits')\n", limits=SandboxLimits(timeout_s=5))
    left = sandbox_processes()
    assert r.ok and r.stdout == "parent exits\n" and r.seconds < 5 and left == []


def test_a_daemon_of_a_timed_out_program_leaves_no_process():
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nwhile True:\n    pass\n"
    r = run_python(code, limits=SandboxLimits(timeout_s=1))
    assert r.timed_out and sandbox_processes() == []


def test_process_limits_are_per_run_across_64_concurrent_runs():
    # each run holds 12 processes at once under a limit of 16, beside fork bombs: a limit shared
    # by all runs would refuse nearly all of them
    holds = (
        "import os, time\n"
        "kids = []\n"
        "for _ in range(11):\n"
        "    kids.append(os.fork())\n"
        "    if kids[-1] == 0:\n"
        "        time.sleep(0.5)\n"
        "        os._exit(0)\n"
        "for k in kids:\n"
        "    os.waitpid(k, 0)\n"
        "print('held 12')\n"
    )

    def one(i: int):
        code = FORK_BOMB if i % 16 == 0 else holds
        return run_python(code, limits=SandboxLimits(timeout_s=1 if i % 16 == 0 else 30, max_processes=16))

    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(one, range(64)))
    assert all(r.stdout == "held 12\n" for i, r in enumerate(results) if i % 16)
    assert sandbox_processes() == []


def test_program_output_cannot_pass_for_a_broken_sandbox():
    r = run_python("import sys\nsys.stderr.write('bwrap: Creating new namespace failed')\nsys.exit(1)\n")
    assert r.returncode == 1 and "bwrap:" in r.stderr


def test_a_sandbox_that_cannot_start_raises_with_bwraps_message(monkeypatch):
    with tempfile.TemporaryDirectory() as bin_dir:  # under /tmp: the sandbox uid must reach it
        os.chmod(bin_dir, 0o755)
        fake = Path(bin_dir) / "bwrap"  # a bwrap whose namespaces are refused, as on a locked-down host
        fake.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Operation not permitted' >&2\nexit 1\n")
        fake.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        with pytest.raises(SandboxUnavailable, match="could not start the sandbox: bwrap: Creating new namespace"):
            run_python("print('never')")


def test_memory_bomb_fails_inside_and_caller_lives():
    r = run_python("x = bytearray(4 * 1024**3)\nprint('allocated')", limits=SandboxLimits(memory_mb=256))
    assert not r.ok and "MemoryError" in r.stderr and "allocated" not in r.stdout


def test_gigabyte_of_stdout_is_cut_at_the_limit():
    code = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n"
    r = run_python(code, limits=SandboxLimits(timeout_s=20, max_output=4096, max_file_bytes=1 << 20))
    assert r.truncated and len(r.stdout) == 4096 and not r.ok


def test_network_fails_loopback_and_external():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        code = (
            "import socket\n"
            f"for host, port in [('127.0.0.1', {port}), ('8.8.8.8', 53)]:\n"
            "    s = socket.socket(); s.settimeout(2)\n"
            "    print(host, s.connect_ex((host, port)))\n"
        )
        r = run_python(code)
    finally:
        server.close()
    lines = dict(line.split() for line in r.stdout.strip().splitlines())
    assert lines["127.0.0.1"] != "0" and lines["8.8.8.8"] != "0"


def test_secrets_in_parent_environment_are_not_visible(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://user:secret-token@tracking.example")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    r = run_python("import os\nprint(sorted(os.environ))\nprint(open('/proc/self/environ').read())")
    assert "secret" not in r.stdout and "MLFLOW" not in r.stdout and "HF_TOKEN" not in r.stdout


def test_project_tree_is_not_mounted():
    here = os.path.dirname(os.path.abspath(__file__))
    r = run_python(f"import os\nprint(os.path.exists({here!r}), os.path.exists('/root'))")
    assert r.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("name", ["../x.py", "/etc/x.py", "a/../../x.py", "a\x00b.py", ""])
def test_file_names_that_escape_are_refused(name):
    with pytest.raises(ValueError, match="refused"):
        safe_relpath(name)


# --------------------------------------------------------------- code-task rewards (26, 27)

HE = build_family("humaneval").generate(0, 164, 1)
ADD = next(t for t in HE if t.meta["task_id"] == "HumanEval/53")  # add(x, y)


def test_canonical_solution_passes_and_wrong_one_fails():
    assert verify(ADD, ADD.answer) == 1.0
    assert verify(ADD, "    return x - y\n") == 0.0


def test_sys_exit_zero_before_the_tests_is_a_failure():
    assert verify(ADD, "    return 0\nimport sys\nsys.exit(0)\n") == 0.0
    assert verify(ADD, "    return 0\nimport os\nos._exit(0)\n") == 0.0


def test_eq_override_is_a_failure():
    hack = (
        "    class Always:\n"
        "        def __eq__(self, other):\n"
        "            return True\n"
        "    return Always()\n"
    )
    assert verify(ADD, hack) == 0.0


def test_int_subclass_with_eq_override_is_a_failure():
    hack = "    class I(int):\n        def __eq__(self, o):\n            return True\n    return I(0)\n"
    assert verify(ADD, hack) == 0.0


def test_written_conftest_and_sitecustomize_are_never_on_the_path():
    # files an agent writes live in its workspace; verification runs the pristine program elsewhere,
    # and even inside one sandbox -S -E -s keeps sitecustomize from running
    r = run_python("print('ran')", files={"sitecustomize.py": "print('HOOK')", "conftest.py": "print('HOOK')"})
    assert r.stdout.strip() == "ran"


def test_tests_that_contradict_the_spec_give_zero():
    canary = Task(
        id="canary", family="humaneval", kind="code", difficulty=1,
        prompt="def add(x: int, y: int):\n    \"\"\"Add two numbers.\"\"\"\n",
        answer="    return x + y\n",
        meta={"entry_point": "add", "test": "def check(candidate):\n    assert candidate(2, 2) == 5\n"},
    )
    assert verify(canary, canary.answer) == 0.0


def test_grading_64_humaneval_answers_in_a_row_never_crashes():
    # the default rollout.batch_episodes grades 64 code answers back to back
    assert [verify(t, t.answer) for t in HE[:64]] == [1.0] * 64
    assert sandbox_processes() == []


def test_an_answer_looping_forever_is_killed_and_its_episode_earns_reward_0():
    task = replace(ADD, meta={**ADD.meta, "timeout_s": 1.0})
    pol = Replay({(0, 1): "SUBMIT while True: pass"})
    t0 = time.perf_counter()
    rec = run_episodes([task], pol, OrgConfig(single_agent=True, max_rounds=2), RewardConfig())[0]
    assert time.perf_counter() - t0 >= 1.0  # graded for the whole timeout: killed, not a quick failure
    assert rec.episode.answer == "while True: pass" and rec.episode.outcome == 0.0
    assert rec.episode.reward == 0.0 and sandbox_processes() == []
