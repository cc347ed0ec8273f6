"""The shared workspace: an in-memory map of files, path guards, limits and a record of every write.

Agents never touch the real filesystem: files live in a dict. Writes made during a round are staged
and applied together at the round's end (`commit`), so every agent of a round reads the same
snapshot, and two agents writing one path in the same round get a deterministic outcome: writes are
applied in order of (agent index, the agent's own write order), so the highest agent index wins,
whatever order the turns were processed in. Every writer is recorded (`history`), winners flagged.

`mirror_to_disk` / `read_from_disk` copy the files to and from a real folder for code runners.

Covers: relative paths only (no absolute, `~`, drive letters, backslashes), no `.`/`..`/empty
components, no NUL/control/whitespace characters, component charset and length, depth and total
length; file count and size limits; on disk: containment by real path (`commonpath`, so `/ws2` is
not inside `/ws`), refusing symlinked or hard-linked targets and symlinked parent folders, opening
with O_NOFOLLOW. Does not cover: races with code running concurrently in the mirror folder (the
runner must have stopped agent code before `read_from_disk`), quotas of the disk itself, or what
agent code does when run (that is the sandbox's job).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

MAX_PATH_CHARS = 200
MAX_PATH_DEPTH = 8
_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")


class PathError(ValueError):
    """A path an agent may not use; the message says why."""


def check_path(path: object) -> str:
    """The canonical form of an agent-supplied path (leading `./` removed) or PathError."""
    if not isinstance(path, str):
        raise PathError("path must be text")
    if "\x00" in path:
        raise PathError("path contains a NUL byte")
    if not path:
        raise PathError("empty path")
    if len(path) > MAX_PATH_CHARS:
        raise PathError(f"path longer than {MAX_PATH_CHARS} characters")
    if path.startswith(("/", "~", "\\")) or re.match(r"[A-Za-z]:", path):
        raise PathError(f"absolute path {path[:60]!r} not allowed")
    if "\\" in path or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in path):
        raise PathError("path contains a backslash, whitespace or control character")
    while path.startswith("./"):
        path = path[2:]
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise PathError(f"path {path[:60]!r} has an empty, '.' or '..' component")
    if len(parts) > MAX_PATH_DEPTH:
        raise PathError(f"path deeper than {MAX_PATH_DEPTH} folders")
    for p in parts:
        if not _COMPONENT.fullmatch(p):
            raise PathError(f"path component {p[:40]!r} must match [A-Za-z0-9_][A-Za-z0-9._-]* (<= 64 chars)")
    return path


@dataclass(frozen=True)
class FileVersion:
    """A file's current content and who put it there."""

    path: str
    content: str
    author: int
    round: int
    version: int


@dataclass(frozen=True)
class WriteRecord:
    """One write attempt as the workspace applied it."""

    round: int
    agent: int
    path: str
    chars: int
    accepted: bool
    won: bool
    reason: str = ""


