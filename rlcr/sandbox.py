"""Run untrusted Python (agents' code, code-task verification) in a throwaway sandbox.

Used by the code tasks (`rlcr.tasks.humaneval` grades answers here) and by the organisation (the RUN
action, `rlcr.org.runner`). Each call gets a fresh temp folder as its only writable tree (mounted at
/ws), a minimal read-only view of the system (/usr, /etc, the interpreter), no network namespace of
the host, its own user and PID namespaces, an unprivileged uid (65534 when the caller is root), a
scrubbed environment, and rlimits.

How a call runs: bwrap starts a small launcher as PID 1 of the new namespaces (`--as-pid-1`); the
launcher sets the rlimits (now inside the run's own user namespace), tells the caller it has
started, and execs the program, which stays PID 1. When PID 1 exits, or is SIGKILLed at the
timeout, the kernel kills every other process of the namespace and waits for them to be gone before
bwrap sees PID 1 exit; bwrap reaps it, and `run_python` reaps bwrap. So a call returns only when
every process it started is gone, and it leaves no zombie for the system's init to reap.

Covers:
- time: wall-clock timeout counted from the program's start (RLIMIT_CPU as a backstop); the
  namespace's PID 1 is SIGKILLed, which takes every process of the run down with it;
- processes: RLIMIT_NPROC is set inside the run's user namespace, where the kernel counts only that
  run's processes, so a fork bomb stops at `max_processes` of its own; children, SIGTERM-ignorers
  and setsid daemons die with the PID namespace before the call returns; no number of concurrent or
  consecutive calls, and no program of an earlier call, can make a later call fail;
- memory: RLIMIT_AS; a memory bomb fails inside the sandbox, the caller lives;
- output: stdout/stderr go to files capped by RLIMIT_FSIZE and are read back at most `max_output`
  bytes, so 1 GB of prints cannot exhaust the caller;
- network: a new network namespace with nothing in it (loopback of the host unreachable);
- secrets: only PATH, HOME, LANG, PYTHON* safety variables are passed; nothing of the host's files
  but /usr and /etc is mounted (no home folder, not the project tree); no file descriptor of the
  caller reaches the program;
- reward hacking: verification builds its program from the pristine task row in a fresh sandbox, so
  files agents wrote (tests, conftest.py, sitecustomize.py) are never on its path; Python runs with
  -S -E -s, so no site/sitecustomize/usercustomize hooks run even from the workspace.
Does not cover: kernel exploits, side channels, CPU time stolen from the caller while it runs (the
caller waits), memory and disk summed over concurrent calls (each process is capped by RLIMIT_AS,
each file by RLIMIT_FSIZE, a call's files in total only by its time limit; the folder is deleted
when the call returns), or an answer that reads the verification program's own source (a secret
pass marker is in it). The program runs as PID 1 of its namespace: orphans it does not reap stay
zombies, counted against its own process limit, until the call ends.

Needs bubblewrap (`bwrap`, Debian package `bubblewrap`; `make setup` installs it when root) and user
namespaces. When the sandbox cannot start (no bwrap, namespaces refused, no start within
`start_timeout_s`) `run_python` raises SandboxUnavailable rather than run code unconfined; the
program's own output can never cause it (the launcher's start signal, not the program's stderr, says
whether the sandbox started).
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

NOBODY = 65534
PYTHON_FLAGS = ("-S", "-E", "-s", "-B")
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/ws", "LANG": "C.UTF-8",
       "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}

# PID 1 of the sandbox before the program: rlimits set here count inside the run's own user
# namespace; one byte on the start fd says the sandbox is up; then the program replaces it.
LAUNCHER = (
    "import os, resource, sys\n"
    "fd, python, entry, *caps = sys.argv[1:]\n"
    "for name, n in zip(('CPU', 'AS', 'NPROC', 'FSIZE', 'CORE'), map(int, caps)):\n"
    "    resource.setrlimit(getattr(resource, 'RLIMIT_' + name), (n, n))\n"
    "os.write(int(fd), b'1')\n"
    "os.closerange(3, 65536)\n"
    f"os.execv(python, [python, *{PYTHON_FLAGS!r}, entry])\n"
)
_CHILD_PID = re.compile(rb'"child-pid":\s*(\d+)')


class SandboxUnavailable(RuntimeError):
    """bwrap is missing or cannot create namespaces here."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0
    """Wall seconds the program may run (from its start); then the whole run is SIGKILLed."""
    memory_mb: int = 512
    """Address space of each process (RLIMIT_AS)."""
    max_processes: int = 32
    """Processes of this run at once, the program included (RLIMIT_NPROC in the run's namespace)."""
    max_output: int = 64 * 1024
    """Bytes of stdout and of stderr read back (more sets `truncated`)."""
    max_file_bytes: int = 8 * 1024 * 1024
    """Largest file the program may write, its stdout and stderr included (RLIMIT_FSIZE)."""
    start_timeout_s: float = 60.0
    """Seconds bwrap may take to start the sandbox (not counted in `timeout_s`); past them the
    sandbox is called unavailable."""

    def rlimits(self) -> tuple[int, ...]:
        """CPU seconds, address space, processes, file size, core size: the launcher's order."""
        return (int(self.timeout_s) + 2, self.memory_mb * 1024 * 1024, self.max_processes,
                self.max_file_bytes, 0)


