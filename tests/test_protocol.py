"""The action protocol: examples of every action, errors as data, and two hypothesis properties."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rlcr.org.protocol import (
    KEYWORDS,
    Action,
    mentions,
    one_line,
    parse_turn,
    quote_block,
    render_action,
    render_actions,
    validate_action,
)


def test_every_action_parses():
    text = "\n".join([
        "POST @agent0 68+57=125",
        "HIRE worker: add 68+57",
        "READ notes/a.txt",
        "RUN ./main.py",
        "SUBMIT 204",
        "WAIT",
        "DONE",
        "WRITE out.txt first line",
        "second line",
        "SUBMIT this is content, not an action",
    ])
    p = parse_turn(text)
    assert p.errors == ()
    assert [a.kind for a in p.actions] == ["POST", "HIRE", "READ", "RUN", "SUBMIT", "WAIT", "DONE", "WRITE"]
    assert p.actions[1] == Action("HIRE", "worker", "add 68+57")
    assert p.actions[3].arg == "main.py"  # ./ is normalised away
    assert p.actions[-1].body == "first line\nsecond line\nSUBMIT this is content, not an action"


def test_free_text_is_thinking_not_an_error():
    p = parse_turn("68+57=125;125+42=167\nlet me submit\nSUBMIT 167")
    assert p.actions == (Action("SUBMIT", "167"),)
    assert p.errors == ()
    assert p.thinking == "68+57=125;125+42=167\nlet me submit"


def test_keyword_with_colon_and_indent_is_accepted():
    assert parse_turn("  SUBMIT: 42").actions == (Action("SUBMIT", "42"),)


def test_errors_are_data():
    cases = {
        "FOO bar": "unknown action",
        "HIRE worker": "HIRE needs",
        "HIRE Big Boss: x": "not a lowercase word",
        "READ ../secret": "component",
        "READ /etc/passwd": "absolute",
        "WAIT now": "takes no argument",
        "POST": "needs text",
        "READ a.txt b.txt": "takes only a path",
        "just chatting": "no action",
        "": "no action",
    }
    for text, why in cases.items():
        p = parse_turn(text)
        assert p.malformed, text
        assert any(why in e for e in p.errors), (text, p.errors)


def test_too_many_actions_are_dropped_and_counted():
    p = parse_turn("\n".join(["WAIT"] * 12), max_actions=8)
    assert len(p.actions) == 8
    assert len(p.errors) == 4 and p.malformed


def test_non_text_completion_is_an_error():
    assert parse_turn(None).malformed
    assert parse_turn(b"SUBMIT 3").actions == (Action("SUBMIT", "3"),)


def test_mentions_and_safe_rendering():
    assert mentions("@agent2 and @agent10, again @agent2; not @agentX or @agent3x") == (2, 10)
    s = one_line("hi\nSUBMIT 5\r\n[#9 agent0 ceo] <|im_start|>system\u2028x")
    assert "\n" not in s and "[" not in s and "<|" not in s and "\u2028" not in s
    assert all(line.startswith("| ") for line in quote_block("a\nSUBMIT 3\n<|endoftext|>"))


# ------------------------------------------------------------------------------- properties

_one_line = st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), min_size=1, max_size=40).map(str.strip).filter(bool)
_path_part = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,10}", fullmatch=True)
_path = st.lists(_path_part, min_size=1, max_size=3).map("/".join)
_role = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)
_body = st.text(st.characters(blacklist_categories=("Cs",)), max_size=80)

_actions = st.one_of(
    st.builds(Action, st.just("POST"), _one_line),
    st.builds(Action, st.just("SUBMIT"), _one_line),
    st.builds(Action, st.just("HIRE"), _role, _one_line),
    st.builds(Action, st.just("HIRE"), _role, _one_line, st.integers(0, 20)),
    st.builds(Action, st.sampled_from(["READ", "RUN"]), _path),
    st.builds(Action, st.just("WRITE"), _path, _body),
    st.builds(Action, st.sampled_from(["WAIT", "DONE"])),
)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_never_crashes_the_parser(text):
    p = parse_turn(text)
    assert isinstance(p.errors, tuple) and isinstance(p.actions, tuple)
    assert all(a.kind in KEYWORDS and validate_action(a) is None for a in p.actions)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["POST hi", "HIRE x: y", "WRITE a\n", "READ ..", "FOO", "\r", "\x00", "SUBMIT",
                                 "@agent1", "DONE ", "\u2028", "<|im_end|>", "WAIT\nWAIT"]), max_size=12).map("".join))
def test_protocol_shaped_garbage_never_crashes_the_parser(text):
    parse_turn(text)


@settings(max_examples=300, deadline=None)
@given(_actions)
def test_render_then_parse_gives_the_action_back(action):
    if validate_action(action) is not None:  # only canonical actions have a canonical text
        return
    p = parse_turn(render_action(action))
    assert p.errors == ()
    assert p.actions == (action,)


@settings(max_examples=200, deadline=None)
@given(st.lists(_actions.filter(lambda a: a.kind != "WRITE" and validate_action(a) is None), min_size=1, max_size=5),
       st.one_of(st.none(), _actions.filter(lambda a: a.kind == "WRITE" and validate_action(a) is None)))
def test_render_then_parse_a_whole_turn(actions, write):
    actions = actions + ([write] if write else [])
    assert parse_turn(render_actions(actions), max_actions=8).actions == tuple(actions)


def test_file_parts_named_in_text():
    from rlcr.org.protocol import Ref, find_refs

    assert find_refs("add task.txt:1-8 then notes/a.txt:3") == (Ref("task.txt", 1, 8), Ref("notes/a.txt", 3, 3))
    assert str(Ref("task.txt", 3, 3)) == "task.txt:3" and str(Ref("task.txt", 1, 8)) == "task.txt:1-8"
    assert find_refs("../etc:1-2 task.txt:5-2 task.txt:0 12:30 x.txt:1-2x") == ()  # bad path, backwards, 0, times
    assert find_refs("a:1 a:1 b:1 c:1 d:1 e:1") == (Ref("a", 1, 1), Ref("b", 1, 1), Ref("c", 1, 1), Ref("d", 1, 1))


def test_hire_with_a_count():
    from rlcr.org.protocol import MAX_HIRES

    p = parse_turn("HIRE 4 worker: task.txt\nHIRE 1 verifier: check @agent1")
    assert p.errors == ()
    assert p.actions == (Action("HIRE", "worker", "task.txt", 4), Action("HIRE", "verifier", "check @agent1"))
    assert render_action(p.actions[0]) == "HIRE 4 worker: task.txt" and p.actions[0].to_dict()["count"] == 4
    assert "count" not in p.actions[1].to_dict()  # a plain hire's record is what it always was
    for bad in ("HIRE 0 worker: x", f"HIRE {MAX_HIRES + 1} worker: x", "HIRE 99999 worker: x"):
        assert parse_turn(bad).errors == (f"line 1: HIRE <n> <role>: n is a whole number from 2 to {MAX_HIRES}",), bad
    assert parse_turn("HIRE 3: x").errors and parse_turn("HIRE 3 Worker!: x").errors
    assert validate_action(Action("POST", "hi", count=2)) is not None
    assert validate_action(Action("HIRE", "worker", "x", MAX_HIRES)) is None


def test_split_lines_into_near_equal_consecutive_parts():
    import pytest

    from rlcr.org.protocol import split_lines

    assert split_lines(1, 10, 3) == [(1, 4), (5, 7), (8, 10)]
    assert split_lines(5, 8, 4) == [(5, 5), (6, 6), (7, 7), (8, 8)]
    assert split_lines(1, 16, 4) == [(1, 4), (5, 8), (9, 12), (13, 16)]
    for first, last, n in [(1, 1, 1), (3, 40, 7), (2, 9, 8)]:
        parts = split_lines(first, last, n)
        sizes = [b - a + 1 for a, b in parts]
        assert parts[0][0] == first and parts[-1][1] == last and max(sizes) - min(sizes) <= 1
        assert all(parts[i][1] + 1 == parts[i + 1][0] for i in range(n - 1))
    with pytest.raises(ValueError, match="cannot split lines 1-3 into 4 parts"):
        split_lines(1, 3, 4)
