"""The agents' action language: a small text protocol, a parser that never raises, a renderer.

A completion is read line by line (split on "\\n"). A line whose first word is an all-caps word of
three or more letters (optionally followed by ":") is an ACTION line; every other line is free text,
the agent's own working (e.g. `68+57=125`), recorded in the turn but not acted on.

    POST <text>            one-line message to the shared board; `@agent3` mentions agent 3
    HIRE <role>: <brief>   hire an agent with that role and a one-line brief; it joins next round
    HIRE <n> <role>: <brief>  hire n agents at once (n from 2 to MAX_HIRES); a brief that names a
                           file or a part of one (`task.txt`, `task.txt:9-16`) is split into n
                           consecutive near-equal parts, one per hire (`split_lines`); any other
                           brief goes to each hire as it is
    WRITE <path>           write a file: every line after this one, to the end of the completion,
                           is its content (so WRITE comes last in a turn); text after the path on
                           the same line becomes the first content line
    READ <path>            show a file in your next observation; `READ <path>:<a>-<b>` only lines a..b
    RUN <path>             run a file with the environment's code runner (when there is one)
    SUBMIT <answer>        the organisation's final answer; the episode ends after this round
    WAIT                   do nothing this round
    DONE                   stop: you get no more turns

Paths are relative, `/`-separated, made of `[A-Za-z0-9._-]` components that do not start with a
dot (see `rlcr.org.workspace.check_path`). Keywords are upper case; roles are lower case.

Errors never raise. An unknown keyword (`FOO bar`), bad arguments (`HIRE worker` without a brief,
`READ ../x`), a turn with no action at all, or more than `max_actions` actions each add one error
message; the scheduler shows them to the agent next round and counts the turn as malformed.

`HIRE 4 worker: task.txt` costs 10 tokens of the tiny tokenizer where four `HIRE worker: task.txt:1-4`
lines cost 52: measured with the scripted organisations (benchmarks/org_critical_path.py), it is what
lets a company's critical path fall below one agent's tokens on a 16-term sum.

`render_action(a)` writes an action back as protocol text; for every valid action (the canonical
form `validate_action` accepts) `parse_turn(render_action(a)).actions == (a,)`.

A brief may NAME a part of a workspace file instead of re-typing it: `<path>:<a>-<b>` (lines a to b,
1-based, inclusive) or `<path>:<a>`, e.g. `HIRE worker: task.txt:1-8`. The hire's observation shows
those lines under its brief (`find_refs`), so a manager pays a few tokens for a part of any size.

This module also holds the rule for showing untrusted text to agents (`one_line`, `quote_block`):
text from another agent or from a file is either squeezed onto one line with line breaks, control
characters and chat-template special tokens neutralised, or quoted line by line behind "| ", so it
can never start a line of its own (no fake action line, no fake board header, no fake section).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlcr.org.workspace import PathError, check_path

MAX_HIRES = 16
"""The largest n of `HIRE <n> <role>: <brief>`."""
KEYWORDS = ("POST", "HIRE", "WRITE", "READ", "RUN", "SUBMIT", "WAIT", "DONE")
NO_ARG = ("WAIT", "DONE")
PATH_ARG = ("WRITE", "READ", "RUN")

_ACTION_LINE = re.compile(r"[ \t]*([A-Z][A-Z_]{2,}):?(?=[ \t\r]|$)(.*)", re.DOTALL)
ROLE = re.compile(r"[a-z][a-z0-9_]{0,31}")
MENTION = re.compile(r"@agent(\d{1,6})(?![\w])")
REF = re.compile(r"(?<![\w./-])([A-Za-z0-9_][A-Za-z0-9._/-]{0,199}):(\d{1,5})(?:-(\d{1,5}))?(?![\w-])")
# chat-template control sequences of the common families (ChatML, Llama, Mistral, Gemma, Phi)
_SPECIAL = re.compile(r"<\||\|>|</?s>|\[/?INST\]|<</?SYS>>|<start_of_turn>|<end_of_turn>|<eos>|<bos>|<pad>|<unk>")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


@dataclass(frozen=True)
class Action:
    """One parsed action. `arg`: POST text, HIRE role, WRITE/READ/RUN path, SUBMIT answer.
    `body`: HIRE brief, WRITE content. Both empty for WAIT and DONE."""

    kind: str
    arg: str = ""
    body: str = ""
    count: int = 1
    """HIRE: how many agents (`HIRE 4 worker: task.txt`); 1 for every other action."""

    def to_dict(self) -> dict[str, str | int]:
        out: dict[str, str | int] = {"kind": self.kind, "arg": self.arg, "body": self.body}
        if self.count != 1:
            out["count"] = self.count
        return out


@dataclass(frozen=True)
class ParsedTurn:
    """What one completion amounts to."""

    actions: tuple[Action, ...]
    errors: tuple[str, ...]
    thinking: str
    """The free-text lines, joined by newlines (kept for the record, never acted on)."""

    @property
    def malformed(self) -> bool:
        return bool(self.errors)


def mentions(text: str) -> tuple[int, ...]:
    """Agent indices mentioned as `@agentN`, in order of first appearance."""
    seen: list[int] = []
    for m in MENTION.finditer(text):
        i = int(m.group(1))
        if i not in seen:
            seen.append(i)
    return tuple(seen)


@dataclass(frozen=True)
class Ref:
    """A named part of a file: lines `first`..`last` (1-based, inclusive) of `path`."""

    path: str
    first: int
    last: int

    def __str__(self) -> str:
        return f"{self.path}:{self.first}" + (f"-{self.last}" if self.last != self.first else "")


def find_refs(text: str, limit: int = 4) -> tuple[Ref, ...]:
    """The file parts `text` names (`task.txt:3-6`), in order, at most `limit`; a bad path, an
    all-digit one (`12:30` is a time) or a range that runs backwards is not a reference."""
    out: list[Ref] = []
    for m in REF.finditer(str(text)):
        first = int(m.group(2))
        last = int(m.group(3)) if m.group(3) else first
        try:
            path = check_path(m.group(1))
        except PathError:
            continue
        if path.isdigit():
            continue
        if 1 <= first <= last and (ref := Ref(path, first, last)) not in out:
            out.append(ref)
        if len(out) >= limit:
            break
    return tuple(out)


def line_range(text: str) -> Ref | None:
    """`text` as exactly one file part (`task.txt:9-16`), else None."""
    m = REF.fullmatch(text)
    refs = find_refs(text, 1) if m else ()
    return refs[0] if refs else None


def split_lines(first: int, last: int, n: int) -> list[tuple[int, int]]:
    """Lines first..last cut into n consecutive parts whose sizes differ by at most one, the larger
    ones first: (1, 10, 3) -> [(1, 4), (5, 7), (8, 10)]. Needs 1 <= n <= last - first + 1."""
    size, extra = divmod(last - first + 1, n)
    if n < 1 or size < 1:
        raise ValueError(f"cannot split lines {first}-{last} into {n} parts")
    out, at = [], first
    for i in range(n):
        k = size + (i < extra)
        out.append((at, at + k - 1))
        at += k
    return out


def validate_action(a: Action) -> str | None:
    """None when `a` is a valid action in canonical form, else why not."""
    if a.kind not in KEYWORDS:
        return f"unknown action {a.kind!r}"
    if a.count != 1 and (a.kind != "HIRE" or not 2 <= a.count <= MAX_HIRES):
        return f"only HIRE takes a count, from 2 to {MAX_HIRES}"
    one_line = "\n" not in a.arg and a.arg == a.arg.strip()
    if a.kind in NO_ARG:
        return None if not a.arg and not a.body else f"{a.kind} takes no argument"
    if a.kind in ("POST", "SUBMIT"):
        if not a.arg or not one_line or a.body:
            return f"{a.kind} needs a one-line text"
        return None
    if a.kind == "HIRE":
        if not ROLE.fullmatch(a.arg):
            return "HIRE needs a lowercase role"
        if not a.body or "\n" in a.body or a.body != a.body.strip():
            return "HIRE needs a one-line brief"
        return None
    path = a.arg
    if a.kind == "READ" and (ref := line_range(a.arg)) is not None:
        if str(ref) != a.arg:
            return "READ range is not in canonical form"
        path = ref.path
    try:
        if check_path(path) != path:
            return f"{a.kind} path is not in canonical form"
    except PathError as e:
        return f"{a.kind}: {e}"
    if a.kind != "WRITE" and a.body:
        return f"{a.kind} takes only a path"
    return None


def render_action(a: Action) -> str:
    """Protocol text for one action (the inverse of parsing for valid actions)."""
    if a.kind in NO_ARG:
        return a.kind
    if a.kind == "HIRE":
        return f"HIRE {a.count} {a.arg}: {a.body}" if a.count != 1 else f"HIRE {a.arg}: {a.body}"
    if a.kind == "WRITE":
        return f"WRITE {a.arg}\n{a.body}"
    return f"{a.kind} {a.arg}"


def render_actions(actions: list[Action] | tuple[Action, ...]) -> str:
    """Several actions as one completion; a WRITE must be the last (its content runs to the end)."""
    return "\n".join(render_action(a) for a in actions)


def _parse_action(kind: str, rest: str) -> tuple[Action | None, str | None]:
    """One action from its keyword and the rest of its line (WRITE content is added by the caller)."""
    arg = rest.strip()
    if kind not in KEYWORDS:
        return None, f"unknown action {kind!r} (known: {' '.join(KEYWORDS)})"
    if kind in NO_ARG:
        return (Action(kind), None) if not arg else (None, f"{kind} takes no argument")
    if kind in ("POST", "SUBMIT"):
        return (Action(kind, arg), None) if arg else (None, f"{kind} needs text after it")
    if kind == "HIRE":
        role, colon, brief = arg.partition(":")
        role, brief = role.strip().lower(), brief.strip()
        if not colon or not brief:
            return None, "HIRE needs '<role>: <brief>'"
        count, role = _hire_count(role)
        if count is None:
            return None, f"HIRE <n> <role>: n is a whole number from 2 to {MAX_HIRES}"
        if not ROLE.fullmatch(role):
            return None, f"HIRE role {role[:40]!r} is not a lowercase word"
        return Action("HIRE", role, brief, count), None
    path = arg.split(None, 1)[0] if arg else ""
    if not path:
        return None, f"{kind} needs a path"
    if kind == "READ" and ":" in path:
        ref = line_range(path)
        if ref is None:
            return None, f"READ {path[:60]!r}: a part is <path>:<first>-<last>, lines from 1, first <= last"
        if len(arg.split(None, 1)) > 1:
            return None, "READ takes only a path"
        return Action("READ", str(ref)), None
    try:
        path = check_path(path)
    except PathError as e:
        return None, f"{kind}: {e}"
    if kind != "WRITE" and len(arg.split(None, 1)) > 1:
        return None, f"{kind} takes only a path"
    return Action(kind, path), None


def _hire_count(role: str) -> tuple[int | None, str]:
    """(n, role) of `HIRE <n> <role>`'s role part; (1, role) without a number, (None, role) for a bad one."""
    head, _, rest = role.partition(" ")
    if not head.isdigit():
        return 1, role
    n = int(head) if len(head) <= 3 else 0
    return (n if 1 <= n <= MAX_HIRES else None), rest.strip()