@dataclass(frozen=True)
class SandboxResult:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool
    seconds: float
    """Wall seconds from the program's start until every process of the run was gone."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def interpreter() -> str:
    """The system Python if there is one (readable by uid 65534), else this one."""
    for cand in ("/usr/bin/python3", sys.executable):
        if os.path.exists(cand):
            return cand
    raise SandboxUnavailable("no Python interpreter found")


def system_binds() -> list[str]:
    """bwrap arguments for a read-only /usr, /etc and the top-level links or folders into them."""
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for link in ("/bin", "/lib", "/lib64", "/sbin"):
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    return args


def bwrap_command(ws: Path, python: str, entry: str, limits: SandboxLimits, start_fd: int,
                  status_fd: int) -> list[str]:
    """The bwrap command line: launcher as PID 1, `entry` (a path inside /ws) as the program."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed: `apt-get install bubblewrap`")
    # --unshare-user: a user namespace is required (--unshare-all only tries), the process limit counts in it
    cmd = [bwrap, "--unshare-all", "--unshare-user", "--as-pid-1", "--die-with-parent", "--new-session",
           "--json-status-fd", str(status_fd), *system_binds()]
    prefix = Path(python).resolve().parents[1]
    if not str(prefix).startswith("/usr"):
        cmd += ["--ro-bind", str(prefix), str(prefix)]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", str(ws), "/ws", "--chdir", "/ws",
            python, *PYTHON_FLAGS, "-c", LAUNCHER, str(start_fd), python, entry, *map(str, limits.rlimits())]
    return cmd


def safe_relpath(name: str) -> PurePosixPath:
    p = PurePosixPath(name)
    if not name or "\x00" in name or p.is_absolute() or ".." in p.parts:
        raise ValueError(f"sandbox file name refused: {name!r}")
    return p


def write_workspace(ws: Path, files: dict[str, str]) -> None:
    """Write `files` under `ws` (names checked), owned by the sandbox uid when we are root."""
    ws.mkdir()
    for name, text in files.items():
        target = ws / safe_relpath(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    if os.geteuid() == 0:
        for p in [ws, *ws.rglob("*")]:
            os.chown(p, NOBODY, NOBODY)


def _read_capped(path: Path, cap: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    return data[:cap].decode("utf-8", errors="replace"), len(data) > cap


def _readable(fd: int, timeout_s: float) -> bool:
    """Data or EOF on `fd` within `timeout_s` (poll, not select: any fd number works)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout_s * 1000))))


def await_start(start_fd: int, timeout_s: float) -> bool:
    """True when the launcher wrote its start byte within `timeout_s`; False on EOF or timeout."""
    return _readable(start_fd, timeout_s) and os.read(start_fd, 1) == b"1"


def child_pid(status_fd: int) -> int | None:
    """PID (in our namespace) of the sandbox's PID 1, from what bwrap wrote so far on its status fd."""
    data = b""
    while b"\n" not in data and _readable(status_fd, 0):
        chunk = os.read(status_fd, 4096)
        if not chunk:
            break
        data += chunk
    m = _CHILD_PID.search(data)
    return int(m.group(1)) if m else None


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])  # the name before ")" is the program's to choose


