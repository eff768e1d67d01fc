"""The advantage stage over the lake: an iteration's scored rollouts → groups, advantages, batch.

One round of dynamic sampling over the rollouts that exist (the resampling loop that draws more
belongs to the rollout stage, which `dynamic_sampling.fill_batch` is written for).
"""

from __future__ import annotations

from typing import Literal

import polars as pl
import pyarrow.compute as pc
from pydantic import Field

from policy.checkpoints import load_policy
from policy.hf import sequence_logprobs
from policy.sampling import sampled_temperature
from storage.config import Strict
from storage.lake import Lake
from storage.outputs import Outputs
from storage.registry import version_row
from storage.runs import Run
from storage.schemas import VERIFICATION_ROUND
from tasks.advantages.estimators import ESTIMATORS, advantages, dbb_update, with_dbb_state
from tasks.advantages.shaping import shape_overlong, staleness, truncated_importance_weight
from tasks.rewards.compose import RewardConfig, compose
from tasks.sampling.groups import group_statistics, success, with_group_columns
from tasks.sampling.rounds import DynamicSamplingConfig
from tasks.verification.engine import own_verifier
from tasks.verification.stage import composition_inputs

DEFAULT_BAND = (0.0, 1.0)
ZERO_ADVANTAGE = 1e-9


class AdvantageConfig(Strict):
    """How rewards become advantages and a batch."""

    estimator: Literal["grpo", "dr_grpo", "rloo", "batch_std", "dbb"] = Field(
        "grpo", description="how rewards become advantages (see estimators.py)"
    )
    verifier: str | None = Field(None, description="whose rewards to use; default the verifier each problem names")
    max_length: int | None = Field(None, description="L_max for overlong shaping; none disables it")
    cache_length: int = Field(256, description="L_cache: the buffer over which the penalty ramps to -factor")
    overlong_factor: float = Field(1.0, description="size of the overlong penalty")
    mask_truncated: bool = Field(False, description="mask truncated completions out of the loss instead")
    max_stale_versions: int = Field(3, ge=0, description="rollouts older than this many versions are dropped")
    importance_cap: float = Field(
        2.0,
        gt=0,
        description="truncation of the importance weight "
        "π_current(y) / π_behaviour(y) given to acceptable off-policy rollouts",
    )
    off_policy_weight: Literal["truncated", "none"] = Field(
        "truncated",
        description="acceptable (off-policy) "
        "rollouts: truncated: the weight above, from one forward "
        "pass of the current policy; none: weight 1, the loss's "
        "clipped ratio to the stored behaviour log-probs the only "
        "correction (PPO with the behaviour policy as π_old)",
    )
    dbb_discount: float = Field(0.9, gt=0, le=1, description="gamma of the Beta-Bernoulli state")


def scored_rollouts(
    lake: Lake, iteration: int, verifier: str | None, extra: tuple[str, ...] = (), reward: RewardConfig | None = None
) -> pl.DataFrame:
    """An iteration's rollouts with their rewards (`verifier`'s, or each problem's own verifier's); `reward`
    is then the reward config's composition of the stored signals (re-composed here, so a new reward config
    needs no re-scoring), and `correct` the scoring verifier's verdict."""
    by_iteration = pc.field("iteration") == iteration
    rollouts = lake.read(
        "rollouts",
        filter=by_iteration,
        columns=[
            "rollout_id",
            "group_id",
            "problem_id",
            "round",
            "model_version",
            "n_tokens",
            "finish_reason",
            "self_certainty",
            *extra,
        ],
    )
    if rollouts.is_empty():
        raise ValueError(f"iteration {iteration} has no rollouts in {lake.uri}")
    stored = lake.read(
        "rewards",
        filter=by_iteration,
        columns=["rollout_id", "verifier", "reward", "correct", "format_reward", "process_reward", "corrected_reward"],
    )
    if verifier is not None:
        rewards = stored.filter(pl.col("verifier") == verifier)
    else:  # each problem's own verifier, else its only scores
        rewards = own_verifier_first(lake, rollouts, stored).unique("rollout_id", keep="first", maintain_order=True)
    scored = rollouts.join(rewards.select("rollout_id", "reward", "correct"), on="rollout_id", how="inner")
    if scored.height < rollouts.height:
        raise ValueError(
            f"iteration {iteration}: {rollouts.height - scored.height} rollouts have no reward"
            f"{' from ' + verifier if verifier else ''}; run `rlvr verify --iteration {iteration}` first"
        )
    reward = reward or RewardConfig()
    if reward.is_default():
        return scored
    missing = set(reward.other_verifiers()) - set(stored["verifier"].unique())
    if missing:
        raise ValueError(
            f"iteration {iteration}: the reward config reads verifiers {sorted(missing)} that scored no "
            f"rollout; run `rlvr verify --iteration {iteration}` with this reward config first"
        )
    domains = lake.read(
        "problems",
        filter=pc.field("problem_id").isin(rollouts["problem_id"].unique().to_list()),
        columns=["problem_id", "domain"],
    ).unique("problem_id")
    context = rollouts.join(domains, on="problem_id", how="left")
    inputs = composition_inputs(rewards, stored.filter(pl.col("verifier").is_in(reward.other_verifiers())), context)
    composed = compose(inputs, reward).select("rollout_id", "composed_reward")
    return (
        scored.join(composed, on="rollout_id", how="left")
        .with_columns(reward=pl.col("composed_reward"))
        .drop("composed_reward")
    )


