"""Noisy-verifier correction: estimate how often a verifier is wrong, and undo it in expectation.

On an audit set with true labels (human labels, or a stricter second verifier), the false-positive
rate ρ0 = P(verifier says correct | wrong) and false-negative rate ρ1 = P(verifier says wrong | correct)
give the unbiased corrected reward (R − ρ0) / (1 − ρ0 − ρ1): its expectation is the true reward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NoiseEstimate:
    rho0: float          # false-positive rate
    rho1: float          # false-negative rate
    n_wrong: int         # audit items truly wrong
    n_correct: int       # audit items truly correct


def estimate_noise(verifier_correct: np.ndarray, truly_correct: np.ndarray) -> NoiseEstimate:
    verifier_correct = np.asarray(verifier_correct, dtype=bool)
    truly_correct = np.asarray(truly_correct, dtype=bool)
    n_wrong, n_correct = int((~truly_correct).sum()), int(truly_correct.sum())
    if n_wrong == 0 or n_correct == 0:
        raise ValueError(f"the audit set needs both correct and wrong items (has {n_correct} correct, {n_wrong} wrong)")
    rho0 = float((verifier_correct & ~truly_correct).sum() / n_wrong)
    rho1 = float((~verifier_correct & truly_correct).sum() / n_correct)
    if rho0 + rho1 >= 1:
        raise ValueError(f"ρ0 + ρ1 = {rho0 + rho1:.3f} ≥ 1: this verifier is no better than chance on the audit set")
    return NoiseEstimate(rho0, rho1, n_wrong, n_correct)


def corrected_reward(reward: np.ndarray | float, rho0: float, rho1: float) -> np.ndarray | float:
    return (np.asarray(reward, dtype=float) - rho0) / (1 - rho0 - rho1)