def parse_turn(text: object, max_actions: int = 8) -> ParsedTurn:
    """Parse one completion. Never raises: anything unusable becomes an error message."""
    try:
        return _parse_turn(text, max_actions)
    except Exception as e:  # a parser bug must not take down a rollout; it shows up as an error
        return ParsedTurn((), (f"parser failure: {type(e).__name__}",), "")


def _parse_turn(text: object, max_actions: int) -> ParsedTurn:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str):
        return ParsedTurn((), (f"completion is not text ({type(text).__name__})",), "")
    lines = text.split("\n")
    actions: list[Action] = []
    errors: list[str] = []
    thinking: list[str] = []
    for i, line in enumerate(lines):
        m = _ACTION_LINE.match(line)
        if not m:
            thinking.append(line)
            continue
        kind, rest = m.group(1), m.group(2)
        action, err = _parse_action(kind, rest)
        if action is not None and kind == "WRITE":
            inline = rest.strip().split(None, 1)
            first = [inline[1]] if len(inline) > 1 else []
            action = Action("WRITE", action.arg, "\n".join(first + lines[i + 1 :]))
        if err:
            errors.append(f"line {i + 1}: {err}")
        elif len(actions) >= max_actions:
            errors.append(f"line {i + 1}: more than {max_actions} actions in one turn; {kind} dropped")
        else:
            actions.append(action)
        if kind == "WRITE":
            break  # the rest of the completion is the file's content
    if not actions and not errors:
        errors.append("no action: a turn needs at least one action line (e.g. WAIT)")
    return ParsedTurn(tuple(actions), tuple(errors), "\n".join(t for t in thinking if t.strip()))


