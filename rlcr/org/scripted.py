"""Scripted organisations for the built-in sum tasks: test oracles now, bootstrap traces later.

They are policies in the same interface as the learned one: `generate_batch(requests)` reads only
each request's observation text (no hidden state, no memory between turns) and writes protocol
text, which goes through the same scheduler, parser, budgets and records.

styles
    solo      the CEO adds the terms alone, writing the partial sums out
              (`68+57=125;125+42=167;167+37=204` then `SUBMIT 204`): realistic tokens for one agent.
    delegate  a manager (the CEO or a lead) with more than two terms splits them where the task's
              reduction tree splits (so every worker's brief is one of the task's sub-problems) and
              hires one agent per half: a `lead` for a half of 3+ terms when leads may hire at that
              depth, else a `worker` (who then writes out the partial sums of its part). When both
              halves have results it adds them (`125+79=204`) and posts to its manager, or SUBMITs.
    verify    delegate, plus: one round after hiring a worker, the manager hires a verifier with the
              brief `check @agentN`; it accepts the worker's result only once the verifier APPROVEs,
              and hires a new worker for that part after a REJECT. Leads' results are not verified.
              A verifier that starts before its worker has posted adds the part meanwhile (its
              chain, then WAIT); with `org.show_working` it sees that result next turn and only
              compares it with the claim, so checking costs one short turn after the worker's.

Briefs: with a task file in the workspace (`org.task_file`, one term per line) a manager does not
follow the tree: one line `HIRE <k> worker: task.txt` (k = `flat_parts`, about the square root of
the number of terms) gives k workers consecutive parts of the file (`task.txt:1-4`, `task.txt:5-8`,
...), the verify style hires their checkers in the same turn (`HIRE <k> verifier: task.txt`: a
verifier checks the worker whose brief is its own part), and the manager adds the k results left to
right. A re-hire after a REJECT names its part (`HIRE worker: task.txt:5-8`). Each hire reads its
terms from the part its observation shows. Without a task file, briefs carry the terms.

Error model (seeded by (seed, episode, agent, round), so runs are reproducible): every addition any
scripted agent writes is off by a nonzero amount in [-10, 10] with probability `error_rate`; a
verifier recomputes with `verifier_error_rate` per addition, and with probability `rubber_stamp`
approves without checking (the cover-up failure mode behaviour metrics must catch).

Verdict posts look like `@agent3 APPROVE 68+57=125` / `@agent3 REJECT 68+57=124`: the verdict word,
then the claim checked as its last equation (`rlcr.behaviour` reads verdicts that way).

Budget: the solo agent drops its written-out partial sums when they would not fit the turn's
max_new_tokens; managers and workers are short anyway. If the org is full or too deep to hire, a
manager adds that part itself.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlcr.org.episode import Generation, LengthFn, Request, approx_tokens
from rlcr.org.protocol import Ref, find_refs

_HEAD = re.compile(r"agent(\d+) \| role (\w+) \| .*?\| depth (\d+)$")
_STATUS = re.compile(r"round (\d+) of (\d+) \| tokens left (-?\d+)$")
_LIMITS = re.compile(r"limits: agents (\d+)/(\d+), depth (\d+)")
_ORG = re.compile(r"\| agent(\d+) (\w+)(?: <- agent(\d+): (.*))?$")
_POST = re.compile(r"\[#(\d+) agent(\d+) (\w+)\] (.*)$")
_EXPR = re.compile(r"[-+]?\d+(?:[-+]\d+)*")
_VERDICT = re.compile(r"\b(APPROVE|REJECT)\b")
_TASK_FILE = re.compile(r"\| (\S+) (\d+) lines, the task$")


@dataclass
class View:
    """What a scripted agent reads off its observation."""

    me: int = -1
    role: str = ""
    depth: int = 0
    round: int = 0
    n_agents: int = 1
    max_agents: int = 1
    max_depth: int = 0
    actions: set[str] = field(default_factory=set)
    roles: set[str] = field(default_factory=set)
    text: str = ""
    org: dict[int, tuple[str, int, str]] = field(default_factory=dict)  # id -> (role, parent, brief)
    posts: dict[int, tuple[int, str]] = field(default_factory=dict)  # post id -> (author, text)
    task_file: tuple[str, int] | None = None  # (path, lines) of the task's workspace file
    part: str = ""  # the lines of the file parts the brief names, joined
    working: str = ""  # the end of this agent's own working last turn
    read: tuple[object, str] | None = None  # (Ref, its lines joined) of a part READ last turn

    def terms(self) -> list[int] | None:
        """The terms this agent works on: those of its brief's file part, else of its task/brief text."""
        return terms_of(self.part) if self.part else terms_of(self.text)

    def span(self) -> tuple[int, int] | None:
        """The task-file lines this agent's terms are: all of them for the CEO, its brief's part for a hire."""
        if self.task_file is None:
            return None
        path, n = self.task_file
        if self.me == 0:
            return (1, n)
        refs = [r for r in find_refs(self.text) if r.path == path]
        return (refs[0].first, refs[0].last) if len(refs) == 1 else None


