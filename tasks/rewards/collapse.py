"""Collapse checks for a reward no external verifier grounds (INTUITOR's self-certainty alone): a policy can raise
such a reward by writing ever shorter, ever more alike, ever more certain text. After each iteration the loop
reads three signals and stops, naming what fired, when one crosses its bound:

- entropy: the training step's mean token entropy (`iteration_metrics.entropy`) below `min_entropy`;
- length: the iteration's mean response tokens below `min_length_ratio` × the first checked iteration's;
- answer diversity: distinct final lines over rollouts, below `min_answer_diversity` (every group answering
  the same thing whatever the problem).

Pure: frames in, sentences out; `flows/loop_steps.py` wires it.
"""

from __future__ import annotations

import polars as pl
from pydantic import Field

from storage.config import Strict
from tasks.tripwires import Check, fired


class SelfRewardTripwire(Strict):
    """When a self-rewarded run is judged to be collapsing, and the loop stops (null: that check is off)."""

    after: int = Field(2, ge=1, description="iterations before the first check (a cold start may be poor)")
    min_entropy: float | None = Field(
        0.05, ge=0, description="stop below this mean token entropy (nats) of the training step"
    )
    min_length_ratio: float | None = Field(
        0.25, ge=0, description="stop when the mean response length falls below this share of the first iteration's"
    )
    min_answer_diversity: float | None = Field(
        0.05, ge=0, le=1, description="stop below this share of distinct final lines among an iteration's rollouts"
    )


def self_reward_health(rollouts: pl.DataFrame, metrics: pl.DataFrame) -> pl.DataFrame:
    """Per iteration: mean response tokens, answer diversity (distinct last non-empty lines / rollouts) and the
    training step's entropy. `rollouts`: iteration, response, n_tokens; `metrics`: iteration, entropy."""
    last_line = pl.col("response").str.strip_chars().str.split("\n").list.last().str.strip_chars().fill_null("")
    per_iteration = rollouts.group_by("iteration").agg(
        mean_tokens=pl.col("n_tokens").cast(pl.Float64).mean(), answer_diversity=last_line.n_unique() / pl.len()
    )
    return per_iteration.join(metrics.select("iteration", "entropy"), on="iteration", how="left").sort("iteration")


def collapsed(health: pl.DataFrame, iteration: int, config: SelfRewardTripwire) -> list[str]:
    """What fired at `iteration` (empty: nothing), each naming the signal, its value and the bound."""
    if iteration < config.after or health.filter(pl.col("iteration") == iteration).is_empty():
        return []
    now = health.filter(pl.col("iteration") == iteration).row(0, named=True)
    first = health.row(0, named=True)
    ratio = now["mean_tokens"] / first["mean_tokens"] if first["mean_tokens"] else None
    return fired(
        [
            Check("training entropy", now["entropy"], config.min_entropy, "min_entropy", "{:.3f} nats"),
            Check(
                "mean response length",
                ratio,
                config.min_length_ratio,
                "min_length_ratio",
                "{:.0%} of iteration " + str(first["iteration"]) + "'s",
            ),
            Check("answer diversity", now["answer_diversity"], config.min_answer_diversity, "min_answer_diversity"),
        ],
        "reward.tripwire",
    )