# ------------------------------------------------------------------ showing untrusted text to agents


def _break_special(m: re.Match) -> str:
    return m.group(0)[0] + " " + m.group(0)[1:]


def one_line(text: str, limit: int | None = None) -> str:
    """Untrusted text as a single safe line.

    Covers: line breaks and other control/format characters (-> space), chat-template special tokens
    of common families (broken up with a space, e.g. `<|im_start|>` -> `< |im_start| >`), square
    brackets (-> parentheses, so no fake `[#id agent role]` post header), optional length cut with
    a `...` marker. Does not cover: special tokens of tokenizers not listed in `_SPECIAL` (pass
    them to the engine's encode with special-token parsing off), or persuasion in plain words.
    """
    s = _CONTROL.sub(" ", str(text))
    s = _SPECIAL.sub(_break_special, s)
    s = s.replace("[", "(").replace("]", ")")
    s = " ".join(s.split())
    if limit is not None and len(s) > limit:
        s = s[: max(0, limit - 3)] + "..."
    return s


def quote_block(text: str, prefix: str = "| ") -> list[str]:
    """Untrusted multi-line text as quoted lines: each line behind `prefix`, special tokens broken."""
    out = []
    for line in str(text).split("\n"):
        line = _CONTROL.sub(" ", line)
        line = _SPECIAL.sub(_break_special, line)
        out.append(prefix + line.rstrip())
    return out
