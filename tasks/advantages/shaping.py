"""DAPO's overlong reward shaping, group filtering (dynamic sampling), and freshness.

Overlong shaping: for a response of length L with maximum L_max and buffer L_cache,
    shaped = reward + factor · min(0, −(L − (L_max − L_cache)) / L_cache), floored at −factor
(0 up to L_max − L_cache, falling linearly to −factor at L_max; DAPO's −1 for anything longer).
Or, instead, truncated completions can be masked out of the loss.

Dynamic sampling: a group whose solve rate is 0 % or 100 % has zero advantage for every sample
under GRPO, so it carries no gradient; groups outside the band are dropped with a reason.

Freshness: staleness = current model version − the rollout's; fresh (0), acceptable
(≤ max_stale_versions) or stale (dropped). Acceptable rows get a truncated importance weight.
"""

from __future__ import annotations

import polars as pl


def success() -> pl.Expr:
    """Whether a rollout counts as solved: the verifier's `correct`, or, where it gives no verdict
    (reward controls such as `random`), a reward of at least 0.5."""
    return pl.coalesce(pl.col("correct"), pl.col("reward") >= 0.5)


def overlong_penalty(max_length: int, cache_length: int, factor: float = 1.0) -> pl.Expr:
    """The shaping term for column `n_tokens`: 0, then a linear ramp to −factor over the last `cache_length` tokens."""
    if not 0 < cache_length < max_length:
        raise ValueError(f"cache_length must be in (0, max_length): got {cache_length} and {max_length}")
    ramp = -(pl.col("n_tokens") - (max_length - cache_length)) / cache_length
    return pl.min_horizontal(pl.lit(0.0), ramp).clip(lower_bound=-1.0) * factor


def shape_overlong(
    rollouts: pl.DataFrame, max_length: int, cache_length: int, factor: float = 1.0, mask_truncated: bool = False
) -> pl.DataFrame:
    """Adds `shaped_reward` (reward + penalty) and `loss_mask` (0 for truncated rows when masking)."""
    shaped = rollouts.with_columns(shaped_reward=pl.col("reward") + overlong_penalty(max_length, cache_length, factor))
    truncated = pl.col("finish_reason") == "length"
    mask = pl.when(truncated).then(0.0).otherwise(1.0) if mask_truncated else pl.lit(1.0)
    return shaped.with_columns(loss_mask=mask)


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
        n_samples=pl.len(),
        mean_reward=pl.col("reward").mean(),
        std_reward=pl.col("reward").std(ddof=1).fill_null(0.0),
        min_reward=pl.col("reward").min(),
        max_reward=pl.col("reward").max(),
        solve_rate=pl.col("correct").cast(pl.Float64).mean(),
    )
    return stats.with_columns(filter_reason=filter_reason(band)).with_columns(kept=pl.col("filter_reason").is_null())


def staleness(rollouts: pl.DataFrame, current_version: int, max_stale_versions: int = 3) -> pl.DataFrame:
    """Adds `staleness` and `freshness` (fresh, acceptable, stale)."""
    lag = current_version - pl.col("model_version")
    return rollouts.with_columns(staleness=lag).with_columns(
        freshness=pl.when(lag <= 0)
        .then(pl.lit("fresh"))
        .when(lag <= max_stale_versions)
        .then(pl.lit("acceptable"))
        .otherwise(pl.lit("stale"))
    )


def truncated_importance_weight(
    current_logprob_sum: pl.Expr, behaviour_logprob_sum: pl.Expr, cap: float = 2.0
) -> pl.Expr:
    """exp(log π_current(y) − log π_behaviour(y)) truncated at `cap` (sequence level)."""
    return (current_logprob_sum - behaviour_logprob_sum).exp().clip(upper_bound=cap)
