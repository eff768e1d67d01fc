"""What a procedural math generator returns, and the seed discipline they all share."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any


@dataclass(frozen=True)
class Generated:
    """One procedural problem: the prompt, its exact answer, a worked solution and the parameters drawn."""

    prompt: str
    answer: str
    solution: str
    steps: list[str]
    params: dict[str, Any] = field(default_factory=dict)


def format_number(value: int | Fraction) -> str:
    """Integers as `12`, fractions in lowest terms as `3/4`, negative as `-3/4`."""
    value = Fraction(value)
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def step(expression: str, result: int | Fraction) -> str:
    """A GSM8K-style calculator step `a*b=c`: step-level ground truth for process rewards."""
    return f"{expression}={format_number(result)}"
