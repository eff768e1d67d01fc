"""The curriculum stage over the lake: measure solve rate per level, rebalance, record the change."""

from __future__ import annotations

import polars as pl
import pyarrow.compute as pc
from pydantic import Field

from storage.lake import Lake
from tasks.curation.config import Strict
from tasks.curriculum.rebalance import rebalance


class CurriculumConfig(Strict):
    """Adaptive level mix; the configured mix is the starting point."""

    enabled: bool = Field(False, description="rebalance the level mix during the loop")
    every: int = Field(5, ge=1, description="rebalance after every this many iterations, from their groups")
    step: float = Field(0.5, gt=0, lt=1, description="relative change of a level's weight per rebalancing")
    floor: float = Field(0.02, ge=0, lt=0.25, description="smallest share a level keeps")


def current_level_weights(lake: Lake, configured: dict[int, float]) -> dict[int, float]:
    """The latest rebalanced mix, or the configured one before any rebalancing."""
    history = lake.read("curriculum", columns=["iteration", "level", "new_weight"])
    if history.is_empty():
        return configured
    latest = history.filter(pl.col("iteration") == history["iteration"].max())
    return {int(level): float(weight) for level, weight in latest.select("level", "new_weight").rows()}


def measured_solve_rates(lake: Lake, first: int, last: int) -> dict[int, float]:
    """Mean solve rate of the drawn groups per level over iterations first..last."""
    groups = lake.read("groups", filter=(pc.field("iteration") >= first) & (pc.field("iteration") <= last),
                       columns=["problem_id", "solve_rate", "filter_reason"])
    groups = groups.filter(pl.col("filter_reason").fill_null("") != "surplus")
    levels = lake.read("problems", filter=pc.field("problem_id").isin(groups["problem_id"].unique().to_list()),
                       columns=["problem_id", "level"]).unique("problem_id")
    by_level = groups.join(levels, on="problem_id").group_by("level").agg(pl.col("solve_rate").mean())
    return {int(level): float(rate) for level, rate in by_level.rows()}


def rebalanced(lake: Lake, iteration: int, config: CurriculumConfig, configured: dict[int, float]) -> pl.DataFrame:
    """The curriculum rows of a rebalancing after `iteration` (without run id)."""
    weights = current_level_weights(lake, configured)
    rates = measured_solve_rates(lake, iteration - config.every + 1, iteration)
    changes = rebalance(weights, rates, config.step, config.floor)
    return pl.DataFrame([{"iteration": iteration, "level": c.level, "solve_rate": c.solve_rate,
                          "old_weight": c.old_weight, "new_weight": c.new_weight, "reason": c.reason}
                         for c in changes], schema_overrides={"solve_rate": pl.Float64})
