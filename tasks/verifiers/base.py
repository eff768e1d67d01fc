"""What every verifier returns, and the registry that maps a problem's `verifier` name to one.

A verifier is pure: a problem row and a response in, a `Verdict` out, no I/O. Its name and
version are stored with every reward row, so a change of verifier shows in lineage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Verdict:
    """reward: the scalar the trainer sees; correct: None when the verifier cannot decide."""

    reward: float
    correct: bool | None
    details: dict[str, Any] = field(default_factory=dict)


def failed(reason: str, **details: Any) -> Verdict:
    return Verdict(0.0, False, {"reason": reason, **details})


class Verifier(Protocol):
    name: str
    version: str

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict: ...


VERIFIERS: dict[str, Callable[..., Verifier]] = {}
DEFAULT_VERIFIER = {"math": "math", "code": "code", "logic": "gym", "qa": "qa"}  # a domain's, when none is named


def register(name: str) -> Callable:
    def add(factory: Callable[..., Verifier]) -> Callable[..., Verifier]:
        VERIFIERS[name] = factory
        return factory

    return add


def build_registered(name: str, **options: Any) -> Verifier:
    """A registered verifier by name with its options (`registry.build_verifier` registers every verifier first)."""
    if name not in VERIFIERS:
        raise ValueError(f"unknown verifier {name!r}; known: {', '.join(sorted(VERIFIERS))}")
    return VERIFIERS[name](**options)
