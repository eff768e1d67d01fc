"""Finding the final answer in a response, as broadly as Math-Verify reads one, and naming where.

Extractors, in the order a grader uses them (the first that finds an answer gives it; its last one
counts), each linear in the response:
- `boxed`: an outermost `\\boxed{}` / `\\fbox{}`;
- `hash`: a GSM8K `#### N` line (four hashes or more);
- `answer_is`: "the final answer is X", "the answer is X", "Final Answer: X", "**Answer:** X",
  "Answer: X", "Answer \\[X\\]" — the answer span only: up to the sentence's end, the contents of its
  `$…$`, without "I hope it is correct" or chat tokens, and a sentence reduced to its value ("The
  volume of $ABC$ is 120." → 120);
- `math`: the last display or inline math span (`$$…$$`, `\\[…\\]`, `$…$`, `\\(…\\)`);
- `number`: the last number of the response.
The first three are *statements*: the response says "this is my answer" (hedging is judged over
them, in math.py). The last two are fallbacks for a response that states nothing explicitly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

EXTRACTORS = ("boxed", "hash", "answer_is", "math", "number")
STATEMENTS = ("boxed", "hash", "answer_is")  # explicit final-answer statements
FALLBACKS = ("math", "number")
FALLBACK_WINDOW = 4000  # characters at the end of a response the fallbacks read

HASH_LINE = re.compile(r"^[ \t]*#{4,}[ \t]*(.+?)[ \t]*$", re.MULTILINE)  # `#####` too: more hashes, same line
_ANSWER_LEAD = re.compile(
    r"\*\*\s*(?:final\s+)?answer\s*:?\s*\*\*\s*:?"  # **Answer:** / **Final Answer**:
    r"|(?:the\s+)?final\s+answer\s*(?:is\s*:?|:|=)"  # the final answer is / Final Answer:
    r"|\bthe\s+(?:correct\s+)?answer\s*(?:is\s*:?|:|=)"  # the answer is
    r"|^[ \t]*answer\s*(?::|(?=\s*(?:\$|\\\[|\\\()))",  # Answer: X / Answer \[X\] at a line start
    re.IGNORECASE | re.MULTILINE,
)
CHAT_TOKENS = re.compile(r"<\|(?:im_start|im_end|endoftext|eot_id|end|assistant|user)\|>|</s>|<\|.*?\|>")
_HOPE = re.compile(r"\s*I hope (?:it|this) is correct\.?", re.IGNORECASE)
_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\\\[(.+?)\\\]|\\\((.+?)\\\)|(?<![\\$])\$(?!\$)(.+?)(?<![\\$])\$", re.DOTALL)
NUMBER = re.compile(
    r"(?<![\w.])[-−]?(?:\d{1,3}(?:[,\u2009\u202f ]\d{3})+|\d+)(?:[.,]\d+)?(?:\s*/\s*\d+)?(?![\d])"
    r"|(?<![\w.])[-−]?\.\d+"
)
_WORD = re.compile(r"[A-Za-z]{2,}")
# what may stand between a gold's boxes that together are its answer: a conjunction, a comma, spacing, a unit
_JOINED = re.compile(r"^(?:\s|\$|\\[()\[\],;!]|,|&|\\q?quad|\\text\{[^{}]*\}|\band\b|[A-Za-z]+(?=\s+and\b))*$")
_VERB = re.compile(r"\s(?:is|are|was|equals|=)\s+(?!not\b)", re.IGNORECASE)


@dataclass(frozen=True)
class Statement:
    kind: str  # the extractor that found it
    text: str  # the answer it states
    start: int  # where in the response it begins and ends
    end: int


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    open_brace = text.find("{", start)
    if open_brace < 0:
        return None
    depth = 0
    for position in range(open_brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[position], 0)
        if depth == 0:
            return text[open_brace + 1 : position].strip()
    return None


def boxed_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every outermost `\\boxed{...}` / `\\fbox{...}`, in order, braces balanced.
    Linear: a box nested inside another is part of the outer one's content, not a statement of its own."""
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
            found.append((match.start(), closing[start] + 1, text[start + 1 : closing[start]].strip()))
            covered_until = closing[start]
    return found


