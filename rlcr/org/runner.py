"""The code runner behind the RUN action: run a workspace file in the sandbox, describe the result.

`SandboxRunner()` is a `rlcr.org.episode.Runner`: `(files, path) -> observation text`. It hands the
workspace's committed files to `rlcr.sandbox.run_python` (the file at `path` as the entry, every
other file alongside it, so `import helper` works) and turns the result into a short text the agent
sees next round:

    RUN solve.py: exit code 0 in 0.03 s
    stdout (4 chars):
    204
    stderr: (empty)

A program that runs past `timeout_s` is killed and reported as `timed out after 2 s (killed)`; the
episode goes on. Output is cut to its TAIL (the end of a traceback and the last prints are what an
agent needs), the two streams sharing `max_chars`; what was cut is said, never silent.

Covers: everything `rlcr.sandbox` covers (time, memory, processes, output size, network,
secrets) for each RUN; one run cannot change the workspace (files the program writes are thrown
away with its sandbox, so all changes go through WRITE and its guards); a file that is not in the
workspace is an error for the agent, never a crash.
Does not cover: runs are synchronous inside the round (a round with many RUNs takes their sum of
time); no state survives between runs (each is a fresh sandbox); only Python files run; a missing
bubblewrap raises SandboxUnavailable, which the scheduler lets through (a broken environment must
stop the rollout, not look like a bug in the agent's code).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rlcr.sandbox import SandboxLimits, SandboxResult, run_python


def tail(text: str, limit: int) -> tuple[str, int]:
    """The last `limit` characters of `text` and how many were cut before them."""
    if len(text) <= limit:
        return text, 0
    return (text[len(text) - limit:] if limit > 0 else ""), len(text) - max(0, limit)


def _stream(name: str, text: str, limit: int, truncated: bool) -> list[str]:
    if not text:
        return [f"{name}: (empty)"]
    shown, cut = tail(text, limit)
    note = f", first {cut} cut" if cut else ""
    note += ", output limit reached" if truncated else ""
    return [f"{name} ({len(text)} chars{note}):", shown.rstrip("\n")]


def describe(path: str, result: SandboxResult, max_chars: int) -> str:
    """The observation for one run: status line, then the tails of stdout and stderr.

    The two streams share `max_chars`: each gets half, and what one does not use goes to the other."""
    if result.timed_out:
        head = f"RUN {path}: timed out after {result.seconds:.0f} s (killed)"
    else:
        head = f"RUN {path}: exit code {result.returncode} in {result.seconds:.2f} s"
    half = max_chars // 2
    out_limit = max(half, max_chars - min(len(result.stderr), half))
    err_limit = max_chars - min(len(result.stdout), out_limit)
    lines = [head, *_stream("stdout", result.stdout, out_limit, result.truncated),
             *_stream("stderr", result.stderr, err_limit, result.truncated)]
    return "\n".join(lines)


@dataclass(frozen=True)
class SandboxRunner:
    """Runs a workspace file with `run_python` under these limits (see the module docstring)."""

    timeout_s: float = 5.0
    """Wall seconds per run; the sandbox is killed after it."""
    memory_mb: int = 512
    """Address-space limit of the program."""
    max_processes: int = 32
    """Processes the program may have at once (fork bombs stop here)."""
    max_chars: int = 2000
    """Characters of stdout + stderr shown to the agent (tails)."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.memory_mb < 16 or self.max_processes < 1 or self.max_chars < 1:
            raise ValueError(f"runner limits must be positive (memory_mb >= 16), got {self}")

    def limits(self) -> SandboxLimits:
        # read back a little more than is shown, so the tail shown is the real end of the output
        return SandboxLimits(timeout_s=self.timeout_s, memory_mb=self.memory_mb,
                             max_processes=self.max_processes, max_output=max(64 * 1024, 4 * self.max_chars))

    def __call__(self, files: Mapping[str, str], path: str) -> str:
        if path not in files:
            raise FileNotFoundError(f"no file {path} in the workspace (files written this round exist next round)")
        others = {p: c for p, c in files.items() if p != path}
        result = run_python(files[path], files=others, limits=self.limits(), entry=path)
        return describe(path, result, self.max_chars)


__all__ = ["SandboxRunner", "describe", "tail"]
