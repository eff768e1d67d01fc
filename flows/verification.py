"""The verification flow: score one iteration's rollouts into `rewards` (or re-score them with another
verifier), and the audit that estimates a verifier's noise."""

from __future__ import annotations

from typing import Any

import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from flows.policies import STORAGE_RETRY_DELAYS, commit_outputs, stage_task, writes_iterations
from flows.skipping import unchanged_or_fingerprint
from flows.stage_plans import verify_key
from storage.lake import Lake
from tasks.rewards.compose import RewardConfig
from tasks.verification.stage import (
    VerifyConfig,
    noise_outputs,
    reward_outputs,
    reward_steps,
    rollouts_with_problems,
    score_with_components,
)

read_task = stage_task(rollouts_with_problems, "read-rollouts", retry_delays=STORAGE_RETRY_DELAYS)
score_task = stage_task(score_with_components, "score-rollouts")
reward_steps_task = task(reward_steps, name="reward-steps", cache_policy=NO_CACHE)
write_task = stage_task(commit_outputs, "write-rewards", retry_delays=STORAGE_RETRY_DELAYS)


def chunks_of(frame: pl.DataFrame, verify: VerifyConfig) -> list[pl.DataFrame]:
    return [frame.slice(start, verify.chunk_size) for start in range(0, frame.height, verify.chunk_size)]


def score_in_chunks(frame: pl.DataFrame, verify: VerifyConfig, reward: RewardConfig) -> pl.DataFrame:
    """Score the rollouts as one task, or in chunks of `chunk_size`: one after another here, or all at once
    on a Dask cluster (each chunk a task run, scored by a worker's own verifier processes)."""
    if not verify.chunk_size or frame.height <= verify.chunk_size:
        return score_task(frame, verify, reward)
    if verify.task_runner == "local":
        return pl.concat(
            [score_task(chunk, verify, reward) for chunk in chunks_of(frame, verify)], how="diagonal_relaxed"
        )
    with dask_runner(verify) as runner:
        futures = [
            runner.submit(score_task, parameters={"frame": chunk, "config": verify, "reward": reward})
            for chunk in chunks_of(frame, verify)
        ]
        return pl.concat([future.result() for future in futures], how="diagonal_relaxed")


def score_on_cluster(client, frame: pl.DataFrame, verify: VerifyConfig, reward: RewardConfig) -> pl.DataFrame:
    """The loop's rounds, scored in chunks on the Dask cluster of an entered `dask_runner` (its client): plain
    Dask tasks, since they are submitted from inside the rollout task run, whose context cannot travel."""
    chunks = chunks_of(frame, verify) if verify.chunk_size else [frame]
    futures = client.map(score_with_components, chunks, config=verify, reward=reward, pure=False)
    scored = client.gather(futures)
    workers = {address for addresses in client.who_has(futures).values() for address in addresses}
    print(f"scored {frame.height} rollouts in {len(chunks)} chunk(s) on {len(workers)} Dask worker(s)")
    return pl.concat(scored, how="diagonal_relaxed")


def dask_runner(verify: VerifyConfig):
    """A DaskTaskRunner on the configured scheduler, or on a local cluster whose workers may start the
    verifier processes (Dask workers are daemons by default, and daemons cannot have children)."""
    try:
        import dask
        from prefect_dask import DaskTaskRunner
    except ImportError:
        raise ValueError('verify.task_runner: dask needs prefect-dask: pip install -e ".[dask]"') from None

    dask.config.set({"distributed.worker.daemon": False})
    if verify.dask_address:
        return DaskTaskRunner(address=verify.dask_address)
    return DaskTaskRunner(
        cluster_kwargs={
            "n_workers": verify.dask_workers,
            "threads_per_worker": 1,
            "processes": True,
            "dashboard_address": None,
        }
    )


@flow(name="verify-iteration", log_prints=True)
@writes_iterations
def verify_iteration(
    iteration: int,
    config: dict[str, Any] | None = None,
    lake_uri: str | None = None,
    force: bool = True,
    reward: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Score (or re-score, with another verifier config) an iteration's stored rollouts into `rewards`, with
    the reward config's other verifiers and its composed reward."""
    verify = VerifyConfig.model_validate(config or {})
    composition = RewardConfig.model_validate(reward or {})
    lake = Lake.open(lake_uri)
    parameters, skipped = unchanged_or_fingerprint(
        lake, verify_key(lake, verify, iteration, reward=composition), iteration, force
    )
    if skipped:
        return skipped
    with lake.run(
        "verify-iteration", "verify", parameters, iteration=iteration, prefect_flow_run_id=flow_run.id
    ) as run:
        frame = read_task(lake, iteration)
        rewards = score_in_chunks(frame, verify, composition)
        rewards = reward_steps_task(lake, rewards, frame, verify, composition)
        write_task(lake, reward_outputs(iteration, rewards), run)
    summary = (
        rewards.group_by("verifier", "verifier_version")
        .agg(rollouts=pl.len(), mean_reward=pl.col("reward").mean(), correct=pl.col("correct").sum())
        .sort("verifier")
    )
    return {"iteration": iteration, "run_id": run.run_id, "verifiers": summary.to_dicts()}


@flow(name="audit-verifier", log_prints=True)
def audit_verifier(
    audit_file: str,
    verifier: str | None = None,
    reference: str | None = None,
    workers: int = 2,
    lake_uri: str | None = None,
) -> dict[str, Any]:
    """Re-estimate a verifier version's noise (ρ0, ρ1 with 95 % intervals) from a labelled sample and store it
    in `verifier_noise`, where `verify.noise_correction` reads the latest one. Scheduled weekly by
    configs/deployments.yaml; `rlvr audit-verifier` runs it once."""
    from tasks.verification.stage import audit_file as audit_sample

    lake = Lake.open(lake_uri)
    name, version, noise, audit = audit_sample(audit_file, verifier, reference, workers)
    with lake.run(
        "audit-verifier", "audit", {"verifier": name, "audit": audit, **noise.__dict__}, prefect_flow_run_id=flow_run.id
    ) as run:
        lake.commit(noise_outputs(name, version, noise, audit), run)
    print(
        f"{name} {version}: rho0 (false positives) = {noise.rho0:.3f} [{noise.rho0_low:.3f}, {noise.rho0_high:.3f}] "
        f"over {noise.n_wrong} wrong, rho1 (false negatives) = {noise.rho1:.3f} [{noise.rho1_low:.3f}, "
        f"{noise.rho1_high:.3f}] over {noise.n_correct} correct"
    )
    return {"verifier": name, "verifier_version": version, "run_id": run.run_id, **noise.__dict__}
