"""An external run's `groups` rows, kept per iteration so that a commit recomputes only the groups it touched.

A group's row is its reward statistics over every response stored in its iteration. OpenRLHF sends one response
a request, so recomputing the iteration at each commit read and aggregated the step again and again: quadratic
in its size. `IterationGroups` keeps an iteration's rows and each group's scored responses; a commit adds its
own responses (known in memory: no read) and recomputes the groups they belong to, and the rows are exactly
those a recomputation of the whole iteration gives. Pure: no lake, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tasks.sampling.groups import reward_statistics

# The scored responses' columns: one row per response, its reward summed over the verdicts recorded with it
SCORED = {
    "rollout_id": pl.String,
    "group_id": pl.String,
    "problem_id": pl.String,
    "model_version": pl.Int64,
    "reward": pl.Float64,
    "correct": pl.Boolean,
}


def scored(rollouts: pl.DataFrame, rewards: pl.DataFrame) -> pl.DataFrame:
    """One row per response that has a verdict: the reward its trainer was given (the verdicts recorded with it
    by the same run, summed over its reward functions; not a later re-score's) and whether a verdict says it is
    correct (null where none decides). `rollouts` and `rewards` carry `rollout_id` and `run_id`."""
    rewards = rewards.select(
        "rollout_id", "run_id", pl.col("reward").cast(pl.Float64), pl.col("correct").cast(pl.Boolean)
    )
    return (
        rollouts.join(rewards, on=["rollout_id", "run_id"], how="inner")
        .group_by("rollout_id", "group_id", "problem_id", "model_version")
        .agg(pl.col("reward").sum(), pl.col("correct").max())
        .select([pl.col(name).cast(kind) for name, kind in SCORED.items()])
    )


def group_stats(responses: pl.DataFrame, iteration: int) -> pl.DataFrame:
    """One `groups` row per group of the scored responses, by group id."""
    return (
        responses.group_by("group_id", "problem_id")
        .agg(pl.col("model_version").min(), *reward_statistics())
        .with_columns(iteration=pl.lit(iteration, pl.Int64), kept=pl.lit(True))
        .sort("group_id")
    )


@dataclass(frozen=True)
class IterationGroups:
    """An iteration's `groups` rows and each group's scored responses; `add` returns a new one, so a commit that
    fails leaves the one before it as it was."""

    iteration: int
    groups: pl.DataFrame
    responses: dict[str, pl.DataFrame]

    @classmethod
    def of(cls, responses: pl.DataFrame, iteration: int) -> IterationGroups:
        """From every scored response stored in the iteration."""
        return cls(iteration, group_stats(responses, iteration), _by_group(responses))

    def add(self, responses: pl.DataFrame) -> IterationGroups:
        """With a commit's scored responses: their groups recomputed, the others' rows kept."""
        added = _by_group(responses)
        merged = {
            **self.responses,
            **{
                group: pl.concat([self.responses[group], rows]) if group in self.responses else rows
                for group, rows in added.items()
            },
        }
        fresh = (
            group_stats(pl.concat([merged[group] for group in added]), self.iteration) if added else self.groups.clear()
        )
        kept = self.groups.filter(~pl.col("group_id").is_in(list(added)))
        return IterationGroups(self.iteration, pl.concat([kept, fresh]).sort("group_id"), merged)


def _by_group(responses: pl.DataFrame) -> dict[str, pl.DataFrame]:
    return {key[0]: rows for key, rows in responses.partition_by("group_id", as_dict=True).items()}
