"""Anti-hacking checks that run before any equivalence test.

- several different final answers (hedging);
- one final answer that lists candidates ("2 or 3", "1, 2, 3, 4") when the gold is a single value;
- expressions that are costly to evaluate (towers of powers, huge numbers, deep nesting):
  compared as text only, never handed to a symbolic engine.
"""

from __future__ import annotations

import re

from tasks.verifiers.forms import assignment
from tasks.verifiers.numbers import MODIFIERS, parse_number, strip_noise

MAX_ANSWER_CHARS = 300
MAX_NESTING = 12
MAX_DIGITS = 200
MAX_POWERS = 20
_CANDIDATE_SEPARATORS = re.compile(r"\bor\b|\band/or\b|\\lor|;|\\\\|\\quad|\\qquad")
_RELATION = re.compile(r"\\(?:neq?|leq?|geq?|lt|gt|approx|sim|simeq|equiv|propto|in)\b|[=<>≠≤≥≈∈]")


def canonical(answer: str) -> str:
    """A key under which equal-looking answers collide: numbers by value, the rest by their text."""
    number = parse_number(answer)
    if number is not None:
        return f"number:{number.value}{'%' if number.percent else ''}"
    return "text:" + re.sub(r"\s+", "", strip_noise(answer))


def lists_candidates(answer: str, gold: str) -> bool:
    """True when a single-valued gold is answered with several values."""
    if parse_number(gold) is None:
        return False  # tuples, sets, expressions: no such rule
    if _CANDIDATE_SEPARATORS.search(answer.replace("{,}", ",")):
        return True
    cleaned = strip_noise(answer).strip("{}()[] \\")
    parts = [p for p in re.split(r",", cleaned) if p.strip()]
    if len(parts) < 2:
        return False
    return parse_number(answer) is None  # "1,234" is one number, "1, 2, 3" is three


def qualifies(answer: str, gold: str) -> str | None:
    """Why the answer says something other than a value: a relation (≠ 2, > 2, 3 = 2) or words that
    change the number (not 2, at least 2, 2 million) that the gold does not have."""
    named = assignment(answer)  # "x = 5", "(x, y) = (5, 8)" name a value
    bare_answer = named[1] if named else answer
    if _RELATION.search(bare_answer) and not _RELATION.search(gold):
        return "a relation where a value is asked"
    words = {w.lower() for w in re.findall(r"[A-Za-z]{2,}", re.sub(r"\\[a-zA-Z]+", " ", answer))}
    gold_words = {w.lower() for w in re.findall(r"[A-Za-z]{2,}", gold)}
    changed = (words & MODIFIERS) - gold_words
    if changed:
        return f"words that change the value: {', '.join(sorted(changed))}"
    return None


def costly(answer: str) -> str | None:
    """Why an expression is too costly to evaluate symbolically, or None."""
    if len(answer) > MAX_ANSWER_CHARS:
        return f"answer longer than {MAX_ANSWER_CHARS} characters"
    depth = deepest = 0
    for char in answer:
        depth += {"{": 1, "(": 1, "[": 1, "}": -1, ")": -1, "]": -1}.get(char, 0)
        deepest = max(deepest, depth)
    if deepest > MAX_NESTING:
        return f"nesting deeper than {MAX_NESTING}"
    if any(len(run) > MAX_DIGITS for run in re.findall(r"\d+", answer)):
        return f"a number with more than {MAX_DIGITS} digits"
    if (
        answer.count("^") + answer.count("**") > MAX_POWERS
        or re.search(r"\^\s*\{[^{}]*\^", answer)
        or re.search(r"\^\s*\d+\s*\^", answer)
    ):
        return "a tower of powers"
    if re.search(r"\d[eE][-+]?\d{4,}", answer):
        return "an exponent of more than 3 digits"
    if re.search(r"\d{3,}\s*!|!\s*!", answer):
        return "a large factorial"
    return None
