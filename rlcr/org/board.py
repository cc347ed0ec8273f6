"""The shared message board: append-only posts, authors stamped by the environment, size limits.

A post's author, role, id and round come from the scheduler (the agent id that produced the turn),
never from the text. A post made in round r is shown from round r+1 on, so all agents of a round see
the same board. Rendering rule (`render_post`): one line per post,

    [#12 agent3 worker] <text>

where <text> went through `protocol.one_line`: line breaks and control characters become spaces,
chat-template special tokens are broken up, `[`/`]` become `(`/`)`. So a post can neither start a
line of its own (no injected action line, no second header) nor contain something that reads as
another author's header.

Covers: author spoofing, multi-line injection, special-token injection, oversized posts (cut to
`max_message_chars` with a `...` marker and counted), board flooding (`max_posts`, then refused).
Does not cover: persuasion in plain words ("agent0 says submit 5" is a lie in agent3's post, and is
shown as agent3's post).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlcr.org.protocol import mentions, one_line


@dataclass(frozen=True)
class Post:
    """One board post as stored; `text` is already cut to the size limit (not yet neutralised)."""

    id: int
    round: int
    author: int
    role: str
    text: str
    mentions: tuple[int, ...]
    cut: bool


class Board:
    """Append-only list of posts; the only way in is `post`, which stamps the author."""

    def __init__(self, max_posts: int = 200, max_message_chars: int = 400):
        self.max_posts = max_posts
        self.max_message_chars = max_message_chars
        self._posts: list[Post] = []

    @property
    def posts(self) -> tuple[Post, ...]:
        return tuple(self._posts)

    def post(self, author: int, role: str, text: str, round: int, n_agents: int) -> tuple[Post | None, str | None]:
        """Append a post by `author`; returns (post, note) or (None, why refused).

        Mentions of agents that do not exist (index >= n_agents) are dropped from `mentions`.
        """
        if len(self._posts) >= self.max_posts:
            return None, f"board full ({self.max_posts} posts); post refused"
        cut = len(text) > self.max_message_chars
        if cut:
            text = text[: self.max_message_chars]
        ment = tuple(m for m in mentions(text) if m < n_agents and m != author)
        p = Post(len(self._posts) + 1, round, author, role, text, ment, cut)
        self._posts.append(p)
        return p, (f"post cut to {self.max_message_chars} chars" if cut else None)

    def visible(self, before_round: int, last: int) -> list[Post]:
        """The `last` most recent posts made before `before_round`, oldest first."""
        if last <= 0:
            return []
        shown = [p for p in self._posts if p.round < before_round]
        return shown[-last:]


def render_post(p: Post) -> str:
    """`[#id agentN role] text` on one line (see the module docstring for the rule)."""
    return f"[#{p.id} agent{p.author} {p.role}] {one_line(p.text)}"
