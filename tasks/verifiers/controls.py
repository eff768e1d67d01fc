"""Reward controls for experiments (the Spurious Rewards study): random, flipped and constant rewards,
registered as verifiers so that a run can swap them in by name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from storage.seeds import derive_seed
from tasks.verifiers.base import Verdict, build_registered, register


@register("random")
@dataclass
class RandomReward:
    """Bernoulli(p), reproducible: the draw depends on (seed, problem, response) only."""

    p: float = 0.5
    seed: int = 0
    name: str = "random"
    version: str = "1.0"

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:
        draw = derive_seed(self.seed, problem.get("problem_id", ""), response) / 2**63
        return Verdict(float(draw < self.p), None, {"control": "random", "p": self.p})


@register("flipped")
@dataclass
class FlippedReward:
    """1 for what the base verifier judges wrong, 0 for what it judges right; `correct` stays the truth."""

    base: str = "math"
    name: str = "flipped"
    version: str = "1.0"

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:
        verdict = build_registered(self.base).verify(problem, response)
        return Verdict(
            0.0 if verdict.correct else 1.0,
            verdict.correct,
            {"control": "flipped", "base": self.base, "base_reward": verdict.reward},
        )


@register("constant")
@dataclass
class ConstantReward:
    value: float = 1.0
    name: str = "constant"
    version: str = "1.0"

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:
        return Verdict(self.value, None, {"control": "constant"})
