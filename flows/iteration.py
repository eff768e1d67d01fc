"""One RL iteration without the training step: rollout (with dynamic sampling's resampling rounds),
verification, and advantages. Each stage is its own run row; each writes its iteration's slice in
one commit, so re-running the iteration replaces its output instead of adding to it.

`compute_advantages` is also a flow of its own, to re-run that stage alone (another estimator,
another band) over the rollouts and rewards already stored. Each flow is a thin wrapper: it validates its
JSON parameters (a deployment's boundary) and calls its step with a typed config and an open lake, which is
what the loop calls within its own flow run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import polars as pl
import pyarrow.compute as pc
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from flows.policies import STORAGE_RETRY_DELAYS, commit_outputs, stage_task, writes_iterations
from flows.skipping import unchanged_or_fingerprint
from flows.stage_plans import advantages_key, latest_bank_version, rollout_key, train_key, trained_version, verify_key
from flows.verification import dask_runner, reward_steps_task, score_on_cluster
from storage.lake import Lake
from storage.outputs import Outputs
from storage.registry import latest_version
from tasks.advantages.stage import (
    batch_id_of,
    batch_outputs,
    compute,
    latest_dbb_state,
    off_policy_logprob_sums,
    scored_rollouts,
)
from tasks.curation.gate import admit_made, refused_but_drawn
from tasks.iteration import IterationConfig, SampledIteration, sample_iteration
from tasks.rise import verification_problems
from tasks.rollout.stage import current_model_version, next_iteration
from tasks.sampling.rounds import sampling_metrics
from tasks.selfplay.rows import problem_rows
from tasks.verification.stage import own_rewards
from trainers.grpo import TrainConfig
from trainers.stage import train_iteration

DOWNSTREAM_OF_ROLLOUT = ("groups", "advantages", "batches", "dbb_state")

sample_task = stage_task(sample_iteration, "rollout-and-score", gpu=True)
off_policy_task = stage_task(off_policy_logprob_sums, "off-policy-logprobs", gpu=True)
compute_task = task(compute, name="advantages-and-filter", cache_policy=NO_CACHE)
train_task = stage_task(train_iteration, "grpo-step", gpu=True)
write_task = stage_task(commit_outputs, "write-groups-advantages-batch", retry_delays=STORAGE_RETRY_DELAYS)


@flow(name="rl-iteration", log_prints=True)
def rl_iteration(
    config: dict[str, Any] | None = None,
    iteration: int | None = None,
    lake_uri: str | None = None,
    model_version: int | None = None,
    force: bool = True,
    training_version: int | None = None,
    advantages: bool = True,
) -> dict[str, Any]:
    """Sample, score and filter one iteration's groups; write rollouts, rewards, groups, advantages, batch.

    Freshness is measured against `training_version` (default: the latest version, which an older
    `model_version` then lags). Without `force`, an iteration already sampled by the same version, bank,
    config and code is skipped. Without `advantages`, it stops after the rewards (the overlapped loop's
    trainer computes them against the version it trains)."""
    settings = IterationConfig.model_validate(config or {})
    return iteration_step(Lake.open(lake_uri), settings, iteration, model_version, force, training_version, advantages)


@writes_iterations
def iteration_step(
    lake: Lake,
    settings: IterationConfig,
    iteration: int | None = None,
    model_version: int | None = None,
    force: bool = True,
    training_version: int | None = None,
    advantages: bool = True,
) -> dict[str, Any]:
    """`rl_iteration`'s body, with a typed config and an open lake (the loop calls it inside its own flow run:
    a subflow would cost ~0.5 s of Prefect bookkeeping per stage)."""
    iteration = iteration if iteration is not None else next_iteration(lake)
    version = model_version if model_version is not None else current_model_version(lake, settings.rollout.base_policy)
    parameters, skipped = unchanged_or_fingerprint(
        lake, rollout_key(settings, version, latest_bank_version(lake)), iteration, force
    )
    if skipped:
        return skipped
    key = {"iteration": iteration}
    with (
        lake.run("rl-iteration", "rollout", parameters, iteration=iteration, prefect_flow_run_id=flow_run.id) as run,
        scoring(settings) as score,
    ):
        sampled = sample_task(lake, settings, iteration, version, score)
        if sampled.new_problems is not None:  # self-play's or RISE's tasks enter the bank before their rollouts
            bank_added(
                lake,
                sampled.new_problems,
                iteration,
                "self-play problems" if sampled.proposals is not None else "verification tasks",
                drawn=sampled.rollouts["problem_id"].unique().to_list(),
            )
        outputs = Outputs() if sampled.proposals is None else Outputs().replace("proposals", sampled.proposals, key)
        outputs.replace("rollouts", sampled.rollouts, key)
        for table in DOWNSTREAM_OF_ROLLOUT:  # the iteration's earlier batch must not outlive its rollouts
            outputs.clear(table, key)
        lake.commit(outputs, run)
    parameters, _ = unchanged_or_fingerprint(
        lake,
        verify_key(lake, settings.verify, iteration, "rl-iteration", [run.run_id], settings.reward),
        iteration,
        True,
    )
    with lake.run("rl-iteration", "verify", parameters, iteration=iteration, prefect_flow_run_id=flow_run.id) as run:
        rewards = sampled.rewards
        if sampled.scored is not None:  # the rounds' verdicts made the reward training sees
            rewards = reward_steps_task(lake, rewards, sampled.scored, settings.verify, settings.reward)
        lake.commit(Outputs().replace("rewards", rewards, key), run)  # new rollouts: every old reward goes
    if settings.selfverify.enabled and settings.selfverify.mode == "lagged":  # later rounds draw these tasks
        bank_added(lake, self_verification_tasks(lake, settings, sampled, rewards), iteration, "verification tasks")
    print(
        f"iteration {iteration}: model version {version}, {sampled.rounds} generation round(s), "
        f"{sampled.rollouts['group_id'].n_unique()} groups drawn"
    )
    if sampled.failure is not None:  # written first: what was sampled and scored is kept
        raise sampled.failure
    summary = (
        advantages_step(lake, settings, iteration, training_version)
        if advantages
        else {"iteration": iteration, "model_version": version}
    )
    return {
        **summary,
        "rounds": sampled.rounds,
        "short_by": sampled.short_by,
        "rollouts": sampled.rollouts.height,
        "mean_reward": float(rewards["reward"].mean()),
    }


def bank_added(lake: Lake, problems, iteration: int, what: str, drawn: Iterable[str] = ()) -> int | None:
    """Problems an iteration made (self-play's proposer prompts and tasks, self-verification tasks) through the
    bank's gate (tasks/curation/gate.py), as a bank version of their own: validation, exact and near-duplicates,
    decontamination, the `bank` lease, as any curation. Fails if one the iteration `drawn` was refused."""
    admitted = admit_made(
        lake,
        problems,
        "rl-iteration",
        {"added_by_iteration": iteration, "what": what},
        iteration=iteration,
        prefect_flow_run_id=flow_run.id,
    )
    if admitted is None:
        return None
    refused = f"; {len(admitted.refused)} refused (rlvr bank stats)" if admitted.refused else ""
    print(
        f"iteration {iteration}: {admitted.kept.height} {what} added as bank version {admitted.bank_version}" + refused
    )
    refused_but_drawn(admitted, drawn)
    return admitted.bank_version


def self_verification_tasks(
    lake: Lake, settings: IterationConfig, sampled: SampledIteration, rewards: pl.DataFrame
) -> pl.DataFrame:
    """Verification tasks (tasks/rise.py) from an iteration's rollouts and their own verdicts."""
    rollouts = sampled.rollouts.select("rollout_id", "iteration", "problem_id", "response")
    problems = lake.read(
        "problems",
        filter=pc.field("problem_id").isin(rollouts["problem_id"].unique().to_list()),
        columns=["problem_id", "domain", "prompt", "steps", "source", "verifier"],
    ).unique("problem_id")
    frame = rollouts.join(problems, on="problem_id", how="inner")
    verdicts = own_rewards(rewards, frame, settings.verify.verifier).select("rollout_id", "correct")
    iteration = int(rollouts["iteration"][0])
    return problem_rows(
        verification_problems(frame.join(verdicts, on="rollout_id"), settings.selfverify, iteration)
    ).unique("problem_id", keep="first", maintain_order=True)


@contextlib.contextmanager
def scoring(settings: IterationConfig) -> Iterator[Callable | None]:
    """How the rollout stage scores its rounds: with `verify.task_runner: dask`, in chunks on one Dask
    cluster for the whole iteration (the path `rlvr verify` takes); else None, the stage's own pool."""
    if settings.verify.task_runner != "dask":
        yield None
        return
    with dask_runner(settings.verify) as runner:
        yield lambda frame: score_on_cluster(runner.client, frame, settings.verify, settings.reward)


@flow(name="compute-advantages", log_prints=True)
def compute_advantages(
    iteration: int,
    config: dict[str, Any] | None = None,
    lake_uri: str | None = None,
    model_version: int | None = None,
    force: bool = True,
) -> dict[str, Any]:
    """Groups, advantages, the batch and the DBB state of an iteration, from its stored rollouts and rewards."""
    settings = IterationConfig.model_validate(config or {})
    return advantages_step(Lake.open(lake_uri), settings, iteration, model_version, force)


@writes_iterations
def advantages_step(
    lake: Lake, settings: IterationConfig, iteration: int, model_version: int | None = None, force: bool = True
) -> dict[str, Any]:
    """`compute_advantages`' body, with a typed config and an open lake."""
    if model_version is None:  # freshness is measured against the newest policy
        model_version = current_model_version(lake, settings.rollout.base_policy)
    parameters, skipped = unchanged_or_fingerprint(
        lake, advantages_key(lake, settings, iteration, model_version), iteration, force
    )
    if skipped:
        return skipped
    with lake.run(
        "compute-advantages", "advantages", parameters, iteration=iteration, prefect_flow_run_id=flow_run.id
    ) as run:
        scored = scored_rollouts(lake, iteration, settings.advantages.verifier, reward=settings.reward)
        logprob_sums = off_policy_task(
            lake, iteration, scored, settings.advantages, model_version, settings.rollout.sampling_device()
        )
        results = compute_task(
            scored,
            settings.advantages,
            settings.dynamic_sampling,
            model_version,
            latest_dbb_state(lake, iteration),
            logprob_sums,
        )
        batch_id = batch_id_of(iteration, run)
        write_task(lake, batch_outputs(iteration, results, batch_id), run)
    groups = results["groups"]
    metrics = sampling_metrics(groups)
    print(
        f"iteration {iteration}: {groups['kept'].sum()} of {groups.height} groups kept, batch {batch_id} "
        f"holds {results['batch'].height} rollouts; {metrics['learning_zone_share']:.0%} of groups in the 20-50 % zone"
    )
    return {
        "iteration": iteration,
        "model_version": model_version,
        "batch_id": batch_id,
        "batch_rollouts": results["batch"].height,
        "groups_kept": int(groups["kept"].sum()),
        "run_id": run.run_id,
        **metrics,
        "groups": groups.height,
        "filter_reasons": dict(groups.group_by("filter_reason").len().rows()),
    }


@flow(name="train-policy", log_prints=True)
def train_policy(
    iteration: int,
    config: dict[str, Any] | None = None,
    lake_uri: str | None = None,
    parent: int | None = None,
    force: bool = True,
) -> dict[str, Any]:
    """One GRPO / DAPO step on the iteration's batch, from `parent` (default: the latest version);
    registers the next model version."""
    return train_step(Lake.open(lake_uri), TrainConfig.model_validate(config or {}), iteration, parent, force)


@writes_iterations
def train_step(
    lake: Lake, settings: TrainConfig, iteration: int, parent: int | None = None, force: bool = True
) -> dict[str, Any]:
    """`train_policy`'s body, with a typed config and an open lake."""
    parent = parent if parent is not None else latest_version(lake)
    parameters, skipped = unchanged_or_fingerprint(lake, train_key(lake, settings, iteration, parent), iteration, force)
    if skipped:
        return {**skipped, "model_version": trained_version(lake, skipped["same_as"])}
    with lake.run("train-policy", "train", parameters, iteration=iteration, prefect_flow_run_id=flow_run.id) as run:
        result = train_task(lake, run, iteration, settings, parent)
        mismatch = result.pop("mismatch", None)
        if mismatch is not None:  # the sampler-trainer gap of every trained rollout, from the version trained
            key = {"iteration": iteration, "model_version": int(mismatch["model_version"][0])}
            lake.commit(Outputs().replace("mismatch", mismatch, key), run)
    if result["trained"]:
        print(
            f"iteration {iteration}: model version {result['model_version']} from batch {result['batch_id']} "
            f"(loss {result['loss']:.4f}, clip fraction {result['clip_fraction']:.3f}, {result['tokens']} tokens)"
        )
    else:
        print(
            f"iteration {iteration}: no training step ({result['reason']}); model version stays "
            f"{result['model_version']}"
        )
    return {**result, "run_id": run.run_id}
