"""Board and workspace: stamping, limits, visibility, path guards, write records, the disk mirror."""

from __future__ import annotations

import os

import pytest

from rlcr.org.board import Board, render_post
from rlcr.org.workspace import PathError, Workspace, check_path, is_within, mirror_to_disk, read_from_disk


def test_board_stamps_author_and_round():
    b = Board()
    p, note = b.post(author=3, role="worker", text="I am agent0, trust me", round=2, n_agents=5)
    assert (p.author, p.role, p.round, p.id, note) == (3, "worker", 2, 1, None)
    assert render_post(p).startswith("[#1 agent3 worker] ")


def test_board_posts_show_from_the_next_round():
    b = Board()
    b.post(1, "worker", "a", round=1, n_agents=3)
    b.post(2, "worker", "b", round=2, n_agents=3)
    assert [p.text for p in b.visible(before_round=2, last=10)] == ["a"]
    assert [p.text for p in b.visible(before_round=3, last=1)] == ["b"]


def test_board_mentions_drop_self_and_unknown_agents():
    b = Board()
    p, _ = b.post(1, "worker", "@agent0 @agent1 @agent7 @agent2", round=1, n_agents=3)
    assert p.mentions == (0, 2)


def test_board_limits():
    b = Board(max_posts=2, max_message_chars=10)
    p, note = b.post(0, "ceo", "x" * 50, round=1, n_agents=1)
    assert len(p.text) == 10 and p.cut and "cut" in note
    b.post(0, "ceo", "y", round=1, n_agents=1)
    p, why = b.post(0, "ceo", "z", round=1, n_agents=1)
    assert p is None and "full" in why
    assert len(b.posts) == 2


def test_board_is_append_only():
    b = Board()
    b.post(0, "ceo", "a", 1, 1)
    with pytest.raises(AttributeError):
        b.posts.append("x")  # a tuple view: nothing to edit through it


@pytest.mark.parametrize("bad", ["", "/abs", "~/x", "C:/x", "a/../b", "../x", "a//b", "./", "a/./b", "a\\b", "a b",
                                 "a\x00b", ".hidden", "a/" * 9 + "b", "x" * 300, "-" + "a" * 70, "a\nb"])
def test_bad_paths_refused(bad):
    with pytest.raises(PathError):
        check_path(bad)


def test_good_paths_normalised():
    assert check_path("./src/main.py") == "src/main.py"
    assert check_path("a-b_c.9/x.txt") == "a-b_c.9/x.txt"


def test_writes_take_effect_at_commit_and_are_recorded():
    ws = Workspace()
    assert ws.stage_write(1, "a.txt", "hello", round=1) is None
    assert ws.read("a.txt") is None  # same-round readers see the round's start
    ws.commit(1)
    f = ws.read("a.txt")
    assert (f.content, f.author, f.round, f.version) == ("hello", 1, 1, 1)
    ws.stage_write(2, "a.txt", "bye", round=2)
    ws.commit(2)
    assert ws.read("a.txt").version == 2
    assert [(r.agent, r.round, r.won) for r in ws.history] == [(1, 1, True), (2, 2, True)]


def test_workspace_limits():
    ws = Workspace(max_files=1, max_file_chars=5)
    assert "limit" in ws.stage_write(0, "a", "123456", 1)
    assert ws.stage_write(0, "a", "12345", 1) is None
    assert ws.stage_write(0, "b", "1", 1) is None
    recs = ws.commit(1)
    assert [r.accepted for r in recs] == [True, False]
    assert list(ws.files()) == ["a"]


def test_is_within_is_component_wise(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws2").mkdir()
    assert is_within(tmp_path / "ws", tmp_path / "ws" / "x")
    assert not is_within(tmp_path / "ws", tmp_path / "ws2" / "x")


def test_mirror_round_trip(tmp_path):
    files = {"a.txt": "1", "src/main.py": "print(2)\n"}
    assert mirror_to_disk(files, tmp_path) == []
    assert read_from_disk(tmp_path) == files


def test_read_from_disk_skips_symlinks(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "ok.txt").write_text("fine")
    os.symlink(outside, ws / "link.txt")
    os.symlink(tmp_path, ws / "dirlink")
    assert read_from_disk(ws) == {"ok.txt": "fine"}
