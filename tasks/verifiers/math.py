"""Math answers: read as broadly as Math-Verify reads them, judged stricter.

1. The gold is reduced to its answer (its last box, the math it is wrapped in, or the final answer of
   a worked solution) and the response's final-answer statements are found (`extract.py`).
2. Several statements must agree. Boxes whose union is a multi-part gold (a set, a list of solutions)
   are one answer; a self-correction ("wait", "actually", … between them, no "or") counts its last
   statement; any other disagreement is hedging and scores 0.
3. The single answer passes the anti-hacking guards (`guards.py`): no box inside a box, no list of
   candidates for a single-valued gold, no relation where a value is asked, no words that change the
   value, nothing too costly to evaluate.
4. Equivalence, cheapest first: text answers as text (choice letters, words), assignments by their
   value, exact numbers (to `precision` decimals where one side is a decimal), structures part by part
   (tuples in order, sets and lists in any order, intervals with their ends), identical text, the
   symbolic fast path (`symbolic.py`: the common forms straight into sympy), then math-verify.

math-verify's timeouts use SIGALRM, which only works in a process's main thread: the verification
stage calls this from the main thread of worker processes, where both of its timeouts are active.
Called from another thread it runs without them, and the caller's per-item deadline is the bound.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tasks.verifiers import symbolic
from tasks.verifiers.base import Verdict, failed, register
from tasks.verifiers.extract import EXTRACTORS, Statement, fallback, gold_answer, statements
from tasks.verifiers.forms import (
    Structure,
    assignment,
    choice_letter,
    clean,
    is_parenthesised_choice,
    multi_part,
    split_top_level,
    structure,
    word_answer,
)
from tasks.verifiers.guards import canonical, costly, lists_candidates, qualifies
from tasks.verifiers.numbers import PRECISION, numbers_equal, parse_number, strip_noise

CORRECTION = re.compile(
    r"\b(?:wait|actually|correction|mistake|oops|re-?check(?:ing)?|re-?evaluat\w*|re-?examin\w*|"
    r"recount\w*|let me re\w*|on second thought|made an error|that'?s wrong|this is wrong|"
    r"not correct|incorrect)\b",
    re.IGNORECASE,
)
FINAL = re.compile(r"\W*(?:the\s+)?final\s+answer", re.IGNORECASE)
_EQUALS = re.compile(r"(?<![<>!\\])=(?!=)")
# Characters no mathematical answer is written with: a stray answer marker (`#`), `@`, or the replacement
# character of undecodable bytes. math-verify reads a number out of such text (`11#### 181` → 181: a
# hedge between 11 and 181 rewarded), so an answer holding one is not handed to it.
_STRAY = re.compile(r"(?<!\\)#|@|\ufffd")
ALTERNATIVE = re.compile(r"\bor\b|\balternatively\b|\beither\b", re.IGNORECASE)


@register("math")
@dataclass
class MathVerifier:
    """Reward 1 when the single final answer equals the gold answer, else 0."""

    extractors: tuple[str, ...] = EXTRACTORS  # where answers are looked for, in order (see extract.py)
    timeout_seconds: int = 3  # math-verify's own parse and verify timeouts
    precision: int = PRECISION  # decimals a decimal answer must agree to
    decimal_comma: bool = True  # `1,22` is 1.22 where the comma cannot group thousands
    name: str = "math"
    version: str = "2.2"  # 2.2: `##### N` is a hash line too

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:
        raw_gold = str(problem.get("answer") or "").strip()
        if not raw_gold:
            return Verdict(0.0, None, {"reason": "problem has no gold answer"})
        gold = gold_answer(raw_gold)
        found = statements(response, tuple(self.extractors))
        if not found:
            last = fallback(response, tuple(self.extractors))
            if last is None:
                return failed("no final answer", extracted=None)
            found = [last]
        # the answer: the last statement of the first extractor (in preference order) that found one
        kind = next(k for k in self.extractors if any(s.kind == k for s in found))
        chosen = [s for s in found if s.kind == kind]
        answer = chosen[-1].text
        details: dict[str, Any] = {"extracted": answer, "extractor": kind}
        prompt = problem.get("prompt")
        percent_question = None if not prompt else bool(re.search(r"percent|%", prompt, re.IGNORECASE))
        if len(found) > 1 and not self._agree([s.text for s in found], percent_question):
            if multi_part(gold):
                return self._parts(gold, chosen, details, percent_question)
            if not _corrected(found, response):
                return failed(
                    "hedged: several different final answers", **details, final_answers=[s.text for s in found]
                )
            answer = found[-1].text  # a self-correction: its last statement counts
            details.update(extracted=answer, extractor=found[-1].kind, self_corrected=True)
        return self._judge(gold, answer, details, percent_question)

    def _judge(self, gold: str, answer: str, details: dict[str, Any], percent_question: bool | None) -> Verdict:
        if "\\boxed" in answer or "\\fbox" in answer:
            return failed("a box inside a box", **details)
        if lists_candidates(answer, gold):
            return failed("lists several candidates for a single-valued answer", **details)
        reason = qualifies(answer, gold)
        if reason is not None:
            return failed(reason, **details)
        chain = _equality_chain(answer)
        if chain:  # "x = 5 + 5 + 1 = 11": every side must be equal
            if not all(self.equivalent(left, right, percent_question)[0] for left, right in zip(chain, chain[1:])):
                return failed("an equality chain whose sides differ", **details)
            answer = chain[-1]
        equal, method = self.equivalent(gold, answer, percent_question)
        return Verdict(float(equal), equal, {**details, "method": method, "reason": None if equal else "wrong answer"})

    def _parts(
        self, gold: str, chosen: list[Statement], details: dict[str, Any], percent_question: bool | None
    ) -> Verdict:
        """Several statements answering a multi-part gold: their parts together must be the gold's parts."""
        stated = [part for s in chosen for part in _parts_of(s.text)]
        gold_parts = list(structure(gold).parts)
        equal = self._same_parts(gold_parts, stated, percent_question)
        return Verdict(
            float(equal),
            equal,
            {**details, "extracted": ", ".join(stated), "method": "parts", "reason": None if equal else "wrong answer"},
        )

    def _agree(self, answers: list[str], percent_question: bool | None) -> bool:
        keys = {canonical(a) for a in answers}
        if len(keys) <= 1:
            return True
        distinct = list(dict.fromkeys(answers))
        return all(self.equivalent(distinct[-1], other, percent_question)[0] for other in distinct[:-1])

    # ---- equivalence -------------------------------------------------------------------------------------
    def equivalent(self, gold: str, answer: str, percent_question: bool | None = None) -> tuple[bool, str]:
        """(equal, how it was decided)."""
        gold, answer = clean(gold), clean(answer)
        if not gold or not answer:
            return False, "empty"
        if costly(answer) or costly(gold):
            return _same_text(gold, answer), "text (costly expression)"
        letter = choice_letter(gold)
        if letter is not None and (letter.isupper() or is_parenthesised_choice(gold)):
            stated = choice_letter(answer)
            return stated is not None and stated.upper() == letter.upper(), "choice"
        words = word_answer(gold)
        if words is not None or word_answer(answer) is not None:
            return words is not None and word_answer(answer) == words, "text"
        named_gold, named_answer = assignment(gold), assignment(answer)
        if named_gold or (named_answer and "=" not in gold):  # an equation gold is compared as an equation
            gold = named_gold[1] if named_gold else gold
            answer = named_answer[1] if named_answer else answer
        gold_number = parse_number(gold, self.decimal_comma)
        answer_number = parse_number(answer, self.decimal_comma)
        if gold_number is not None and answer_number is not None:
            return numbers_equal(gold_number, answer_number, percent_question, self.precision), "exact"
        gold_shape, answer_shape = structure(gold), structure(answer)
        if gold_shape is not None and answer_shape is not None:
            return self._same_structure(gold_shape, answer_shape, percent_question), "structure"
        if _same_text(gold, answer):  # identical up to spacing and noise: no need to parse
            return True, "text"
        decided = symbolic.compare(gold, answer, self.precision)
        if decided is not None:
            return decided, "symbolic"
        if _STRAY.search(answer):
            return False, "text (stray characters)"
        return self._math_verify(gold, answer), "math-verify"

    def _same_structure(self, gold: Structure, answer: Structure, percent_question: bool | None) -> bool:
        unordered = {"set", "list"}
        if gold.kind in unordered and answer.kind in unordered:
            return self._same_parts(list(gold.parts), list(answer.parts), percent_question)
        if gold.kind != answer.kind or len(gold.parts) != len(answer.parts):
            return False
        if gold.kind == "interval" and (gold.opening, gold.closing) != (answer.opening, answer.closing):
            return False
        return all(self.equivalent(g, a, percent_question)[0] for g, a in zip(gold.parts, answer.parts))

    def _same_parts(self, gold: list[str], answer: list[str], percent_question: bool | None) -> bool:
        """The same parts as sets: in any order, a part stated twice counted once."""
        same = lambda a, b: self.equivalent(a, b, percent_question)[0]  # noqa: E731
        gold, answer = _distinct(gold, same), _distinct(answer, same)
        return len(gold) == len(answer) and all(any(same(part, other) for other in answer) for part in gold)

    def _math_verify(self, gold: str, answer: str) -> bool:
        from math_verify import parse, verify

        logging.getLogger("math_verify").setLevel(logging.ERROR)
        timeout = max(1, int(self.timeout_seconds)) if threading.current_thread() is threading.main_thread() else None
        try:
            gold_parsed = _parse_gold(gold, timeout)
            answer_parsed = parse(_latex(answer), parsing_timeout=timeout)
            if not answer_parsed or not gold_parsed:
                return False
            return bool(verify(gold_parsed, answer_parsed, timeout_seconds=timeout))
        except Exception:  # math-verify's own timeout, or a sympy failure: not provably equal
            return False


