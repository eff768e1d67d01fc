"""DAPO's dynamic sampling: keep drawing groups until the batch holds enough informative ones.

The loop is pure: it is handed a `draw_groups(n_groups, round)` function (the rollout and
verification stages through `GroupSampler`, in production; a fake in tests) that returns scored rollouts of `n_groups`
new groups, and it decides what to keep, when to stop, and what every drawn group became.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import polars as pl
from pydantic import Field

from storage.config import Strict
from storage.schemas import VERIFICATION_ROUND
from tasks.sampling.groups import filter_reason, kept, with_group_columns
from tasks.sampling.guided import GuidanceConfig
from tasks.sampling.selection import LEARNING_ZONE, SelectionConfig

HISTOGRAM_EDGES = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]


class BatchShortfall(RuntimeError):
    """The generation-round bound was reached before the batch was full, and the config says fail."""

    def __init__(self, message: str, rounds: int, short_by: int):
        super().__init__(message)
        self.rounds, self.short_by = rounds, short_by


class DynamicSamplingConfig(Strict):
    """DAPO's dynamic sampling: which groups carry signal, and how hard to try to fill the batch."""

    groups_per_batch: int = Field(16, ge=1, description="informative groups a training step consumes")
    band: tuple[float, float] = Field(
        (0.0, 1.0),
        description="keep groups whose solve rate lies strictly inside "
        "(0-1 drops only all-wrong and all-correct groups, as DAPO does)",
    )
    max_rounds: int = Field(
        4, ge=1, le=VERIFICATION_ROUND - 1, description="generation rounds before the batch is declared short"
    )
    oversample: float = Field(1.5, ge=1.0, description="groups drawn per round, relative to the groups still missing")
    on_shortfall: Literal["train_smaller", "fail"] = Field(
        "train_smaller", description="when the round bound is reached: train on the groups kept so far, or fail"
    )
    guidance: GuidanceConfig = Field(
        default_factory=GuidanceConfig,
        description="the lake's history guides which problems to draw and how many (tasks/sampling/guided.py)",
    )
    selection: SelectionConfig = Field(
        default_factory=SelectionConfig,
        description="the difficulty ledger orders each round's draw: the learning zone and unseen problems first, "
        "retired and predicted-uniform ones last (tasks/sampling/selection.py)",
    )


@dataclass
class FilledBatch:
    rollouts: pl.DataFrame  # the kept groups' rollouts, with group columns
    groups: pl.DataFrame  # every drawn group: round, solve rate, kept, filter_reason
    rounds: int
    short_by: int  # groups missing when the bound was reached (0 if full)


def fill_batch(
    draw_groups: Callable[[int, int], pl.DataFrame],
    config: DynamicSamplingConfig,
    plan: Callable[[int, int], int] | None = None,
) -> FilledBatch:
    """Rounds of `draw_groups(n, round)` until `groups_per_batch` informative groups are kept or the round bound
    is hit. `plan(missing, round)` says how many groups a round draws (guided sampling); else `oversample` ×
    missing."""
    kept_parts: list[pl.DataFrame] = []
    group_parts: list[pl.DataFrame] = []
    have = 0
    rounds = 0
    while have < config.groups_per_batch and rounds < config.max_rounds:
        rounds += 1
        missing = config.groups_per_batch - have
        wanted = plan(missing, rounds) if plan else math.ceil(missing * config.oversample)
        scored = with_group_columns(draw_groups(wanted, rounds))
        groups = (
            scored.group_by("group_id", maintain_order=True)
            .agg(pl.col("problem_id").first(), pl.col("solve_rate").first(), n_samples=pl.len())
            .with_columns(round=pl.lit(rounds), filter_reason=filter_reason(config.band))
        )
        informative = groups.filter(kept(config.band))["group_id"].to_list()
        taken, surplus = informative[:missing], informative[missing:]
        groups = groups.with_columns(
            filter_reason=pl.when(pl.col("group_id").is_in(surplus))
            .then(pl.lit("surplus"))
            .otherwise(pl.col("filter_reason"))
        )
        group_parts.append(groups.with_columns(kept=pl.col("filter_reason").is_null()))
        kept_parts.append(scored.filter(pl.col("group_id").is_in(taken)))
        have += len(taken)
    short_by = config.groups_per_batch - have
    if short_by and config.on_shortfall == "fail":
        drawn = sum(part.height for part in group_parts)
        raise BatchShortfall(
            f"after {rounds} generation rounds only {have} of {config.groups_per_batch} groups "
            f"were informative ({drawn} drawn); the problems may be too easy or too hard for "
            f"this policy: raise max_rounds, widen the band or change the level mix",
            rounds,
            short_by,
        )
    return FilledBatch(
        pl.concat(kept_parts) if kept_parts else pl.DataFrame(), pl.concat(group_parts), rounds, short_by
    )


def sampling_metrics(groups: pl.DataFrame) -> dict:
    """Share of groups filtered (surplus excluded), the solve-rate histogram, the share in the 20-50 % zone."""
    judged = groups.filter(pl.col("filter_reason").fill_null("") != "surplus")
    rates = judged["solve_rate"]
    histogram = {}
    for low, high in zip(HISTOGRAM_EDGES, HISTOGRAM_EDGES[1:]):
        inside = (rates >= low) & ((rates < high) if high < 1.0 else (rates <= high))
        histogram[f"{low:.1f}-{high:.1f}"] = int(inside.sum())
    zone = ((rates >= LEARNING_ZONE[0]) & (rates <= LEARNING_ZONE[1])).mean() if len(rates) else 0.0
    return {
        "groups": judged.height,
        "filtered_share": float((~judged["kept"]).mean()) if judged.height else 0.0,
        "solve_rate_histogram": histogram,
        "learning_zone_share": float(zone or 0.0),
    }
