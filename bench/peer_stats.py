"""The peer benchmark's statistics (`bench/peer.py`): a mean with its 95 % interval over seeds (Student's t),
the time a curve first reaches an accuracy, the mean curve of several runs, and one arm of ours against another."""

from __future__ import annotations

import statistics

# Student's t at 97.5 % by degrees of freedom (a 95 % two-sided interval of a mean of n = df + 1 values).
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def interval(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of its 95 % interval by Student's t); half-width 0 for a single value."""
    mean = statistics.mean(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, T_975.get(len(values) - 1, 1.96) * statistics.stdev(values) / len(values) ** 0.5


def time_to_accuracy(points: list[tuple[float, float]], target: float) -> float | None:
    """The first time a curve of (seconds, accuracy) points reaches `target`, linear between points; None if it
    never does."""
    previous = None
    for seconds, accuracy in points:
        if accuracy >= target:
            if previous is None or accuracy == previous[1]:
                return seconds
            (t0, a0) = previous
            return t0 + (target - a0) / (accuracy - a0) * (seconds - t0)
        previous = (seconds, accuracy)
    return None


def mean_curve(runs: list[dict], start: float) -> list[tuple[float, float]]:
    """(mean RL seconds, mean accuracy) at each checkpoint over the seeds, from (0, the warm-up's accuracy)."""
    steps = sorted(set.intersection(*(set(r["curve"]) for r in runs)))
    return [(0.0, start)] + [
        (statistics.mean(r["elapsed"][s] for r in runs), statistics.mean(r["curve"][s] for r in runs)) for s in steps
    ]


def arm_against_arm(runs: list[dict], baseline: list[dict], checkpoints: list[int]) -> dict:
    """`runs` against `baseline`, seed by seed (the same seeds in the same order): rollouts sampled per kept group
    as a ratio of the means and per seed, and the held-out difference at each checkpoint, paired."""

    def per_kept_group(arm: list[dict]) -> float:
        return statistics.mean(run["sampling"]["per_kept_group"] for run in arm)

    paired = {
        str(step): interval([run["curve"][step] - base["curve"][step] for run, base in zip(runs, baseline)])
        for step in checkpoints
    }
    return {
        "per_kept_group_ratio": per_kept_group(runs) / per_kept_group(baseline),
        "per_kept_group_ratio_by_seed": [
            run["sampling"]["per_kept_group"] / base["sampling"]["per_kept_group"] for run, base in zip(runs, baseline)
        ],
        "paired_difference": {step: {"mean": m, "half_width": h} for step, (m, h) in paired.items()},
    }
