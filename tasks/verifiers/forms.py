"""The shape of an answer, before any arithmetic: text answers (choice letters, words), assignments
(`x = 5`, `(p, q) = (3, 2)`), and structured answers (tuples, intervals, sets, lists of parts).

A text answer is compared as text and nothing else: a word never reaches a symbolic engine (which
would read "odd" as o·d·d), and no answer reduces to an empty string that then matches another.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TEXT_COMMAND = re.compile(
    r"\\(?:text|textbf|textit|textrm|texttt|mathrm|mathbf|mathit|mathsf|mbox|operatorname)"
    r"\s*\{([^{}]*)\}"
)
_CHOICE = re.compile(r"^\(?\s*([A-Ea-e])\s*\)?[.:]?$")
_PARENS_CHOICE = re.compile(r"^\(\s*[A-Ea-e]\s*\)|^[A-Ea-e]\)")
_WORDS = re.compile(r"^[A-Za-z][A-Za-z' \-]*[A-Za-z.]?$")
_SPACING = re.compile(r"(?<!\\)\\[,;:! ]|\\q?quad|~|\\displaystyle|\\(?:left|right)(?:\.|(?=[(\[{|)\]}\\<>]))")
_SEPARATORS = re.compile(r"\\text\{\s*(?:and|or|,)\s*\}|\\q?quad|\band\b|\bor\b|;")
_GROUPED_NUMBER = re.compile(r"^[-+]?\d{1,3}(?:(?:,|\{,\})\d{3})+(?:\.\d+)?$")
_MATRIX = re.compile(r"^\\begin\{([pbvBV]?matrix|array)\}(?:\{[^{}]*\})?(.*)\\end\{\1\}$", re.DOTALL)
_ASSIGNED = re.compile(r"^\s*(.+?)\s*(?:(?<![<>!\\])=(?!=)|\\in\b|∈)\s*(.+?)\s*$", re.DOTALL)
_LABEL = re.compile(
    r"^(?:[A-Za-z](?:_\{?[\w,]+\}?)?'*|[A-Za-z]+\([a-z](?:,\s*[a-z])*\)|\|[A-Za-z]+\||"
    r"\([A-Za-z](?:\s*,\s*[A-Za-z])+\)|\\[a-zA-Z]+(?:_\{?\w+\}?)?|[A-Za-z](?:_\{?\w+\}?)?\s*:\s*"
    r"[A-Za-z](?:_\{?\w+\}?)?|\\[dt]?frac\{[A-Za-z]+\}\{[A-Za-z]+\})$"
)


def unwrap_text(text: str) -> str:
    """`\\text{…}`, `\\mathrm{…}` and their kin replaced by their contents, `$` removed."""
    previous = None
    while previous != text:
        previous, text = text, _TEXT_COMMAND.sub(lambda m: m.group(1), text)
    return text.replace("$", "").strip()


def choice_letter(text: str) -> str | None:
    """The letter of a multiple-choice answer: `(B)`, `\\text{(B)}`, `\\textbf{B}`, `B)`, `B`."""
    match = _CHOICE.match(unwrap_text(text).strip())
    return match.group(1) if match else None


def is_parenthesised_choice(text: str) -> bool:
    return bool(_PARENS_CHOICE.match(unwrap_text(text).strip()))


def word_answer(text: str) -> str | None:
    """A word answer normalised (case, text commands, punctuation, spacing), or None when the answer is not
    words: it holds digits, operators or a LaTeX command."""
    plain = unwrap_text(text).strip().rstrip(".").strip()
    if "\\" in plain or not _WORDS.match(plain) or not re.search(r"[A-Za-z]{2}", plain):
        return None
    return " ".join(re.sub(r"[^a-z' \-]", " ", plain.lower()).split()) or None


def clean(text: str) -> str:
    """Spacing commands, `\\left.` / `\\right.`, display style and surrounding `$` removed."""
    text = re.sub(r"(?<=\d),\\!\s*(?=\d)", ",", text.strip().strip("$"))  # 12,\!000: a thousands comma
    return _SPACING.sub(" ", text).strip()


def assignment(text: str) -> tuple[str, str] | None:
    """(label, value) when the answer names what it gives: `x = 5`, `k=1`, `f(x) = 1`, `(p,q)=(3,2)`,
    `|AB| = 1`, `V_1:V_2 = 11:21`, `\\frac{NO}{BO} = …`; None for an equation between expressions."""
    match = _ASSIGNED.match(text)
    if not match or "=" in match.group(2):
        return None
    label = clean(match.group(1))
    return (label, match.group(2)) if _LABEL.match(label) else None


@dataclass(frozen=True)
class Structure:
    kind: str  # tuple, interval, set, list, matrix
    opening: str
    closing: str
    parts: tuple[str, ...]


def split_top_level(text: str, separators: re.Pattern[str] | str = ",") -> list[str]:
    """`text` split at separators that are not inside brackets or braces."""
    pattern = re.compile(re.escape(separators)) if isinstance(separators, str) else separators
    parts, depth, start, position = [], 0, 0, 0
    while position < len(text):
        char = text[position]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        elif depth == 0:
            match = pattern.match(text, position)
            if match and match.end() > position:
                parts.append(text[start:position])
                start = position = match.end()
                continue
        position += 1
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


def _balanced(text: str) -> bool:
    """Whether the first character's bracket closes at the very end (`(1,2)` yes, `(1,2),(3,4)` no)."""
    depth = 0
    for position, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0 and position != len(text) - 1:
                return False
    return depth == 0