def own_verifier_first(lake: Lake, rollouts: pl.DataFrame, rewards: pl.DataFrame) -> pl.DataFrame:
    """Rewards ordered so each rollout's score by its problem's own verifier comes first (an iteration
    re-scored with another verifier holds both)."""

    problems = lake.read(
        "problems",
        filter=pc.field("problem_id").isin(rollouts["problem_id"].unique().to_list()),
        columns=["problem_id", "domain", "verifier"],
    ).unique("problem_id")
    own = pl.DataFrame(
        {
            "problem_id": problems["problem_id"],
            "own": [own_verifier(problem) for problem in problems.iter_rows(named=True)],
        },
        schema={"problem_id": pl.String, "own": pl.String},
    )
    ranked = (
        rewards.join(rollouts.select("rollout_id", "problem_id"), on="rollout_id", how="left")
        .join(own, on="problem_id", how="left")
        .with_columns(foreign=pl.col("verifier") != pl.col("own").fill_null(""))
    )
    return ranked.sort("foreign", maintain_order=True).drop("problem_id", "own", "foreign")


def compute(
    scored: pl.DataFrame,
    config: AdvantageConfig,
    sampling: DynamicSamplingConfig,
    current_version: int,
    dbb_state: pl.DataFrame | None,
    logprob_sums: pl.DataFrame | None = None,
) -> dict[str, pl.DataFrame]:
    """Pure: shaped rewards, freshness, group statistics, advantages, the batch and the new DBB state.

    The batch takes the first `groups_per_batch` informative groups in draw order (group ids sort
    by round), the same ones the resampling loop stopped on; later informative groups are `surplus`.
    Informative: solve rate strictly inside the band; with the DBB estimator and the default band, any
    non-zero advantage (an all-correct group on a historically hard problem carries signal).
    Stale rollouts stay out of groups and batch but are recorded in `advantages` as stale.
    Acceptable (off-policy) rollouts are weighted by a truncated importance weight, from
    `logprob_sums` (rollout_id, current_logprob_sum, behaviour_logprob_sum) of the current policy.
    """
    if config.estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {config.estimator!r}")
    judged = staleness(scored.with_columns(correct=success()), current_version, config.max_stale_versions)
    frame = judged.filter(pl.col("freshness") != "stale")
    stale = judged.filter(pl.col("freshness") == "stale")
    if config.max_length is not None:
        frame = shape_overlong(
            frame, config.max_length, config.cache_length, config.overlong_factor, config.mask_truncated
        )
    else:
        frame = frame.with_columns(shaped_reward=pl.col("reward"), loss_mask=pl.lit(1.0))
    statistics = group_statistics(frame, sampling.band)
    state = (
        dbb_state
        if dbb_state is not None
        else pl.DataFrame(schema={"problem_id": pl.String, "dbb_alpha": pl.Float64, "dbb_beta": pl.Float64})
    )
    shaped = frame.rename({"reward": "verifier_reward"}).with_columns(reward=pl.col("shaped_reward"))
    if config.estimator == "dbb":
        shaped = with_dbb_state(shaped, state)
    scored_rows = advantages(with_group_columns(shaped), config.estimator)
    scored_rows = with_importance_weights(scored_rows, logprob_sums, config.importance_cap, config.off_policy_weight)
    if config.estimator == "dbb" and tuple(sampling.band) == DEFAULT_BAND:  # unless the user's band says otherwise
        statistics = keep_nonzero_advantages(statistics, scored_rows)
    groups = mark_surplus(statistics, sampling.groups_per_batch)
    kept_groups = groups.filter("kept").select("group_id")
    batch_rows = scored_rows.join(kept_groups, on="group_id", how="semi")
    columns = [
        "rollout_id",
        "group_id",
        "problem_id",
        "estimator",
        "reward",
        "shaped_reward",
        "advantage",
        "loss_mask",
        "importance_weight",
        "staleness",
        "freshness",
    ]
    recorded_stale = stale.with_columns(
        shaped_reward=pl.col("reward"),
        advantage=pl.lit(0.0),
        loss_mask=pl.lit(0.0),
        importance_weight=pl.lit(None, pl.Float64),
    )
    advantage_rows = scored_rows.with_columns(reward=pl.col("verifier_reward"))
    return {
        "groups": groups,
        "advantages": pl.concat(
            [
                part.with_columns(estimator=pl.lit(config.estimator)).select(columns)
                for part in (advantage_rows, recorded_stale)
            ]
        ),
        "batch": batch_rows.select(
            "rollout_id", "group_id", "advantage", weight=pl.col("loss_mask") * pl.col("importance_weight")
        ),
        "dbb_state": dbb_update(state, frame, config.dbb_discount),
    }


