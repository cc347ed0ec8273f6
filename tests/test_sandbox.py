"""The sandbox under hostile code, one property per test (RELIABILITY.md 16-21, 26-27)."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from rlcr.org.sandbox import SandboxLimits, run_python, safe_relpath
from rlcr.tasks import build_family, verify
from rlcr.tasks.base import Task


def rlcr_sandbox_processes() -> list[str]:
    """Processes still alive that a sandbox started (their command line names /ws/)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "/ws/main.py" in line or "bwrap" in line and "/ws" in line]


def test_plain_code_runs_and_prints():
    r = run_python("print(sum(range(10)))")
    assert r.ok and r.stdout.strip() == "45"


def test_infinite_loop_is_killed_at_the_timeout():
    r = run_python("while True:\n    pass\n", limits=SandboxLimits(timeout_s=1.5))
    assert r.timed_out and not r.ok and r.seconds < 10


def test_fork_bomb_and_children_leave_no_process():
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_python(code, limits=SandboxLimits(timeout_s=2, max_processes=16))
    assert not r.ok
    time.sleep(0.5)
    assert rlcr_sandbox_processes() == []


def test_sigterm_ignoring_setsid_daemon_dies_with_the_sandbox(tmp_path):
    code = (
        "import os, signal, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "print('parent exits')\n"
    )
    r = run_python(code, limits=SandboxLimits(timeout_s=5))
    assert r.ok and "parent exits" in r.stdout
    time.sleep(0.5)
    assert rlcr_sandbox_processes() == []


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
