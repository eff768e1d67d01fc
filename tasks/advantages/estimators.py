"""Advantage estimators, vectorised over a frame of rollouts (one row per rollout, `group_id`, `reward`).

Every estimator is a Polars expression over the whole table, never a Python loop per group: the
group statistics are window columns computed in one pass (`with_group_columns`), and each
estimator is element-wise arithmetic on them, so 10 million rollouts cost about one group-by.

- grpo: (r − mean_g) / (std_g + ε), the group's sample standard deviation (ddof 1, as TRL's
  `rewards.view(-1, G).std(dim=1)`);
- dr_grpo: r − mean_g (Dr. GRPO drops the std division, which favours easy and hard groups);
- rloo: r − mean of the other G − 1 rewards of the group (leave-one-out);
- batch_std: (r − mean_g) / (std over the whole batch + ε) (TRL's `scale_rewards="batch"`);
- dbb: r − α / (α + β), a per-problem discounted Beta-Bernoulli estimate of the success rate carried
  across iterations (see `dbb_update`); a group whose rewards are all equal still carries signal
  when its problem's history says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from tasks.sampling.groups import with_group_columns

EPSILON = 1e-4

reward = pl.col("reward")
group_mean = pl.col("group_mean")


def grpo(epsilon: float = EPSILON) -> pl.Expr:
    return (reward - group_mean) / (pl.col("group_std") + epsilon)


def dr_grpo(epsilon: float = EPSILON) -> pl.Expr:
    return reward - group_mean


def rloo(epsilon: float = EPSILON) -> pl.Expr:
    size = pl.len().over("group_id")
    others = (group_mean * size - reward) / (size - 1)
    return pl.when(size > 1).then(reward - others).otherwise(0.0)


def batch_std(epsilon: float = EPSILON) -> pl.Expr:
    return (reward - group_mean) / (reward.std(ddof=1).fill_null(0.0) + epsilon)


def dbb(epsilon: float = EPSILON) -> pl.Expr:
    """Needs `dbb_alpha` and `dbb_beta`: the problem's state *before* this iteration's rewards, so the
    baseline does not depend on the samples it is subtracted from."""
    return reward - pl.col("dbb_alpha") / (pl.col("dbb_alpha") + pl.col("dbb_beta"))


ESTIMATORS: dict[str, Callable[..., pl.Expr]] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "batch_std": batch_std,
    "dbb": dbb,
}


def advantages(rollouts: pl.DataFrame, estimator: str = "grpo", epsilon: float = EPSILON) -> pl.DataFrame:
    """The rollouts (with their group columns) plus `advantage`. Which estimator produced it is a
    property of the whole batch, recorded where the batch is written, not repeated on 10 M rows."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; choose from {', '.join(ESTIMATORS)}")
    if estimator == "dbb" and not {"dbb_alpha", "dbb_beta"} <= set(rollouts.columns):
        raise ValueError("the dbb estimator needs each rollout's dbb_alpha and dbb_beta (join `dbb_state` first)")
    return with_group_columns(rollouts).with_columns(advantage=ESTIMATORS[estimator](epsilon))


def dbb_update(
    state: pl.DataFrame, rollouts: pl.DataFrame, discount: float = 0.9, prior: tuple[float, float] = (1.0, 1.0)
) -> pl.DataFrame:
    """The per-problem state after an iteration: α ← γα + successes, β ← γβ + failures.

    `state` has problem_id, dbb_alpha, dbb_beta (problems never seen start at `prior`); rollouts
    carry problem_id and a 0/1 `correct`. Problems not sampled this iteration keep their state.
    """
    counts = rollouts.group_by("problem_id").agg(
        successes=pl.col("correct").cast(pl.Float64).sum(),
        failures=(1 - pl.col("correct").cast(pl.Float64)).sum(),
    )
    merged = state.join(counts, on="problem_id", how="full", coalesce=True).with_columns(
        pl.col("dbb_alpha").fill_null(prior[0]), pl.col("dbb_beta").fill_null(prior[1])
    )
    sampled = pl.col("successes").is_not_null()
    return merged.select(
        "problem_id",
        dbb_alpha=pl.when(sampled)
        .then(discount * pl.col("dbb_alpha") + pl.col("successes"))
        .otherwise(pl.col("dbb_alpha")),
        dbb_beta=pl.when(sampled)
        .then(discount * pl.col("dbb_beta") + pl.col("failures"))
        .otherwise(pl.col("dbb_beta")),
    ).sort("problem_id")


def with_dbb_state(
    rollouts: pl.DataFrame, state: pl.DataFrame, prior: tuple[float, float] = (1.0, 1.0)
) -> pl.DataFrame:
    """Attach each rollout's problem state (the prior for problems never seen)."""
    return rollouts.join(state, on="problem_id", how="left").with_columns(
        pl.col("dbb_alpha").fill_null(prior[0]), pl.col("dbb_beta").fill_null(prior[1])
    )
