"""Process rewards: checking the intermediate results a response states, not only its final answer.

Two signals, averaged where both exist: the share of arithmetic equalities stated in the response
(`<<48/2=24>>` calculator tags, or `3 * 4 = 12` in prose) that are true, and the share of the
problem's own step results (GSM8K calculator steps) that the response reaches. The process score
is mixed into the outcome reward with weight λ: (1 - λ) · outcome + λ · process.
"""

from __future__ import annotations

import ast
import operator
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tasks.verifiers.base import Verdict, Verifier, build_registered, register

EQUALITY = re.compile(
    r"<<([^<>=]{1,120})=([^<>]{1,40})>>|([\d(][\d\s.,+\-*/×÷()]{0,80}[\d)])\s*=\s*\$?(-?\d[\d,]*(?:\.\d+)?)"
)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
MAX_CHARS = 20_000
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
LOW_PROCESS_WEIGHT = 0.1


def _evaluate(expression: str) -> float | None:
    """The value of + - * / arithmetic over numbers, or None (anything else, or too large)."""
    text = expression.replace("×", "*").replace("÷", "/").replace(",", "")
    if len(text) > 120:
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            result = OPERATORS[type(node.op)](value(node.left), value(node.right))
            if abs(result) > 1e15:
                raise ValueError("too large")
            return result
        raise ValueError("not arithmetic")

    try:
        return value(tree)
    except (ValueError, ZeroDivisionError):
        return None


def parse_number(text: str) -> float | None:
    """A stated number (thousands commas and a closing full stop allowed), or None."""
    try:
        return float(text.replace(",", "").strip().rstrip("."))
    except ValueError:
        return None


def stated_equalities(response: str) -> list[tuple[str, float, float]]:
    """(expression, stated result, true value) for every checkable arithmetic equality."""
    found = []
    for match in EQUALITY.finditer(response[-MAX_CHARS:]):
        expression, stated = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
        if not re.search(r"[+\-*/×÷]", expression.strip().lstrip("-")):
            continue
        true_value, stated_value = _evaluate(expression), parse_number(stated)
        if true_value is not None and stated_value is not None:
            found.append((expression.strip(), stated_value, true_value))
    return found


def stated_is_true(stated: float, true: float) -> bool:
    """A stated result counts as the equality's value: equal to float tolerance, or its value to 2 decimals."""
    return abs(stated - true) <= 1e-6 * max(1.0, abs(true)) + 1e-9 or round(true, 2) == stated


def _numbers(text: str) -> set[float]:
    return {n for n in (parse_number(m) for m in NUMBER.findall(text[-MAX_CHARS:])) if n is not None}


def process_score(
    response: str, gold_steps: list[str] | None, prompt: str | None = None
) -> tuple[float | None, dict[str, Any]]:
    """Share of the response's relevant arithmetic that is true, averaged with the share of the
    gold steps it reaches.

    Only steps on the problem's path count: an equality whose operands come from the prompt, the
    gold steps or an earlier true step ("1 + 1 = 2" padding adds nothing). A gold step is reached
    when a true stated equality produces its result, not when the number merely appears.
    """
    gold_results = [
        r for r in (parse_number(step.rsplit("=", 1)[1]) for step in gold_steps or [] if "=" in step) if r is not None
    ]
    relevant = _numbers(prompt or "") | {n for step in gold_steps or [] for n in _numbers(step)}
    counted, produced = [], set()
    for expression, stated, true in stated_equalities(response):
        operands = _numbers(expression)
        if relevant and not operands & (relevant | produced):
            continue
        correct = stated_is_true(stated, true)
        counted.append(correct)
        if correct:
            produced.add(stated)
    parts, details = [], {"equalities": len(counted)}
    if counted:
        parts.append(sum(counted) / len(counted))
        details["equalities_correct"] = sum(counted)
    if gold_results:
        reached = sum(1 for result in gold_results if result in produced)
        parts.append(reached / len(gold_results))
        details["gold_steps_reached"] = f"{reached}/{len(gold_results)}"
    return (sum(parts) / len(parts) if parts else None), details


def warn_low_process_weight(weight: float) -> None:
    """The seed's danger zone, raised where a config is read (once, in the main process; not in every worker
    that builds the verifier)."""
    if 0 < weight <= LOW_PROCESS_WEIGHT:
        warnings.warn(
            f"process_weight λ={weight} puts little weight on the process reward; the seed experiments "
            "found λ=0.1 worse than outcome-only rewards",
            UserWarning,
            stacklevel=3,
        )


@register("process")
@dataclass
class ProcessVerifier:
    """Outcome verifier plus step checking, mixed with weight `process_weight` (λ)."""

    outcome: str = "math"
    process_weight: float = 0.5
    name: str = "process"
    version: str = "1.0"
    _outcome: Verifier | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.process_weight <= 1:
            raise ValueError("process_weight (λ) must be in [0, 1]")
        self._outcome = build_registered(self.outcome)

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:
        outcome = self._outcome.verify(problem, response)
        steps = problem.get("steps")
        process, details = process_score(response, list(steps) if steps is not None else None, problem.get("prompt"))
        reward = (
            outcome.reward
            if process is None
            else (1 - self.process_weight) * outcome.reward + self.process_weight * process
        )
        return Verdict(
            reward,
            outcome.correct,
            {**outcome.details, "outcome_reward": outcome.reward, "process_reward": process, **details},
        )
