"""Noisy-verifier correction: estimate how often a verifier is wrong, and undo it in expectation.

On an audit set with true labels (human labels, or a stricter second verifier), the false-positive
rate ρ0 = P(verifier says correct | wrong) and false-negative rate ρ1 = P(verifier says wrong | correct)
give the unbiased corrected reward (R − ρ0) / (1 − ρ0 − ρ1): its expectation is the true reward.
Each rate comes with a Wilson score interval (95 % by default): an audit of 40 items says much less
than one of 4,000, and the interval says how much.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NoiseEstimate:
    rho0: float  # false-positive rate
    rho1: float  # false-negative rate
    n_wrong: int  # audit items truly wrong
    n_correct: int  # audit items truly correct
    rho0_low: float | None = None  # its confidence interval
    rho0_high: float | None = None
    rho1_low: float | None = None
    rho1_high: float | None = None


def wilson_interval(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (z = 1.96: 95 %)."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * ((p * (1 - p) / trials + z * z / (4 * trials * trials)) ** 0.5) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def estimate_noise(verifier_correct: np.ndarray, truly_correct: np.ndarray, z: float = 1.959964) -> NoiseEstimate:
    verifier_correct = np.asarray(verifier_correct, dtype=bool)
    truly_correct = np.asarray(truly_correct, dtype=bool)
    n_wrong, n_correct = int((~truly_correct).sum()), int(truly_correct.sum())
    if n_wrong == 0 or n_correct == 0:
        raise ValueError(f"the audit set needs both correct and wrong items (has {n_correct} correct, {n_wrong} wrong)")
    false_positives = int((verifier_correct & ~truly_correct).sum())
    false_negatives = int((~verifier_correct & truly_correct).sum())
    rho0, rho1 = false_positives / n_wrong, false_negatives / n_correct
    if rho0 + rho1 >= 1:
        raise ValueError(f"ρ0 + ρ1 = {rho0 + rho1:.3f} ≥ 1: this verifier is no better than chance on the audit set")
    return NoiseEstimate(
        rho0,
        rho1,
        n_wrong,
        n_correct,
        *wilson_interval(false_positives, n_wrong, z),
        *wilson_interval(false_negatives, n_correct, z),
    )


def corrected_reward(reward: np.ndarray | float, rho0: float, rho1: float) -> np.ndarray | float:
    return (np.asarray(reward, dtype=float) - rho0) / (1 - rho0 - rho1)
