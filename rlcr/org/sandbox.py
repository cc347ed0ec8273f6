"""Run untrusted Python (agents' code, code-task verification) in a throwaway sandbox.

Each call gets a fresh temp folder as its only writable tree (mounted at /ws), a minimal read-only
view of the system (/usr, /etc, the interpreter), no network namespace of the host, its own PID
namespace, an unprivileged uid (65534), a scrubbed environment, and rlimits.

Covers:
- time: wall-clock timeout (and RLIMIT_CPU as a backstop); the whole sandbox is SIGKILLed;
- processes: fork bombs hit RLIMIT_NPROC; children, SIGTERM-ignorers and setsid daemons die with the
  PID namespace when the sandbox is killed or returns (nothing outlives a call);
- memory: RLIMIT_AS; a memory bomb fails inside the sandbox, the caller lives;
- output: stdout/stderr go to files capped by RLIMIT_FSIZE and are read back at most `max_output`
  bytes, so 1 GB of prints cannot exhaust the caller;
- network: a new network namespace with nothing in it (loopback of the host unreachable);
- secrets: only PATH, HOME, LANG, PYTHON* safety variables are passed; /root, /work and the
  project tree are not mounted;
- reward hacking: verification builds its program from the pristine task row in a fresh sandbox, so
  files agents wrote (tests, conftest.py, sitecustomize.py) are never on its path; Python runs with
  -S -E -s, so no site/sitecustomize/usercustomize hooks run even from the workspace.
Does not cover: kernel exploits, side channels, CPU time stolen from the caller while it runs (the
caller waits), or an answer that reads the verification program's own source (a secret pass marker
is in it).

Needs bubblewrap (`bwrap`, Debian package `bubblewrap`; `make setup` installs it when root). Without
it `run_python` raises SandboxUnavailable rather than run code unconfined.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

NOBODY = 65534


class SandboxUnavailable(RuntimeError):
    """bwrap is missing or cannot create namespaces here."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0
    memory_mb: int = 512
    max_processes: int = 32
    max_output: int = 64 * 1024
    max_file_bytes: int = 8 * 1024 * 1024


@dataclass(frozen=True)
class SandboxResult:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def interpreter() -> str:
    """The system Python if there is one (readable by uid 65534), else this one."""
    for cand in ("/usr/bin/python3", sys.executable):
        if os.path.exists(cand):
            return cand
    raise SandboxUnavailable("no Python interpreter found")


def bwrap_command(ws: Path, python: str, script: str) -> list[str]:
    bwrap = shutil.which("bwrap")
    if not bwrap:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed: `apt-get install bubblewrap`")
    cmd = [bwrap, "--unshare-all", "--die-with-parent", "--new-session",
           "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for link in ("/bin", "/lib", "/lib64", "/sbin"):
        if os.path.islink(link):
            cmd += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            cmd += ["--ro-bind", link, link]
    prefix = Path(python).resolve().parents[1]
    if not str(prefix).startswith("/usr"):
        cmd += ["--ro-bind", str(prefix), str(prefix)]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", str(ws), "/ws", "--chdir", "/ws",
            python, "-S", "-E", "-s", "-B", script]
    return cmd


def safe_relpath(name: str) -> PurePosixPath:
    p = PurePosixPath(name)
    if not name or "\x00" in name or p.is_absolute() or ".." in p.parts:
        raise ValueError(f"sandbox file name refused: {name!r}")
    return p


def _limits(limits: SandboxLimits):
    def apply() -> None:  # runs in the child between fork and exec: rlimits only
        cpu = int(limits.timeout_s) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        mem = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_bytes, limits.max_file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _read_capped(path: Path, cap: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    return data[:cap].decode("utf-8", errors="replace"), len(data) > cap


def run_python(code: str, timeout_s: float = 10.0, files: dict[str, str] | None = None,
               limits: SandboxLimits | None = None, entry: str = "main.py") -> SandboxResult:
    """Write `files` and `code` (as `entry`) into a fresh sandbox and run it."""
    limits = limits or SandboxLimits(timeout_s=timeout_s)
    with tempfile.TemporaryDirectory(prefix="rlcr-sbx-") as tmp:
        ws, logs = Path(tmp) / "ws", Path(tmp) / "logs"
        ws.mkdir()
        logs.mkdir(mode=0o700)
        for name, text in {**(files or {}), entry: code}.items():
            target = ws / safe_relpath(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        for p in [ws, *ws.rglob("*")]:
            os.chown(p, NOBODY, NOBODY) if os.geteuid() == 0 else None
        os.chmod(Path(tmp), 0o755)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/ws", "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
        started = time.perf_counter()
        timed_out = False
        with open(logs / "out", "wb") as out, open(logs / "err", "wb") as err:
            drop = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if os.geteuid() == 0 else {}
            proc = subprocess.Popen(
                bwrap_command(ws, interpreter(), f"/ws/{entry}"), stdin=subprocess.DEVNULL, stdout=out,
                stderr=err, env=env, cwd=ws, start_new_session=True, preexec_fn=_limits(limits), **drop,
            )
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc)
        seconds = time.perf_counter() - started
        stdout, t1 = _read_capped(logs / "out", limits.max_output)
        stderr, t2 = _read_capped(logs / "err", limits.max_output)
        if proc.returncode == 1 and "bwrap:" in stderr and not stdout:
            raise SandboxUnavailable(f"bwrap could not start the sandbox: {stderr.strip()[:300]}")
        return SandboxResult(proc.returncode if not timed_out else -signal.SIGKILL, stdout, stderr,
                             timed_out, t1 or t2, seconds)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the sandbox's session; its PID namespace takes every process inside down with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