def keep_nonzero_advantages(groups: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    """DBB's filter: a group is kept when any of its advantages is non-zero. Against its problem's history,
    an all-correct group on a hard problem (or an all-wrong one on an easy problem) carries signal; only a
    group whose every reward equals its baseline carries none (`zero_advantage`)."""
    signal = rows.group_by("group_id").agg(signal=pl.col("advantage").abs().max() > ZERO_ADVANTAGE)
    joined = groups.drop("kept", "filter_reason").join(signal, on="group_id", how="left")
    return (
        joined.with_columns(
            kept=pl.col("signal").fill_null(False),
            filter_reason=pl.when(pl.col("signal")).then(None).otherwise(pl.lit("zero_advantage")),
        )
        .drop("signal")
        .select(groups.columns)
    )


def with_importance_weights(
    rows: pl.DataFrame, logprob_sums: pl.DataFrame | None, cap: float, weighting: str = "truncated"
) -> pl.DataFrame:
    """`importance_weight`: 1 for fresh rows; truncated exp(log π_current − log π_behaviour) for acceptable ones
    (1 too when `weighting` is none)."""
    acceptable = rows.filter(pl.col("freshness") == "acceptable")["rollout_id"]
    if acceptable.is_empty() or weighting == "none":
        return rows.with_columns(importance_weight=pl.lit(1.0))
    if logprob_sums is None or not acceptable.is_in(logprob_sums["rollout_id"]).all():
        raise ValueError(
            f"{acceptable.len()} off-policy rollouts need the current policy's log-probs for their importance weights"
        )
    weighted = rows.join(logprob_sums, on="rollout_id", how="left")
    weight = truncated_importance_weight(pl.col("current_logprob_sum"), pl.col("behaviour_logprob_sum"), cap)
    return weighted.with_columns(
        importance_weight=pl.when(pl.col("freshness") == "acceptable").then(weight).otherwise(1.0)
    ).drop("current_logprob_sum", "behaviour_logprob_sum")


def mark_surplus(groups: pl.DataFrame, groups_per_batch: int) -> pl.DataFrame:
    """Informative groups past the first `groups_per_batch` (in group-id order) become `surplus`. RISE's in-batch
    verification groups (round `VERIFICATION_ROUND`) verify this batch's solutions: they join it outside the count."""
    counted = pl.col("kept")
    if "round" in groups.columns:
        counted = counted & (pl.col("round").fill_null(0) != VERIFICATION_ROUND)
    rank = counted.cast(pl.Int64).cum_sum().over(order_by="group_id")
    surplus = counted & (rank > groups_per_batch)
    return groups.with_columns(
        filter_reason=pl.when(surplus).then(pl.lit("surplus")).otherwise("filter_reason"),
        kept=pl.col("kept") & ~surplus,
    )


def batch_id_of(iteration: int, run: Run) -> str:
    return f"{iteration}-{run.run_id}"


def batch_outputs(iteration: int, results: dict[str, pl.DataFrame], batch_id: str) -> Outputs:
    """The stage's tables for `Lake.commit`: groups, advantages, the DBB state and the batch, each the
    iteration's slice."""
    key = {"iteration": iteration}
    column = pl.lit(iteration, pl.Int64).alias("iteration")
    return (
        Outputs()
        .replace("groups", results["groups"].with_columns(column), key)
        .replace("advantages", results["advantages"].with_columns(column), key)
        .replace("dbb_state", results["dbb_state"].with_columns(column), key)
        .replace("batches", results["batch"].with_columns(column, batch_id=pl.lit(batch_id)), key)
    )


def latest_dbb_iteration(lake: Lake, before_iteration: int) -> int | None:
    """The last iteration before `before_iteration` with a DBB state: each iteration stores the whole state, so
    only that one is read (reading every earlier state grew with the run). Most often it is the one just before:
    that slice is looked at first (one file), the whole table's iterations only when it holds none."""
    last = before_iteration - 1
    if not lake.read("dbb_state", filter=pc.field("iteration") == last, columns=["iteration"]).is_empty():
        return last
    earlier = lake.read("dbb_state", filter=pc.field("iteration") < last, columns=["iteration"])
    return None if earlier.is_empty() else int(earlier["iteration"].max())


def latest_dbb_state(lake: Lake, before_iteration: int) -> pl.DataFrame | None:
    last = latest_dbb_iteration(lake, before_iteration)
    if last is None:
        return None
    return lake.read("dbb_state", filter=pc.field("iteration") == last, columns=["problem_id", "dbb_alpha", "dbb_beta"])


def off_policy_logprob_sums(
    lake: Lake,
    iteration: int,
    scored: pl.DataFrame,
    config: AdvantageConfig,
    current_version: int,
    device: str = "cpu",
    batch_size: int = 32,
) -> pl.DataFrame | None:
    """Current-policy and behaviour log-prob sums of the iteration's acceptable (off-policy) rollouts.

    None when every rollout is fresh or stale, or with `off_policy_weight: none`: then no model is loaded.
    """
    lag = current_version - scored["model_version"]
    ids = scored.filter((lag > 0) & (lag <= config.max_stale_versions))["rollout_id"].to_list()
    if not ids or config.off_policy_weight == "none":
        return None
    import json

    import torch

    rows = lake.read(
        "rollouts",
        filter=(pc.field("iteration") == iteration) & pc.field("rollout_id").isin(ids),
        columns=["rollout_id", "prompt_token_ids", "response_token_ids", "behaviour_logprobs", "sampler", "loss_mask"],
    )
    if rows["prompt_token_ids"].null_count():
        raise ValueError(f"iteration {iteration}: off-policy rollouts without prompt tokens cannot be re-weighted")
    model, _ = load_policy(version_row(lake, current_version)["checkpoint_uri"], device)
    sums = []
    with torch.no_grad():
        for chunk in rows.iter_slices(batch_size):
            temperature = sampled_temperature(json.loads(chunk["sampler"][0] or "{}"))
            logprobs = sequence_logprobs(
                model, chunk["prompt_token_ids"].to_list(), chunk["response_token_ids"].to_list(), temperature
            )
            masks = chunk["loss_mask"].to_list() if "loss_mask" in chunk.columns else [None] * chunk.height
            sums += [
                float(lp.sum()) if mask is None else float((lp * torch.tensor(mask[: len(lp)], dtype=lp.dtype)).sum())
                for lp, mask in zip(logprobs, masks)
            ]  # an episode's tool tokens are not the policy's
    return rows.select(
        "rollout_id",
        current_logprob_sum=pl.Series(sums),
        behaviour_logprob_sum=pl.col("behaviour_logprobs").list.sum().cast(pl.Float64),
    )
