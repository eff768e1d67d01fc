"""Finding the final answer in a response: the last `\\boxed{}`, a GSM8K `#### N` line, or a closing
"the answer is N". Also every final-answer statement, so that hedging can be caught."""

from __future__ import annotations

import re

from tasks.curation.layouts import last_boxed

HASH_LINE = re.compile(r"^\s*####\s*(.+?)\s*$", re.MULTILINE)
ANSWER_IS = re.compile(r"(?:final answer|the answer)\s*(?:is|:)\s*:?\s*\$?([^\n]+?)\$?\s*(?:\.\s*)?$",
                       re.IGNORECASE | re.MULTILINE)
EXTRACTORS = ("boxed", "hash", "answer_is")


def all_boxed(text: str) -> list[str]:
    """Contents of every outermost `\\boxed{...}` / `\\fbox{...}`, in order, braces balanced. Linear in the
    text: a box nested inside another is part of the outer one's content (where the "box inside a box" rule
    sees it), not a statement of its own, so no character is copied twice."""
    closing: dict[int, int] = {}
    stack: list[int] = []
    for position, char in enumerate(text):
        if char == "{":
            stack.append(position)
        elif char == "}" and stack:
            closing[stack.pop()] = position
    found, covered_until = [], -1
    for match in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        start = match.end() - 1
        if start in closing and match.start() > covered_until:
            found.append(text[start + 1:closing[start]].strip())
            covered_until = closing[start]
    return found


def final_answers(text: str, extractors: tuple[str, ...] = EXTRACTORS) -> list[tuple[str, str]]:
    """Every final-answer statement as (extractor, answer), in the order of `extractors`."""
    statements: list[tuple[str, str]] = []
    for extractor in extractors:
        if extractor == "boxed":
            statements += [("boxed", b) for b in all_boxed(text)]
        elif extractor == "hash":
            statements += [("hash", m.group(1)) for m in HASH_LINE.finditer(text)]
        elif extractor == "answer_is":            # "the answer is \boxed{7}" is the boxed statement, not another one
            statements += [("answer_is", m.group(1).strip().rstrip(".")) for m in ANSWER_IS.finditer(text[-400:])
                           if "\\boxed" not in m.group(1) and "\\fbox" not in m.group(1)]
        else:
            raise ValueError(f"unknown extractor {extractor!r}; use {EXTRACTORS}")
    return [(kind, answer) for kind, answer in statements if answer]


def extract_answer(text: str, extractors: tuple[str, ...] = EXTRACTORS) -> tuple[str | None, str | None]:
    """(answer, extractor): the last statement of the first extractor that finds one."""
    for extractor in extractors:
        found = final_answers(text, (extractor,))
        if found:
            return found[-1][1], extractor
    return None, None


__all__ = ["all_boxed", "extract_answer", "final_answers", "last_boxed", "EXTRACTORS"]
