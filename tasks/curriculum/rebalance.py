"""Rebalance the level mix from measured solve rates, to keep training in the 20-50 % zone.

A level the policy solves almost always (> 90 %) or almost never (< 10 %) yields groups that dynamic
sampling drops, so it loses share; a level inside the learning zone gains share; the rest keep
theirs. Shares are renormalised, with a floor so that no level disappears (it may come back into
the zone as the policy changes). Pure: weights and rates in, weights and the reason per level out.
"""

from __future__ import annotations

from dataclasses import dataclass

LEARNING_ZONE = (0.2, 0.5)
SATURATED = (0.1, 0.9)


@dataclass(frozen=True)
class LevelChange:
    level: int
    solve_rate: float | None
    old_weight: float
    new_weight: float
    reason: str  # in_zone, too_easy, too_hard, between, unmeasured


def rebalance(
    weights: dict[int, float], solve_rates: dict[int, float], step: float = 0.5, floor: float = 0.02
) -> list[LevelChange]:
    """New level weights (summing to 1) from the current ones and each level's measured solve rate."""
    if not 0 < step < 1:
        raise ValueError(f"step must be in (0, 1), got {step}")
    total = sum(weights.values())
    if total <= 0:
        raise ValueError("level weights must have a positive sum")
    scaled: dict[int, tuple[float, str]] = {}
    for level, weight in weights.items():
        rate = solve_rates.get(level)
        if rate is None:
            scaled[level] = (weight, "unmeasured")
        elif rate > SATURATED[1]:
            scaled[level] = (weight * (1 - step), "too_easy")
        elif rate < SATURATED[0]:
            scaled[level] = (weight * (1 - step), "too_hard")
        elif LEARNING_ZONE[0] <= rate <= LEARNING_ZONE[1]:
            scaled[level] = (weight * (1 + step), "in_zone")
        else:
            scaled[level] = (weight, "between")
    new_total = sum(w for w, _ in scaled.values())
    shares = {level: max(w / new_total, floor) for level, (w, _) in scaled.items()}
    norm = sum(shares.values())
    return [
        LevelChange(level, solve_rates.get(level), weights[level] / total, shares[level] / norm, reason)
        for level, (_, reason) in sorted(scaled.items())
    ]