def all_boxed(text: str) -> list[str]:
    """Contents of every outermost box, in order."""
    return [content for _, _, content in boxed_spans(text)]


def without_chat_tail(text: str) -> str:
    """The response up to the first chat-template token (what follows is the template, not the answer)."""
    match = CHAT_TOKENS.search(text)
    return text[: match.start()] if match else text


def math_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every math span, in order; escaped dollars (`\\$5`) are currency, not math."""
    return [
        (m.start(), m.end(), next(g for g in m.groups() if g is not None).strip()) for m in _MATH_SPAN.finditer(text)
    ]


def answer_span(text: str) -> str:
    """What an answer lead-in ("the answer is") introduces: up to the end of its sentence, reduced to the
    value when it is a sentence ("The largest $n$ is 34" → 34)."""
    text = _HOPE.split(without_chat_tail(text), 1)[0]
    end = _sentence_end(text)
    span = text[:end].strip().strip('"').replace('\\"', "").strip()
    return reduce_sentence(span)


def _sentence_end(text: str) -> int:
    """Where the first sentence ends: a newline after some content, or a period (or ! ?) followed by a space
    or the end, never inside math."""
    depth, in_dollars, position = 0, False, 0
    started = False
    while position < len(text):
        char = text[position]
        if char == "\\" and text.startswith(("\\[", "\\("), position):
            depth, position = depth + 1, position + 2
            continue
        if char == "\\" and text.startswith(("\\]", "\\)"), position):
            depth, position = max(0, depth - 1), position + 2
            continue
        if char == "\\" and position + 1 < len(text):
            position += 2
            continue
        if char == "$":
            if text.startswith("$$", position):  # display math: one delimiter, not two
                position += 1
            in_dollars = not in_dollars
        elif char == "\n" and started and not in_dollars and depth == 0:
            return position
        elif char in ".!?" and not in_dollars and depth == 0 and started:
            following = text[position + 1 : position + 2]
            if following == "" or following.isspace():
                return position
        if not char.isspace():
            started = True
        position += 1
    return len(text)


def reduce_sentence(span: str) -> str:
    """A sentence reduced to the value it states; a span that is already a value is returned as it is."""
    outside = _MATH_SPAN.sub(" ", span)
    if len(_WORD.findall(outside)) < 2:  # a value, perhaps with a unit or a "$…$"
        spans = math_spans(span)
        if len(spans) == 1 and not _WORD.findall(outside):
            return spans[0][2]
        return span
    verbs = list(_VERB.finditer(span))
    if verbs:  # "... is 120", "... are $(1,2)$ and $(2,1)$"
        return reduce_sentence(span[verbs[-1].end() :].strip())
    spans = math_spans(span)
    if len(spans) == 1:
        return spans[0][2]
    numbers = NUMBER.findall(outside)
    if len(numbers) == 1:  # "Jane started growing it 3 hours ago"
        return numbers[0].strip()
    return span


def statements(text: str, extractors: tuple[str, ...] = EXTRACTORS) -> list[Statement]:
    """Every final-answer statement of the explicit extractors among `extractors`, in the order of the text."""
    found: list[Statement] = []
    boxes = boxed_spans(text)
    if "boxed" in extractors:
        found += [Statement("boxed", content, start, end) for start, end, content in boxes]
    if "hash" in extractors:
        found += [Statement("hash", m.group(1), m.start(), m.end()) for m in HASH_LINE.finditer(text)]
    if "answer_is" in extractors:
        leads = list(_ANSWER_LEAD.finditer(text))
        for index, lead in enumerate(leads):
            nested = (
                index + 1 < len(leads)
                and leads[index + 1].start() - lead.end() < 40
                and _sentence_end(text[lead.end() :]) >= leads[index + 1].start() - lead.end()
            )
            if nested:  # "Final Answer: The final answer is 7." → the inner
                continue
            rest = text[lead.end() : lead.end() + 2000]
            if any(start <= lead.end() + 40 and start >= lead.start() for start, _, _ in boxes):
                continue  # "the answer is \boxed{7}": the boxed statement
            answer = answer_span(rest)
            if answer:
                found.append(Statement("answer_is", answer, lead.start(), lead.end() + len(answer)))
    return sorted((s for s in found if s.text), key=lambda s: s.start)


def fallback(text: str, extractors: tuple[str, ...] = EXTRACTORS) -> Statement | None:
    """The answer of a response that states none: whichever comes last of its last math span and its last
    number; a response that is a bare expression (no words) is its own answer."""
    text = _HOPE.sub("", without_chat_tail(text))[-FALLBACK_WINDOW:]  # the answer is at the end; bounded
    candidates = []
    if "math" in extractors:
        spans = [s for s in math_spans(text) if s[2]]
        if spans:
            candidates.append(Statement("math", *_reordered(spans[-1])))
        elif text.strip() and not _WORD.findall(re.sub(r"\\[a-zA-Z]+", " ", text)) and len(text) < 300:
            return Statement("math", text.strip(), 0, len(text))
    if "number" in extractors:
        numbers = list(NUMBER.finditer(text))
        if numbers:
            last = numbers[-1]
            candidates.append(Statement("number", last.group(0).strip(), last.start(), last.end()))
    return max(candidates, key=lambda s: s.end) if candidates else None


def _reordered(span: tuple[int, int, str]) -> tuple[str, int, int]:
    start, end, content = span
    return content, start, end


def final_answers(text: str, extractors: tuple[str, ...] = STATEMENTS) -> list[tuple[str, str]]:
    """Every explicit final-answer statement as (extractor, answer), grouped in the order of `extractors`."""
    found = statements(text, extractors)
    return [(s.kind, s.text) for kind in extractors for s in found if s.kind == kind]


def extract_answer(text: str, extractors: tuple[str, ...] = STATEMENTS) -> tuple[str | None, str | None]:
    """(answer, extractor): the last statement of the first extractor that finds one, else the fallback."""
    found = statements(text, extractors)
    for extractor in extractors:
        mine = [s for s in found if s.kind == extractor]
        if mine:
            return mine[-1].text, extractor
    last = fallback(text, extractors)
    return (last.text, last.kind) if last is not None else (None, None)


def gold_answer(gold: str) -> str:
    """A gold answer as an answer: the contents of its last box, of the math it is wrapped in, or — for a
    gold that is a whole worked solution — its final answer, read the way a response is read."""
    text = gold.strip()
    boxes = boxed_spans(text)
    if boxes:
        if len(boxes) > 1 and all(_JOINED.match(text[left[1] : right[0]]) for left, right in zip(boxes, boxes[1:])):
            return ", ".join(content for _, _, content in boxes)  # `\boxed{1} and \boxed{2}`: both parts
        return boxes[-1][2]
    spans = math_spans(text)
    if len(spans) == 1 and spans[0][0] == 0 and spans[0][1] == len(text):
        return spans[0][2]
    if len(_WORD.findall(_MATH_SPAN.sub(" ", text))) > 12:  # a worked solution, not an answer
        answer, _ = extract_answer(text, EXTRACTORS)
        if answer is not None:
            return answer
    return text


__all__ = [
    "EXTRACTORS",
    "FALLBACKS",
    "STATEMENTS",
    "Statement",
    "all_boxed",
    "boxed_spans",
    "extract_answer",
    "fallback",
    "final_answers",
    "gold_answer",
    "last_boxed",
    "math_spans",
    "statements",
]
