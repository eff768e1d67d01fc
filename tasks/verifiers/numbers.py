"""The fast path of math equivalence: answers that are plain numbers, compared as exact fractions.

Most gold answers (GSM8K, AIME, generated problems) are integers, decimals or simple fractions;
comparing those exactly costs microseconds, where a symbolic parse costs milliseconds.
Formatting noise is removed first: `$`, `\\text{ cm}`, units, degrees, thousands separators,
`x =`; a percent sign is remembered, because 50 % may answer "what fraction" (0.5) or "what
percent" (50).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

_TEXT_BLOCK = re.compile(r"\\(?:text|textbf|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")
_DEGREES = re.compile(r"\^\s*\{?\\circ\}?|°|\\degree")
_SPACING = re.compile(r"(?<!\\)\\[,;:! ]|\\q?quad|\\(?:left|right)(?:\.|(?=[(\[{|)\]}\\<>]))?|\\displaystyle|~")
_LEADING_ASSIGNMENT = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?\s*=\s*")
_TRAILING_WORDS = re.compile(r"(?<=[\d.}%])\s+([a-zA-Z][a-zA-Z .]*)$")
# words after a number that are mathematics, not units: "2 pi" is not 2
_MATH_WORDS = {"pi", "e", "i", "sqrt", "log", "ln", "sin", "cos", "tan", "mod", "times", "cdot"}
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_DECIMAL = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d{1,3})?$")
_DECIMAL_COMMA = re.compile(r"^[-+]?\d+,\d+$")
_REPEATING = re.compile(r"^([-+]?)(\d*)\.(\d*)\\overline\s*\{?(\d+)\}?$")
PRECISION = 6  # decimals to which a decimal answer and the gold must agree (as Math-Verify's default)
_PERCENT_WORD = re.compile(r"\s*(?:\\text\{\s*)?(?:per\s?cent|percentage points?)(?:\s*\})?", re.IGNORECASE)
# words that change a number's meaning rather than name its unit: "not 2", "2 million", "at least 2"
MODIFIERS = {
    "not",
    "no",
    "least",
    "most",
    "million",
    "millions",
    "billion",
    "billions",
    "thousand",
    "thousands",
    "hundred",
    "hundreds",
    "dozen",
    "dozens",
    "squared",
    "cubed",
    "wrong",
    "incorrect",
    "approximately",
    "about",
    "around",
    "roughly",
    "nearly",
    "almost",
    "over",
    "under",
    "more",
    "less",
    "than",
    "maybe",
    "possibly",
    "perhaps",
    "or",
    "between",
    "except",
    "none",
    "times",
    "half",
    "twice",
    "double",
    "minus",
    "plus",
    "negative",
    "positive",
    "greater",
    "smaller",
    "fewer",
    "above",
    "below",
    "up",
    "to",
    "is",
    "isn",
}
_SLASH_FRACTION = re.compile(r"^([-+]?\d+)\s*/\s*([-+]?\d+)$")
_LATEX_FRACTION = re.compile(r"^([-+]?)\\[dt]?frac\s*\{\s*([-+]?\d+)\s*\}\s*\{\s*([-+]?\d+)\s*\}$")
_LATEX_FRACTION_SHORT = re.compile(r"^([-+]?)\\[dt]?frac\s*(\d)(\d)$")


@dataclass(frozen=True)
class Number:
    value: Fraction
    percent: bool = False
    decimal: bool = False  # written as a decimal with a fractional part: compared to PRECISION decimals


def strip_noise(text: str) -> str:
    """The answer without dollars, text blocks that are units, spacing commands and degrees."""
    text = re.sub(r"(?<=\d),\\!\s*(?=\d)", ",", text.strip().strip("$").strip().replace("{,}", ","))  # 12,\!000
    text = re.sub(r"(?<=\d)\s*\{\s*,\s*\}\s*(?=\d)", ",", text)  # 14 {, }916
    text = _PERCENT_WORD.sub("%", text)
    kept = _TEXT_BLOCK.sub(lambda m: m.group(1) if re.search(r"\d", m.group(1)) or _modifies(m.group(1)) else "", text)
    # text blocks go when they are units beside a value; an answer that is only text keeps its words
    text = kept if re.search(r"[\w\\]", kept.replace("$", "")) else _TEXT_BLOCK.sub(lambda m: m.group(1), text)
    text = _SPACING.sub("", _DEGREES.sub("", text))
    text = text.replace("\\$", "").replace("$", "").strip()
    text = _LEADING_ASSIGNMENT.sub("", text)
    return text.strip().rstrip(".").strip()


def parse_number(text: str, decimal_comma: bool = True) -> Number | None:
    """An exact number if the answer is one (after noise removal), else None. Thousands may be grouped by
    commas or (thin) spaces; with `decimal_comma`, a comma that cannot be a thousands separator (`1,22`,
    `0,111`, `1000,99`) is a decimal comma; `0.\\overline{3}` is 1/3."""
    if len(text) > 400:  # huge literals are the costly-expression guard's business
        return None
    text = strip_noise(text).replace("−", "-")
    percent = text.endswith("%")
    text = text.rstrip("%").rstrip("\\").strip()
    text = _strip_unit_words(text)
    if _THOUSANDS.match(text) and not text.startswith(("0,", "-0,")):
        text = text.replace(",", "")
    text = re.sub(r"(?<=\d)[ \u2009\u202f](?=\d{3}\b)", "", text)  # 1 000 000
    text = re.sub(r"\s*([-+/])\s*", r"\1", text).strip()  # "- 5", "1 / 2"; "1 8" stays two numbers
    if decimal_comma and _DECIMAL_COMMA.match(text):
        text = text.replace(",", ".")
    value: Fraction | None = None
    if _DECIMAL.match(text):
        value = Fraction(text)
        if "." in re.split("[eE]", text)[0] and value.denominator != 1:
            return Number(value, percent, decimal=True)
    elif match := _REPEATING.match(text):
        sign, whole, fixed, repeating = match.groups()
        value = (
            Fraction(int(whole or 0))
            + Fraction(int(fixed or 0), 10 ** len(fixed))
            + Fraction(int(repeating), 10 ** len(fixed) * (10 ** len(repeating) - 1))
        )
        value = -value if sign == "-" else value
    elif match := _SLASH_FRACTION.match(text):
        value = _fraction(match.group(1), match.group(2))
    elif match := _LATEX_FRACTION.match(text) or _LATEX_FRACTION_SHORT.match(text):
        sign, numerator, denominator = match.groups()
        value = _fraction(numerator, denominator)
        value = -value if value is not None and sign == "-" else value
    if value is None:
        return None
    return Number(value, percent)


def _modifies(text: str) -> bool:
    return any(word.lower() in MODIFIERS for word in re.findall(r"[A-Za-z]+", text))


def _strip_unit_words(text: str) -> str:
    """`18 dollars` → `18`, `5 cm` → `5`; single letters and mathematical words are kept."""
    match = _TRAILING_WORDS.search(text)
    if not match:
        return text
    words = match.group(1).lower().replace(".", " ").split()
    if any(len(word) < 2 or word in _MATH_WORDS or word in MODIFIERS for word in words):
        return text
    return text[: match.start()].strip()


def _fraction(numerator: str, denominator: str) -> Fraction | None:
    return None if int(denominator) == 0 else Fraction(int(numerator), int(denominator))


def numbers_equal(
    gold: Number, answer: Number, percent_question: bool | None = None, precision: int = PRECISION
) -> bool:
    """Equality: exact, or — where either side is written as a decimal — to `precision` decimals (so 1/12 is
    0.0833333, not 0.08). "50 %" is 0.5; it is also 50 where the question asks for a percentage (its
    prompt says "percent" or "%"), or where the prompt is unknown."""

    def readings(number: Number) -> set[Fraction]:
        if not number.percent:
            return {number.value}
        if percent_question is None:
            return {number.value, number.value / 100}
        return {number.value} if percent_question else {number.value / 100}

    if gold.decimal or answer.decimal:
        return bool({round(v, precision) for v in readings(gold)} & {round(v, precision) for v in readings(answer)})
    return bool(readings(gold) & readings(answer))