def kill_namespace(bwrap_pid: int, init_pid: int | None) -> None:
    """SIGKILL the sandbox's PID 1 (so the kernel kills its whole namespace), through a pidfd and
    only while that PID is still bwrap's child, so a recycled PID is never hit."""
    if init_pid is None:
        return
    try:
        pidfd = os.pidfd_open(init_pid)
    except OSError:
        return
    try:
        if parent_of(init_pid) == bwrap_pid:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.close(pidfd)


def stop(proc: subprocess.Popen, init_pid: int | None, grace_s: float = 10.0) -> None:
    """End the run and reap bwrap; bwrap has reaped PID 1, whose exit waited for the namespace."""
    if proc.poll() is None:
        kill_namespace(proc.pid, init_pid)
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            pass
        try:  # bwrap itself is stuck: --die-with-parent takes the sandbox down with it
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def _drop_privileges() -> dict:
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []} if os.geteuid() == 0 else {}


@dataclass(frozen=True)
class _Outcome:
    started: bool
    returncode: int
    timed_out: bool
    seconds: float


def spawn(cmd: list[str], ws: Path, out, err, fds: tuple[int, ...]) -> subprocess.Popen:
    """Start bwrap (as the sandbox uid when we are root) in a session of its own."""
    try:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=ENV, cwd=ws,
                                pass_fds=fds, start_new_session=True, **_drop_privileges())
    except OSError as e:
        raise SandboxUnavailable(f"bwrap could not be executed: {e}") from e


def follow(proc: subprocess.Popen, start_fd: int, status_fd: int, limits: SandboxLimits) -> _Outcome:
    """Wait for the sandbox to start, then for the program (at most `timeout_s`); return only once
    bwrap and every process of the run are gone."""
    init_pid, timed_out, started, t0 = None, False, False, time.perf_counter()
    try:
        started = await_start(start_fd, limits.start_timeout_s)
        init_pid, t0 = child_pid(status_fd), time.perf_counter()
        if started:
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        stop(proc, init_pid or child_pid(status_fd))
    code = -signal.SIGKILL if timed_out else proc.returncode
    return _Outcome(started, code, timed_out, time.perf_counter() - t0)


def supervise(ws: Path, entry: str, limits: SandboxLimits, out, err) -> _Outcome:
    """One run of `entry` (a file in `ws`): the pipes for the start byte and bwrap's status, bwrap, the wait."""
    start_r, start_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        try:
            cmd = bwrap_command(ws, interpreter(), f"/ws/{entry}", limits, start_w, status_w)
            proc = spawn(cmd, ws, out, err, (start_w, status_w))
        finally:  # only bwrap and the sandbox hold the write ends: EOF when both are gone
            os.close(start_w)
            os.close(status_w)
        return follow(proc, start_r, status_r, limits)
    finally:
        os.close(start_r)
        os.close(status_r)


def run_python(code: str, timeout_s: float = 10.0, files: dict[str, str] | None = None,
               limits: SandboxLimits | None = None, entry: str = "main.py") -> SandboxResult:
    """Write `files` and `code` (as `entry`) into a fresh sandbox and run it (see the module docstring)."""
    limits = limits or SandboxLimits(timeout_s=timeout_s)
    with tempfile.TemporaryDirectory(prefix="rlcr-sbx-") as tmp:
        ws, logs = Path(tmp) / "ws", Path(tmp) / "logs"
        write_workspace(ws, {**(files or {}), entry: code})
        logs.mkdir(mode=0o700)
        os.chmod(Path(tmp), 0o755)
        with open(logs / "out", "wb") as out, open(logs / "err", "wb") as err:
            run = supervise(ws, entry, limits, out, err)
        stdout, t1 = _read_capped(logs / "out", limits.max_output)
        stderr, t2 = _read_capped(logs / "err", limits.max_output)
    if not run.started:
        why = stderr.strip()[:300] or f"no start within {limits.start_timeout_s:g} s (exit code {run.returncode})"
        raise SandboxUnavailable(f"bwrap could not start the sandbox: {why}")
    return SandboxResult(run.returncode, stdout, stderr, run.timed_out, t1 or t2, run.seconds)


__all__ = ["SandboxLimits", "SandboxResult", "SandboxUnavailable", "run_python", "safe_relpath"]