def structure(text: str) -> Structure | None:
    """The answer's structure, or None for a single value."""
    text = clean(text)
    matrix = _MATRIX.match(text)
    if matrix and "\\begin" in matrix.group(2):
        return None  # several matrices: an expression
    if matrix:
        rows = [split_top_level(row, "&") for row in re.split(r"\\\\", matrix.group(2)) if row.strip()]
        if rows and (len(rows) == 1 or all(len(row) == 1 for row in rows)):  # a vector is a tuple
            return Structure("tuple", "(", ")", tuple(cell for row in rows for cell in row))
        return Structure("matrix", "[", "]", tuple(" & ".join(row) for row in rows))
    if _GROUPED_NUMBER.match(text):
        return None  # 1,234 is one number
    groups, separated = split_top_level(text, _SEPARATORS), []
    for group in groups:  # "p=5,q=2; p=7,q=2": each group of assignments is one tuple
        items = split_top_level(group)
        named = [assignment(item) for item in items]
        if len(groups) > 1 and len(items) > 1 and all(named):
            separated.append("(" + ", ".join(value for _, value in named) + ")")
        else:
            separated.extend(items)
    if len(separated) > 1:
        return Structure("list", "", "", tuple(separated))
    if len(text) >= 2 and text[0] in "([" and text[-1] in ")]" and _balanced(text):
        inner = split_top_level(text[1:-1])
        if len(inner) == 1 and ";" in inner[0]:
            inner = split_top_level(inner[0], ";")  # (0;-2;6): coordinates by semicolons
        if text[0] + text[-1] == "()" and len(inner) == 1 and inner[0].startswith("\\begin"):
            return structure(inner[0])  # (\begin{pmatrix}…\end{pmatrix})
        if text[0] + text[-1] == "()" and len(inner) >= 2:
            return Structure("tuple", "(", ")", tuple(inner))  # also an open interval: compared alike
        if len(inner) == 2:
            return Structure("interval", text[0], text[-1], tuple(inner))
        return None
    for opening, closing in (("\\{", "\\}"), ("{", "}")):
        if text.startswith(opening) and text.endswith(closing) and _balanced(text[len(opening) - 1 :]):
            inner = split_top_level(text[len(opening) : len(text) - len(closing)])
            if inner:
                return Structure("set", "{", "}", tuple(inner))
    return None


def multi_part(gold: str) -> bool:
    """Whether a gold answer has several parts that a response may state one by one (a set, a list of
    solutions, "x = 1 or x = 2")."""
    shape = structure(gold)
    return shape is not None and shape.kind in ("set", "list")