def _equality_chain(answer: str) -> list[str] | None:
    """The value sides of an answer that chains equalities (`5+5+1 = 7 = 11`, `x = 2 + 2 = 4`), a leading
    name left out; None for a single equation or assignment, and for a list (`a = 2, b = 3`)."""
    sides = split_top_level(answer, _EQUALS)
    if len(sides) < 3 or structure(answer) is not None:
        return None
    if assignment(f"{sides[0]} = {sides[1]}") is not None:
        sides = sides[1:]
    return sides


def _distinct(parts: list[str], same) -> list[str]:
    kept: list[str] = []
    for part in parts:
        if not any(same(part, other) for other in kept):
            kept.append(part)
    return kept


def _parts_of(text: str) -> list[str]:
    shape = structure(text)
    return list(shape.parts) if shape is not None and shape.kind in ("set", "list") else [text]


def _corrected(found: list[Statement], response: str) -> bool:
    """Whether the statements end in a self-correction: between the last one and the latest statement that
    differs from it, the response corrects itself ("wait", "actually", …, or a closing "the final answer
    is") and offers no alternative ("or")."""
    last = found[-1]
    key = canonical(last.text)
    previous = next((s for s in reversed(found[:-1]) if canonical(s.text) != key), None)
    if previous is None:
        return True
    between = response[previous.end : last.start]
    closing = last.kind == "answer_is" and FINAL.match(response, last.start) is not None
    return (closing or bool(CORRECTION.search(between))) and not ALTERNATIVE.search(between)