class Workspace:
    """In-memory files with staged per-round writes (see module docstring)."""

    def __init__(self, max_files: int = 64, max_file_chars: int = 8000):
        self.max_files = max_files
        self.max_file_chars = max_file_chars
        self._files: dict[str, FileVersion] = {}
        self._staged: list[tuple[int, int, str, str, int]] = []  # (agent, seq, path, content, round)
        self.history: list[WriteRecord] = []

    def seed(self, path: str, content: str, author: int = -1) -> None:
        """Put a file in place before round 1 (the task file: author -1, round 0, not a write)."""
        path = check_path(path)
        self._files[path] = FileVersion(path, content, author, 0, 1)

    def stage_write(self, agent: int, path: str, content: str, round: int) -> str | None:
        """Queue a write for the end of the round; an error message when refused right away."""
        try:
            path = check_path(path)
        except PathError as e:
            self.history.append(WriteRecord(round, agent, str(path)[:200], 0, False, False, str(e)))
            return str(e)
        if len(content) > self.max_file_chars:
            why = f"file of {len(content)} chars exceeds the {self.max_file_chars} limit"
            self.history.append(WriteRecord(round, agent, path, len(content), False, False, why))
            return why
        seq = sum(1 for s in self._staged if s[0] == agent)
        self._staged.append((agent, seq, path, content, round))
        return None

    def commit(self, round: int) -> list[WriteRecord]:
        """Apply the staged writes in (agent, seq) order; returns this round's records."""
        staged = sorted(self._staged, key=lambda s: (s[0], s[1]))
        self._staged = []
        last = {s[2]: i for i, s in enumerate(staged)}  # the final writer of each path wins
        out = []
        for i, (agent, _, path, content, rnd) in enumerate(staged):
            if path not in self._files and len(self._files) >= self.max_files:
                out.append(WriteRecord(rnd, agent, path, len(content), False, False, f"more than {self.max_files} files"))
                continue
            won = last[path] == i
            if won:
                old = self._files.get(path)
                self._files[path] = FileVersion(path, content, agent, rnd, (old.version + 1) if old else 1)
            out.append(WriteRecord(rnd, agent, path, len(content), True, won))
        self.history.extend(out)
        return out

    def read(self, path: str) -> FileVersion | None:
        """The committed file (the snapshot of the round's start), or None."""
        try:
            return self._files.get(check_path(path))
        except PathError:
            return None

    def listing(self) -> list[FileVersion]:
        return [self._files[p] for p in sorted(self._files)]

    def files(self) -> dict[str, str]:
        """path -> content of the committed files."""
        return {p: f.content for p, f in sorted(self._files.items())}


# ------------------------------------------------------------------------------ the disk mirror


def is_within(root: str | Path, target: str | Path) -> bool:
    """True when `target` resolves to `root` or below it (component-wise, so /ws2 is not in /ws)."""
    r = os.path.realpath(root)
    t = os.path.realpath(target)
    return os.path.commonpath([r, t]) == r


def _safe_parent(root: Path, rel: str) -> Path:
    """Create the parent folders of `rel` under `root`, refusing any symlink on the way."""
    cur = root
    for part in rel.split("/")[:-1]:
        cur = cur / part
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            os.mkdir(cur, 0o755)
            st = os.lstat(cur)
        if not stat.S_ISDIR(st.st_mode):
            raise PathError(f"{rel}: {part!r} on the way is a symlink or not a folder")
    return cur


def mirror_to_disk(files: dict[str, str], root: str | Path) -> list[str]:
    """Write `files` under the existing real folder `root`; returns the paths refused (and why)."""
    root = Path(root)
    if os.path.islink(root) or not root.is_dir():
        raise PathError(f"mirror root {root} must be an existing folder, not a symlink")
    root = Path(os.path.realpath(root))
    refused = []
    for rel, content in files.items():
        try:
            rel = check_path(rel)
            _safe_parent(root, rel)
            target = root / rel
            if not is_within(root, target):
                raise PathError(f"{rel}: resolves outside the workspace")
            # no O_TRUNC: a hard link to an outside file must be refused before anything is cut;
            # O_NONBLOCK: a planted FIFO fails instead of blocking
            flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
            fd = os.open(target, flags, 0o644)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
                    raise PathError(f"{rel}: not a regular file of its own (hard link?)")
                os.ftruncate(fd, 0)
                data = memoryview(content.encode("utf-8", errors="surrogatepass"))
                while data:
                    data = data[os.write(fd, data):]
            finally:
                os.close(fd)
        except (PathError, OSError) as e:
            refused.append(f"{rel}: {e}")
    return refused


def read_from_disk(root: str | Path, max_files: int = 64, max_file_chars: int = 8000) -> dict[str, str]:
    """Regular files under `root` whose relative path passes `check_path`; symlinks are skipped."""
    root = Path(os.path.realpath(root))
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            try:
                rel = check_path(rel)
                st = os.lstat(full)
            except (PathError, OSError):
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_size > 4 * max_file_chars:
                continue
            fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as fh:
                text = fh.read(4 * max_file_chars + 1).decode("utf-8", errors="replace")
            if len(text) <= max_file_chars:
                out[rel] = text
            if len(out) >= max_files:
                return out
    return out
