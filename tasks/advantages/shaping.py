"""DAPO's overlong reward shaping and freshness (the keep rule of dynamic sampling is `tasks/sampling/groups.py`).

Overlong shaping: for a response of length L with maximum L_max and buffer L_cache,
    shaped = reward + factor · min(0, −(L − (L_max − L_cache)) / L_cache), floored at −factor
(0 up to L_max − L_cache, falling linearly to −factor at L_max; DAPO's −1 for anything longer).
Or, instead, truncated completions can be masked out of the loss.

Freshness: staleness = current model version − the rollout's; fresh (0), acceptable
(≤ max_stale_versions) or stale (dropped). Acceptable rows get a truncated importance weight.
"""

from __future__ import annotations

import polars as pl


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
