"""Math answers: extraction, anti-hacking guards, an exact fast path, then math-verify.

math-verify's timeouts use SIGALRM, which only works in a process's main thread: the
verification stage calls this from the main thread of worker processes, where both of its
timeouts are active. Called from another thread it runs without them, and the stage's per-item
deadline (which kills the worker) is the only bound.
"""

from __future__ import annotations

import logging
import re
import threading
from functools import lru_cache
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tasks.verifiers.base import Verdict, failed, register
from tasks.verifiers.extract import EXTRACTORS, final_answers
from tasks.verifiers.guards import canonical, costly, lists_candidates, qualifies
from tasks.verifiers.numbers import numbers_equal, parse_number, strip_noise


@register("math")
@dataclass
class MathVerifier:
    """Reward 1 when the single final answer equals the gold answer, else 0."""

    extractors: tuple[str, ...] = EXTRACTORS
    timeout_seconds: int = 3
    name: str = "math"
    version: str = "1.0"

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:
        gold = str(problem.get("answer") or "").strip()
        if not gold:
            return Verdict(0.0, None, {"reason": "problem has no gold answer"})
        statements = final_answers(response, tuple(self.extractors))
        if not statements:
            return failed("no final answer", extracted=None)
        # the answer: the last statement of the first extractor (in preference order) that found one
        extractor = next(kind for kind in self.extractors if any(k == kind for k, _ in statements))
        answer = [a for k, a in statements if k == extractor][-1]
        details = {"extracted": answer, "extractor": extractor}
        if self._hedged([a for _, a in statements]):
            return failed("hedged: several different final answers", **details,
                          final_answers=[a for _, a in statements])
        if any("\\boxed" in a or "\\fbox" in a for _, a in statements):
            return failed("a box inside a box", **details)
        if lists_candidates(answer, gold):
            return failed("lists several candidates for a single-valued answer", **details)
        reason = qualifies(answer, gold)
        if reason is not None:
            return failed(reason, **details)
        prompt = problem.get("prompt")
        percent_question = None if not prompt else bool(re.search(r"percent|%", prompt, re.IGNORECASE))
        equal, method = self.equivalent(gold, answer, percent_question)
        return Verdict(float(equal), equal, {**details, "method": method, "reason": None if equal else "wrong answer"})

    def equivalent(self, gold: str, answer: str, percent_question: bool | None = None) -> tuple[bool, str]:
        """(equal, how it was decided): exact numbers, the text of costly expressions, or math-verify."""
        if costly(answer) or costly(gold):
            return _same_text(gold, answer), "text (costly expression)"
        gold_number, answer_number = parse_number(gold), parse_number(answer)
        if gold_number is not None and answer_number is not None:
            return numbers_equal(gold_number, answer_number, percent_question), "exact"
        if _same_text(gold, answer):                 # identical up to spacing and noise: no need to parse
            return True, "text"
        return self._math_verify(gold, answer), "math-verify"

    def _hedged(self, answers: list[str]) -> bool:
        keys = {canonical(a) for a in answers}
        if len(keys) <= 1:
            return False
        distinct = list(dict.fromkeys(answers))
        return any(not self.equivalent(distinct[0], other)[0] for other in distinct[1:])

    def _math_verify(self, gold: str, answer: str) -> bool:
        from math_verify import parse, verify

        logging.getLogger("math_verify").setLevel(logging.ERROR)
        timeout = max(1, int(self.timeout_seconds)) if threading.current_thread() is threading.main_thread() else None
        try:
            gold_parsed = _parse_gold(gold, timeout)
            answer_parsed = parse(_latex(answer), parsing_timeout=timeout)
            if not answer_parsed or not gold_parsed:
                return _same_text(gold, answer)
            return bool(verify(gold_parsed, answer_parsed, timeout_seconds=timeout))
        except Exception:        # math-verify's own timeout, or a sympy failure: not provably equal
            return False


@lru_cache(maxsize=8192)
def _parse_gold(gold: str, timeout: int | None) -> list:
    """Gold answers repeat across a group's samples: parse each once per worker."""
    from math_verify import parse

    return parse(_latex(gold), parsing_timeout=timeout)


def _latex(answer: str) -> str:
    return f"${answer.strip().strip('$')}$"


def _same_text(gold: str, answer: str) -> bool:
    squeeze = lambda text: "".join(strip_noise(text).split())  # noqa: E731
    return squeeze(gold) == squeeze(answer)


def gsm8k_reward(completions: list[str], answer: list[str]) -> list[float]:
    """A TRL-style reward function for GSM8K: lists in, lists out. Numeric and fraction answers in any
    equivalent form (1/2 = 0.5 = 50 %, 1,000 = 1000, $18 = 18) score 1."""
    verifier = MathVerifier()
    return [verifier.verify({"answer": gold}, completion).reward for completion, gold in zip(completions, answer)]


WARM_UP = [r"\frac{1}{2}", r"\sqrt{2}", r"3\sqrt{13}", r"\left( 3, \frac{\pi}{2} \right)", r"[0, 1)", r"(1, 2]",
           r"\{1, 2\}", r"x^2 + 2x + 1", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"2\pi", r"\dfrac{\sqrt{3}}{4}",
           r"10^{\circ}", r"\text{(C)}", r"a^2+b^2", r"\infty", r"-\frac{7}{3}", r"\log_2 8", r"e^{i\pi}"]


def warm_up(verifier: "MathVerifier | None" = None) -> None:
    """Parse a spread of LaTeX forms once: the LaTeX parser builds its tables lazily, and a worker
    that will score thousands of answers should not pay that on its first few."""
    verifier = verifier or MathVerifier()
    for form in WARM_UP:
        verifier.verify({"answer": form}, rf"\boxed{{{form} + 1}}")
