"""Collapse monitoring of self-play: is the proposer still proposing valid, varied tasks of useful difficulty,
and does the policy still hold up on the human bank? Pure (frames in, frames out); the `proposal_health`
SQL view (storage/views.py) computes the same columns for `rlvr sql`, and the tripwire stops the loop.

Per iteration: proposals, valid_rate (valid / proposed), distinct_rate (parsed proposals whose task,
program and inputs, was never proposed before / parsed proposals), near_duplicate_rate (valid code tasks whose shape, the program with constants abstracted, was proposed
validly before: in an earlier iteration or earlier in this one; a SPICE challenge has no shape), mean_solve_rate and solve_rate_std
(the solver's solve rate over the valid tasks it tried: the proposals' difficulty and its spread).
"""

from __future__ import annotations

import polars as pl
from pydantic import Field

from storage.config import Strict
from tasks.tripwires import Check, fired


class TripwireConfig(Strict):
    """When self-play is judged to be collapsing, and the loop stops (null: that check is off)."""

    after: int = Field(2, ge=1, description="iterations before the first check (a cold start is allowed to be poor)")
    min_valid_rate: float | None = Field(None, ge=0, le=1, description="stop below this valid-proposal rate")
    min_distinct_rate: float | None = Field(None, ge=0, le=1, description="stop below this share of distinct tasks")
    max_near_duplicate_rate: float | None = Field(None, ge=0, le=1, description="stop above this near-duplicate rate")
    min_eval_solve_rate: float | None = Field(
        None, ge=0, le=1, description="stop below this held-out solve rate (at iterations that evaluate)"
    )


class CollapseDetected(RuntimeError):
    """A collapse tripwire fired (`selfplay.tripwire`, or `reward.tripwire` of a reward no verifier grounds): the
    loop stops (the iteration is recorded first)."""


def proposal_health(proposals: pl.DataFrame) -> pl.DataFrame:
    """One row per iteration with the collapse metrics (see the module docstring)."""
    valid = pl.col("verdict") == "valid"
    parsed = pl.col("task_key").is_not_null()
    ordered = proposals.sort("iteration", "proposal_id").with_columns(
        new_task=parsed & (pl.col("task_key").cum_count().over("task_key") == 1),
        repeated_shape=valid
        & pl.col("shape_key").is_not_null()
        & (pl.col("shape_key").cum_count().over("shape_key") > 1),
    )

    def share(part: pl.Expr, whole: pl.Expr) -> pl.Expr:
        return pl.when(whole.sum() > 0).then(part.sum() / whole.sum())

    return (
        ordered.group_by("iteration")
        .agg(
            proposals=pl.len(),
            valid=valid.sum(),
            valid_rate=valid.mean(),
            distinct_rate=share(pl.col("new_task"), parsed),
            near_duplicate_rate=share(pl.col("repeated_shape"), valid & pl.col("shape_key").is_not_null()),
            mean_solve_rate=pl.col("solve_rate").filter(valid).mean(),
            solve_rate_std=pl.col("solve_rate").filter(valid).std(),
        )
        .sort("iteration")
    )


def tripped(health: pl.DataFrame, eval_solve_rate: float | None, iteration: int, config: TripwireConfig) -> list[str]:
    """What fired at `iteration` (empty: nothing), each a sentence naming the metric, its value and the bound."""
    if iteration < config.after:
        return []
    row = health.filter(pl.col("iteration") == iteration)
    if row.is_empty():
        return []
    values = row.row(0, named=True)
    return fired(
        [
            Check(
                "valid-proposal rate",
                values["valid_rate"],
                config.min_valid_rate,
                "min_valid_rate",
                bound_shown="{:.0%}",
            ),
            Check(
                "distinct-task rate",
                values["distinct_rate"],
                config.min_distinct_rate,
                "min_distinct_rate",
                bound_shown="{:.0%}",
            ),
            Check(
                "near-duplicate rate",
                values["near_duplicate_rate"],
                config.max_near_duplicate_rate,
                "max_near_duplicate_rate",
                bound_shown="{:.0%}",
                is_max=True,
            ),
            Check(
                "held-out solve rate",
                eval_solve_rate,
                config.min_eval_solve_rate,
                "min_eval_solve_rate",
                bound_shown="{:.0%}",
            ),
        ],
        "selfplay.tripwire",
    )