@lru_cache(maxsize=8192)
def _parse_gold(gold: str, timeout: int | None) -> list:
    """Gold answers repeat across a group's samples: parse each once per worker."""
    from math_verify import parse

    return parse(_latex(gold), parsing_timeout=timeout)


def _latex(answer: str) -> str:
    """An extracted answer as math-verify reads math: wrapped in `$…$` (it is an answer, never a text)."""
    return f"${answer.strip().strip('$').strip()}$"


def _same_text(gold: str, answer: str) -> bool:
    squeeze = lambda text: "".join(strip_noise(text).split())  # noqa: E731
    left, right = squeeze(gold), squeeze(answer)
    return bool(left) and left == right


def gsm8k_reward(completions: list[str], answer: list[str]) -> list[float]:
    """A TRL-style reward function for GSM8K: lists in, lists out. Numeric and fraction answers in any
    equivalent form (1/2 = 0.5 = 50 %, 1,000 = 1000, $18 = 18) score 1."""
    verifier = MathVerifier()
    return [verifier.verify({"answer": gold}, completion).reward for completion, gold in zip(completions, answer)]


WARM_UP = [
    r"\frac{1}{2}",
    r"\sqrt{2}",
    r"3\sqrt{13}",
    r"\left( 3, \frac{\pi}{2} \right)",
    r"[0, 1)",
    r"(1, 2]",
    r"\{1, 2\}",
    r"x^2 + 2x + 1",
    r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}",
    r"2\pi",
    r"\dfrac{\sqrt{3}}{4}",
    r"10^{\circ}",
    r"\text{(C)}",
    r"a^2+b^2",
    r"\infty",
    r"-\frac{7}{3}",
    r"\log_2 8",
    r"e^{i\pi}",
]


def warm_up(verifier: MathVerifier | None = None) -> None:
    """Parse a spread of LaTeX forms once: the LaTeX parser builds its tables lazily, and a worker
    that will score thousands of answers should not pay that on its first few."""
    verifier = verifier or MathVerifier()
    for form in WARM_UP:
        verifier.verify({"answer": form}, rf"\boxed{{{form} + 1}}")