def read_view(obs: str) -> View:
    v = View()
    section = ""
    text_lines: list[str] = []
    part_lines: list[str] = []
    read_ref, read_lines = None, []
    for line in obs.split("\n"):
        if line.startswith("- your working: "):
            v.working = line[len("- your working: "):]
        elif line.startswith("- part ") and line.endswith(":") and (refs := find_refs(line)):
            read_ref, section = refs[0], "read"
        elif section == "read" and line.startswith("| "):
            read_lines.append(line[2:])
        elif m := _HEAD.match(line):
            v.me, v.role, v.depth = int(m[1]), m[2], int(m[3])
        elif m := _STATUS.match(line):
            v.round = int(m[1])
        elif m := _LIMITS.match(line):
            v.n_agents, v.max_agents, v.max_depth = int(m[1]), int(m[2]), int(m[3])
        elif line.startswith("actions: "):
            v.actions = set(line.split()[1:])
        elif line.startswith("roles you can hire: "):
            v.roles = set(line.split()[4:])
        elif not line.startswith(("|", "[")):
            section = line.split(" ")[0].rstrip(":")
        elif section in ("task", "brief") and line.startswith("| "):
            text_lines.append(line[2:])
        elif section == "part" and line.startswith("| "):
            part_lines.append(line[2:])
        elif section == "files" and (m := _TASK_FILE.match(line)):
            v.task_file = (m[1], int(m[2]))
        elif section == "org" and (m := _ORG.match(line)):
            v.org[int(m[1])] = (m[2], int(m[3]) if m[3] else -1, m[4] or "")
        elif (m := _POST.match(line)) and section in ("for", "board"):
            v.posts[int(m[1])] = (int(m[2]), m[4])
    v.text = "\n".join(text_lines)
    v.part = "".join("".join(part_lines).split())
    if read_ref is not None:
        v.read = (read_ref, "".join("".join(read_lines).split()))
    return v


def terms_of(text: str) -> list[int] | None:
    """The terms of the first sum expression in the text (`68+57-5` -> [68, 57, -5])."""
    m = _EXPR.search("".join(text.split()))
    return [int(t) for t in re.findall(r"[-+]?\d+", m.group(0))] if m else None


def render_sum(terms: Sequence[int]) -> str:
    out = str(terms[0])
    for t in terms[1:]:
        out += f"+{t}" if t >= 0 else f"-{-t}"
    return out


def tree_split(terms: Sequence[int]) -> tuple[list[int], list[int]]:
    """Where the task's pairwise reduction tree splits: the largest power of two below len(terms)."""
    left = 1 << (len(terms) - 1).bit_length() - 1
    return list(terms[:left]), list(terms[left:])


