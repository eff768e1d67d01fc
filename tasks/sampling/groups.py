"""The group statistics and the keep rule dynamic sampling decides by, which the advantages stage applies again
to the stored groups: a group whose solve rate is 0 % or 100 % has zero advantage for every sample under GRPO,
so it carries no gradient; groups outside the band are dropped with a reason."""

from __future__ import annotations

import polars as pl

GROUP_COLUMNS = ("group_mean", "group_std", "solve_rate")

reward = pl.col("reward")


def success() -> pl.Expr:
    """Whether a rollout counts as solved: the verifier's `correct`, or, where it gives no verdict
    (reward controls such as `random`), a reward of at least 0.5."""
    return pl.coalesce(pl.col("correct"), pl.col("reward") >= 0.5)


def with_group_columns(rollouts: pl.DataFrame) -> pl.DataFrame:
    """Each rollout with its group's mean and sample std of reward, and solve rate (one pass)."""
    if set(GROUP_COLUMNS) <= set(rollouts.columns):
        return rollouts
    group = pl.col("group_id")
    return rollouts.with_columns(
        group_mean=reward.mean().over(group),
        group_std=reward.std(ddof=1).over(group).fill_null(0.0),
        solve_rate=pl.col("correct").cast(pl.Float64).mean().over(group),
    )


def filter_reason(band: tuple[float, float] = (0.0, 1.0)) -> pl.Expr:
    """Why dynamic sampling drops a group (null when kept): its `solve_rate` is not strictly inside the band.
    The default band (0, 1) drops the all-wrong and all-correct groups; a band past them, (−0.1, 1.1), keeps
    them."""
    low, high = band
    rate = pl.col("solve_rate")
    inside = (rate > low) & (rate < high)
    return (
        pl.when(inside)
        .then(None)
        .when(rate <= 0.0)
        .then(pl.lit("all_wrong"))
        .when(rate >= 1.0)
        .then(pl.lit("all_correct"))
        .otherwise(pl.lit("outside_band"))
    )


def kept(band: tuple[float, float] = (0.0, 1.0)) -> pl.Expr:
    """True for groups dynamic sampling keeps: the same rule as `filter_reason`, without building strings."""
    low, high = band
    rate = pl.col("solve_rate")
    return (rate > low) & (rate < high)


def keep_informative_groups(rollouts: pl.DataFrame, band: tuple[float, float] = (0.0, 1.0)) -> pl.DataFrame:
    """The rollouts of the groups dynamic sampling keeps (rollouts need their group columns)."""
    return rollouts.filter(kept(band))


def reward_statistics() -> list[pl.Expr]:
    """A group's size, reward statistics and solve rate, as aggregations: the `groups` table's columns."""
    return [
        pl.len().alias("n_samples"),
        reward.mean().alias("mean_reward"),
        reward.std(ddof=1).fill_null(0.0).alias("std_reward"),
        reward.min().alias("min_reward"),
        reward.max().alias("max_reward"),
        pl.col("correct").cast(pl.Float64).mean().alias("solve_rate"),
    ]


def group_statistics(rollouts: pl.DataFrame, band: tuple[float, float] = (0.0, 1.0)) -> pl.DataFrame:
    """One row per group: reward statistics, solve rate, and whether dynamic sampling keeps it.

    A group is kept when band[0] < solve_rate < band[1]; otherwise its reason is `all_wrong`,
    `all_correct`, or `outside_band` for a narrower band.
    """
    draw_round = [pl.col("round").first()] if "round" in rollouts.columns else []
    stats = rollouts.group_by("group_id", maintain_order=True).agg(
        pl.col("problem_id").first(),
        pl.col("model_version").first(),
        *draw_round,
        *reward_statistics(),
    )
    return stats.with_columns(filter_reason=filter_reason(band)).with_columns(kept=pl.col("filter_reason").is_null())
