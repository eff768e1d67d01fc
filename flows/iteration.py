"""One RL iteration without the training step: rollout (with dynamic sampling's resampling rounds),
verification, and advantages. Each stage is its own run row; each writes its iteration's slice in
one commit, so re-running the iteration replaces its output instead of adding to it.

`compute_advantages` is also a flow of its own, to re-run that stage alone (another estimator,
another band) over the rollouts and rewards already stored.
"""

from __future__ import annotations

from typing import Any

import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from storage.lake import Lake
from tasks.advantages.dynamic_sampling import sampling_metrics
from tasks.advantages.stage import compute, latest_dbb_state, off_policy_logprob_sums, scored_rollouts, write
from tasks.rollout.stage import IterationConfig, current_model_version, next_iteration, sample_iteration
from trainers.grpo import TrainConfig
from trainers.stage import train_iteration

DOWNSTREAM_OF_ROLLOUT = ("groups", "advantages", "batches", "dbb_state")

sample_task = task(sample_iteration, name="rollout-and-score", cache_policy=NO_CACHE)
off_policy_task = task(off_policy_logprob_sums, name="off-policy-logprobs", cache_policy=NO_CACHE)
compute_task = task(compute, name="advantages-and-filter", cache_policy=NO_CACHE)
train_task = task(train_iteration, name="grpo-step", cache_policy=NO_CACHE)
write_task = task(write, name="write-groups-advantages-batch", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)


@flow(name="rl-iteration", log_prints=True)
def rl_iteration(config: dict[str, Any] | None = None, iteration: int | None = None, lake_uri: str | None = None,
                 model_version: int | None = None) -> dict[str, Any]:
    """Sample, score and filter one iteration's groups; write rollouts, rewards, groups, advantages, batch."""
    settings = IterationConfig.model_validate(config or {})
    lake = Lake.open(lake_uri)
    iteration = iteration if iteration is not None else next_iteration(lake)
    version = model_version if model_version is not None else current_model_version(lake, settings.rollout.base_policy)
    parameters = settings.model_dump(mode="json", include={"rollout", "dynamic_sampling"})
    key = {"iteration": iteration}
    with lake.run("rl-iteration", "rollout", {**parameters, "model_version": version}, iteration=iteration,
                  prefect_flow_run_id=flow_run.id) as run:
        sampled = sample_task(lake, settings, iteration, version)
        lake.replace("rollouts", sampled.rollouts, key, run)
        for table in DOWNSTREAM_OF_ROLLOUT:            # the iteration's earlier batch must not outlive its rollouts
            lake.replace(table, pl.DataFrame(), key, run)
    with lake.run("rl-iteration", "verify", settings.verify.model_dump(mode="json"), iteration=iteration,
                  prefect_flow_run_id=flow_run.id) as run:
        lake.replace("rewards", sampled.rewards, key, run)   # new rollouts: every old reward goes
    print(f"iteration {iteration}: model version {version}, {sampled.rounds} generation round(s), "
          f"{sampled.rollouts['group_id'].n_unique()} groups drawn")
    if sampled.failure is not None:                    # written first: what was sampled and scored is kept
        raise sampled.failure
    summary = compute_advantages(iteration, settings.model_dump(mode="json"), lake_uri)   # freshness vs the latest
    return {**summary, "rounds": sampled.rounds, "short_by": sampled.short_by,
            "rollouts": sampled.rollouts.height, "mean_reward": float(sampled.rewards["reward"].mean())}


@flow(name="compute-advantages", log_prints=True)
def compute_advantages(iteration: int, config: dict[str, Any] | None = None, lake_uri: str | None = None,
                       model_version: int | None = None) -> dict[str, Any]:
    """Groups, advantages, the batch and the DBB state of an iteration, from its stored rollouts and rewards."""
    settings = IterationConfig.model_validate(config or {})
    lake = Lake.open(lake_uri)
    if model_version is None:                          # freshness is measured against the newest policy
        model_version = current_model_version(lake, settings.rollout.base_policy)
    parameters = {**settings.model_dump(mode="json", include={"advantages", "dynamic_sampling"}),
                  "model_version": model_version}
    with lake.run("compute-advantages", "advantages", parameters, iteration=iteration,
                  prefect_flow_run_id=flow_run.id) as run:
        scored = scored_rollouts(lake, iteration, settings.advantages.verifier)
        logprob_sums = off_policy_task(lake, iteration, scored, settings.advantages, model_version,
                                       settings.rollout.device)
        results = compute_task(scored, settings.advantages, settings.dynamic_sampling, model_version,
                               latest_dbb_state(lake, iteration), logprob_sums)
        batch_id = write_task(lake, run, iteration, results)
    groups = results["groups"]
    metrics = sampling_metrics(groups)
    print(f"iteration {iteration}: {groups['kept'].sum()} of {groups.height} groups kept, batch {batch_id} "
          f"holds {results['batch'].height} rollouts; {metrics['learning_zone_share']:.0%} of groups in the 20-50 % zone")
    return {"iteration": iteration, "model_version": model_version, "batch_id": batch_id,
            "batch_rollouts": results["batch"].height, "groups_kept": int(groups["kept"].sum()),
            "run_id": run.run_id, **metrics, "groups": groups.height,
            "filter_reasons": dict(groups.group_by("filter_reason").len().rows())}



@flow(name="train-policy", log_prints=True)
def train_policy(iteration: int, config: dict[str, Any] | None = None, lake_uri: str | None = None) -> dict[str, Any]:
    """One GRPO / DAPO step on the iteration's batch; registers model version N+1."""
    settings = TrainConfig.model_validate(config or {})
    lake = Lake.open(lake_uri)
    with lake.run("train-policy", "train", settings.model_dump(mode="json"), iteration=iteration,
                  prefect_flow_run_id=flow_run.id) as run:
        result = train_task(lake, run, iteration, settings)
    if result["trained"]:
        print(f"iteration {iteration}: model version {result['model_version']} from batch {result['batch_id']} "
              f"(loss {result['loss']:.4f}, clip fraction {result['clip_fraction']:.3f}, {result['tokens']} tokens)")
    else:
        print(f"iteration {iteration}: no training step ({result['reason']}); model version stays "
              f"{result['model_version']}")
    return {**result, "run_id": run.run_id}