def flat_parts(n: int) -> int:
    """Workers a flat split of n terms hires: about sqrt(n), so that a worker's chain (n/k terms) and
    the manager's sum of the k results take about as long; at least 2, and at most n // 2 so that every
    part has two terms to add (a one-term part has no sum to post). Below 2 (n < 4): no split."""
    return min(max(2, round(n ** 0.5)), n // 2)


def add(a: int, b: int, rng: random.Random, p: float) -> int:
    s = a + b
    if p > 0 and rng.random() < p:
        s += rng.choice([d for d in range(-10, 11) if d])
    return s


def chain(terms: Sequence[int], rng: random.Random, p: float) -> tuple[int, str]:
    """Add left to right, writing each partial sum: (result, `a+b=s;s+c=t;...`)."""
    acc, steps = terms[0], []
    for t in terms[1:]:
        s = add(acc, t, rng, p)
        steps.append(f"{render_sum([acc, t])}={s}")
        acc = s
    return acc, ";".join(steps)


def claim_of(v: View, agent: int) -> int | None:
    """The number an agent's latest post states (after its last `=`)."""
    for pid in sorted(v.posts, reverse=True):
        author, text = v.posts[pid]
        if author == agent and "=" in text:
            m = re.search(r"[-+]?\d+", text.rsplit("=", 1)[1])
            if m:
                return int(m.group(0))
    return None


def own_result(working: str, terms: Sequence[int]) -> int | None:
    """The result of this agent's last-turn working when that working was the chain of `terms` (its
    last step adds the last term to the sum of the others), else None."""
    m = re.search(r"(-?\d+)([-+]\d+)=(-?\d+)$", "".join(working.split()))
    if m is None or len(terms) < 2 or int(m[2]) != terms[-1]:
        return None
    return int(m[3])


def verdict_of(v: View, verifier: int) -> str | None:
    for pid in sorted(v.posts, reverse=True):
        author, text = v.posts[pid]
        if author == verifier and (m := _VERDICT.search(text)):
            return m.group(1)
    return None


@dataclass
class ScriptedOrg:
    """A hand-written organisation as a policy (see the module docstring)."""

    style: str = "delegate"
    error_rate: float = 0.0
    verifier_error_rate: float = 0.0
    rubber_stamp: float = 0.0
    seed: int = 0
    len_fn: LengthFn = approx_tokens

    def __post_init__(self) -> None:
        if self.style not in ("solo", "delegate", "verify"):
            raise ValueError(f"scripted style must be solo, delegate or verify, got {self.style!r}")

    def generate_batch(self, requests: Sequence[Request]) -> list[Generation]:
        return [Generation(self.act(r)) for r in requests]

    def act(self, req: Request) -> str:
        v = read_view(req.prompt)
        rng = random.Random(f"{self.seed}:{req.episode_id}:{req.agent}:{req.round}")
        if v.role == "verifier":
            return self._verify(v, rng)
        terms = v.terms()
        if not terms:
            return "DONE"
        if v.me == 0 and (self.style == "solo" or "HIRE" not in v.actions or len(terms) == 1):
            return self._solo(v, terms, rng, req.max_new_tokens)
        if v.role == "worker" or "HIRE" not in v.actions or len(terms) <= 2:
            value, work = chain(terms, rng, self.error_rate)
            return self._deliver(v, work, value)
        return self._manage(v, terms, rng, req.max_new_tokens)

    def _solo(self, v: View, terms: list[int], rng: random.Random, max_new: int) -> str:
        """Add the terms writing the partial sums out. When the chain does not fit one turn and the
        task is a workspace file, work as far as fits, then READ the next lines of the task file and
        carry the running sum over in the working (`..;35+2=37`, next turn `37+3=40;..`)."""
        acc, todo, first = terms[0], terms[1:], 2  # `first`: the task-file line of todo[0]
        if v.read and v.working and (part := terms_of(v.read[1])) and (m := re.search(r"=(-?\d+)$", v.working)):
            acc, todo, first = int(m.group(1)), part, v.read[0].first
        steps, sums = [], [acc]
        for t in todo:
            sums.append(add(sums[-1], t, rng, self.error_rate))
            steps.append(f"{render_sum([sums[-2], t])}={sums[-1]}")
        n_lines = v.task_file[1] if v.task_file else first + len(todo) - 1
        done = first + len(todo) - 1 >= n_lines
        fits = lambda text: self.len_fn(text) <= max_new  # noqa: E731
        if done and fits(text := "\n".join([";".join(steps), f"SUBMIT {sums[-1]}"]).lstrip("\n")):
            return text
        if v.task_file is not None and "READ" in v.actions:
            for k in range(len(steps), 0, -1):  # as many steps as fit, then the next lines to read
                nxt = first + k
                more = f"READ {v.task_file[0]}:{nxt}-{min(n_lines, nxt + k - 1)}"
                if nxt <= n_lines and fits(text := f"{';'.join(steps[:k])}\n{more}"):
                    return text
        return f"SUBMIT {sums[-1]}"  # no room to write it out: the answer alone

    def _deliver(self, v: View, work: str, value: int) -> str:
        if v.me == 0:
            return f"{work}\nSUBMIT {value}" if work else f"SUBMIT {value}"
        parent = v.org.get(v.me, ("", 0, ""))[1]
        return f"POST @agent{parent} {work or value}\nDONE"

    def _verify(self, v: View, rng: random.Random) -> str:
        """Check the worker the brief names (`check @agent3`), or the worker whose brief is the same
        file part as this verifier's (`HIRE 4 verifier: task.txt` hires one per part)."""
        targets = [int(t) for t in re.findall(r"@agent(\d+)", v.text)]
        if not targets and (refs := find_refs(v.text, 1)):
            parent = v.org.get(v.me, ("", 0, ""))[1]
            targets = [i for i, (role, p, brief) in sorted(v.org.items())
                       if role == "worker" and p == parent and brief == str(refs[0])][-1:]
        if not targets or targets[0] not in v.org:
            return "DONE"
        target = targets[0]
        terms, claim = (terms_of(v.part) if v.part else terms_of(v.org[target][2])), claim_of(v, target)
        if not terms:
            return "WAIT"
        if claim is None:  # the worker has not posted yet: add the part meanwhile, the result in the working
            return "WAIT" if v.working else f"{chain(terms, rng, self.verifier_error_rate)[1]}\nWAIT"
        parent = v.org.get(v.me, ("", 0, ""))[1]
        claimed = f"{render_sum(terms)}={claim}"
        if rng.random() < self.rubber_stamp:
            return f"POST @agent{parent} APPROVE {claimed}\nDONE"
        if (mine := own_result(v.working, terms)) is not None:  # added last turn: compare, nothing to redo
            work, value = "", mine
        else:
            value, work = chain(terms, rng, self.verifier_error_rate)
        verdict = "APPROVE" if value == claim else "REJECT"
        return f"{work}\nPOST @agent{parent} {verdict} {claimed}\nDONE".lstrip("\n")

    def _manage(self, v: View, terms: list[int], rng: random.Random, max_new: int = 1 << 30) -> str:
        span = v.span()
        if span is not None and span[1] - span[0] + 1 == len(terms):
            return self._manage_flat(v, terms, span, rng, max_new)
        hires: list[str] = []
        values: list[int | None] = []
        work: list[str] = []
        planned = v.n_agents
        for part in tree_split(terms):
            if len(part) == 1:
                values.append(part[0])
                continue
            value, act = self._part(v, part, planned)
            if act == "self":
                value, steps = chain(part, rng, self.error_rate)
                work.append(steps)
            elif act:
                hires.append(act)
                planned += 1
            values.append(value)
        if all(x is not None for x in values):
            total = add(values[0], values[1], rng, self.error_rate)
            work.append(f"{render_sum(values)}={total}")
            return self._deliver(v, ";".join(work), total)
        # a part done by hand waits for the final turn: no memory between turns, so work written
        # while still waiting for the other part would be thrown away
        out = [f"HIRE {h}" for h in hires]
        return "\n".join(out) if out else "WAIT"

    def _manage_flat(self, v: View, terms: list[int], span: tuple[int, int], rng: random.Random,
                     max_new: int) -> str:
        """With the task as a file: ONE `HIRE <k> worker: <part>` splits this manager's lines into k
        consecutive parts (k = flat_parts), then each part goes as in the tree (verified, re-hired after
        a REJECT), and the results are added left to right. Which parts exist is read back from the
        org chart (the workers' briefs), so nothing is remembered between turns. A part the manager
        adds itself (no room to re-hire after a REJECT) is written out when the turn holds it, else only
        the total is delivered."""
        path = v.task_file[0]
        mine = [find_refs(brief, 1) for i, (role, parent, brief) in sorted(v.org.items())
                if parent == v.me and role == "worker"]
        parts = sorted({r[0] for r in mine if r and r[0].path == path and span[0] <= r[0].first <= r[0].last <= span[1]},
                       key=lambda r: r.first)
        if not parts:
            room = v.max_agents - v.n_agents
            k = min(flat_parts(len(terms)), room)
            if "HIRE" not in v.actions or v.depth + 1 > v.max_depth or k < 2:
                value, work = chain(terms, rng, self.error_rate)
                return self._deliver(v, work, value)
            whole = path if span == (1, v.task_file[1]) else str(Ref(path, *span))
            if self.style == "verify" and 2 * k <= room:  # a checker per part, hired in the same turn
                return f"HIRE {k} worker: {whole}\nHIRE {k} verifier: {whole}"
            return f"HIRE {k} worker: {whole}"
        planned, values, hires, work = v.n_agents, [], [], []
        for ref in parts:
            part = terms[ref.first - span[0]: ref.last - span[0] + 1]
            value, act = self._part(v, part, planned, (ref.first, ref.last))
            if act == "self":
                value, steps = chain(part, rng, self.error_rate)
                work.append(steps)
            elif act:
                hires.append(act)
                planned += 1
            values.append(value)
        if all(x is not None for x in values):
            total, steps = chain(values, rng, self.error_rate)
            text = self._deliver(v, ";".join([*(w for w in work if w), steps]), total)
            return text if self.len_fn(text) <= max_new else self._deliver(v, steps, total)
        return "\n".join(f"HIRE {h}" for h in hires) if hires else "WAIT"

    def _part(self, v: View, part: list[int], planned: int, where: tuple[int, int] | None = None) -> tuple[int | None, str]:
        """(value if known, what to do: '' wait, 'self' compute it, or a `role: brief` to hire).
        `where`: the part's task-file lines, named in the brief instead of the terms when known."""
        expr = render_sum(part) if where is None else str(Ref(v.task_file[0], *where))
        kids = [i for i, (role, parent, brief) in sorted(v.org.items())
                if parent == v.me and role in ("worker", "lead")
                and (terms_of(brief) == part if where is None else brief == expr)]
        can_hire = "HIRE" in v.actions and v.depth + 1 <= v.max_depth
        if not kids:
            if not can_hire or planned >= v.max_agents:
                return None, "self"
            lead_ok = len(part) > 2 and "lead" in v.roles and v.depth + 2 <= v.max_depth
            return None, f"{'lead' if lead_ok else 'worker'}: {expr}"
        kid = kids[-1]
        claim = claim_of(v, kid)
        if self.style != "verify" or v.org[kid][0] != "worker":
            return claim, ""
        checkers = [i for i, (role, parent, brief) in sorted(v.org.items())
                    if parent == v.me and role == "verifier" and (f"@agent{kid}" in brief.split()[1:2] or (brief == expr and i > kid))]
        if not checkers:
            if planned >= v.max_agents:  # no room for a verifier: take the worker's word
                return claim, ""
            return None, f"verifier: check @agent{kid}" + ("" if where is None else f" {expr}")
        verdict = verdict_of(v, checkers[-1])
        if verdict == "APPROVE" and claim is not None:
            return claim, ""
        if verdict == "REJECT":
            return None, (f"worker: {expr}" if planned < v.max_agents else "self")
        return None, ""


@dataclass
class Replay:
    """A policy that replays fixed texts by (agent, round), `default` otherwise: hand-built episodes
    for tests and examples. Calls are counted (`calls`, `requests`) to check the batching."""

    script: dict[tuple[int, int], str]
    default: str = "WAIT"
    calls: int = 0
    requests: list[list[Request]] = field(default_factory=list)

    def generate_batch(self, requests: Sequence[Request]) -> list[Generation]:
        self.calls += 1
        self.requests.append(list(requests))
        return [Generation(self.script.get((r.agent, r.round), self.default)) for r in requests]
