"""Math answers compared by value with Hugging Face's math-verify: `1/2` = `0.5` = `\\frac{1}{2}`.

`math_equal(answer, reference)` is what the JSONL and reasoning-gym families grade a math answer
with (the built-in sums keep `numbers_equal`: integers, compared exactly as they always were):

1. both plain numbers (`42`, `42.0`, `4.2e1`, `1,234`): exact decimal equality, `numbers_equal`;
2. else both parsed by math-verify (LaTeX or plain expressions: fractions, `\\frac`, `\\sqrt`,
   `\\boxed{...}`, `$...$`) and compared by math-verify's `verify` (sympy: symbolic, then numeric to
   6 decimals).

math-verify is an EXTRACTION library: by itself it grades `3 or 42` right for 42 (the last number)
and `42x` right for 42. A reward must not pay for a guess among several, so here an answer goes to
math-verify only when it is ONE expression (after taking off `$`, `\\boxed{}` and a final `.`): no
words or variables, no `=`, no list, brackets balanced. It never raises: anything math-verify
cannot read is wrong. Its timeouts use SIGALRM, which only the main thread has, so off the main
thread (and for answers over `MAX_CHARS`) only step 1 applies: a hostile answer such as `9^9^9^9`
can never hang a rollout.
"""

from __future__ import annotations

import re
import threading

from rlcr.tasks.base import numbers_equal

MAX_CHARS = 64
"""Longer answers are compared as plain numbers only (a math answer is short; sympy is not cheap)."""
TIMEOUT_S = 1
"""math-verify's own limit on parsing each side and on the comparison."""

_WRAPPERS = (re.compile(r"^\$+(.*?)\$+$", re.DOTALL), re.compile(r"^\\boxed\{(.*)\}$", re.DOTALL))
_LATEX = re.compile(r"\\(?:[dt]?frac|sqrt|pi|cdot|times|div|left|right)(?![A-Za-z])")


def _bare(text: str) -> str:
    """The answer without outer white space, `$...$`, `\\boxed{...}` and a final `.`."""
    s, changed = text.strip(), True
    while changed:
        changed = False
        s = s.rstrip(".").strip()
        for wrapper in _WRAPPERS:
            m = wrapper.match(s)
            if m:
                s, changed = m.group(1).strip(), True
    return s


def _one_expression(bare: str) -> bool:
    """Whether `bare` is ONE math expression: no words, variables, equations or lists (`3 or 42`,
    `42x`, `x=42`, `42 43`, `1, 2`), brackets balanced. What math-verify would pick out of more."""
    if not bare or re.search(r"[\d.]\s+[\d.]", bare):
        return False
    rest = _LATEX.sub("", bare)
    if re.search(r"[A-Za-z=;:<>!?|&\\]", rest) or re.search(r",(?!\d{3}(?!\d))", rest):
        return False
    for o, c in ("()", "{}", "[]"):
        depth = 0
        for ch in rest:
            depth += (ch == o) - (ch == c)
            if depth < 0:
                return False
        if depth:
            return False
    return True


def _parse_whole(text: str):
    """math-verify's reading of `text` when `text` is one expression, else None."""
    from math_verify import parse

    bare = _bare(text)
    if not _one_expression(bare):
        return None
    found = parse(f"${bare}$" if "\\" in bare else bare, parsing_timeout=TIMEOUT_S)
    return found if len(found) == 2 else None


def math_equal(answer: str, reference: str) -> bool:
    """True when `answer` has the value of `reference` (module docstring: the two steps, the guards)."""
    if not isinstance(answer, str) or not isinstance(reference, str):
        return False
    if numbers_equal(answer, reference):
        return True
    if (not answer.strip() or len(answer) > MAX_CHARS or len(reference) > MAX_CHARS
            or threading.current_thread() is not threading.main_thread()):
        return False
    try:
        from math_verify import verify

        gold, got = _parse_whole(reference), _parse_whole(answer)
        return bool(gold and got and verify(gold, got, timeout_seconds=TIMEOUT_S))
    except Exception:  # noqa: BLE001 - whatever math-verify or sympy raises on a hostile answer, it is wrong
        return False


def is_math(reference: str) -> bool:
    """Whether a reference answer is math that `math_equal` can compare (a number, `1/2`, `\\frac{1}{2}`)."""
    from rlcr.tasks.base import parse_number

    if parse_number(reference) is not None:
        return True
    if not isinstance(reference, str) or len(reference) > MAX_CHARS or not re.search(r"\d", reference):
        return False
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        return _parse_whole(reference) is not None
    except Exception:  # noqa: BLE001 - not math then
        return False
