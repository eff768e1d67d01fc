"""The verification flow: score one iteration's rollouts into `rewards` (or re-score them with another
verifier), and the audit that estimates a verifier's noise."""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from storage.lake import Lake
from tasks.verification import (VerifyConfig, record_noise, rollouts_with_problems, score_rollouts,
                                with_noise_correction, write_rewards)
from tasks.verifiers.noise import NoiseEstimate

read_task = task(rollouts_with_problems, name="read-rollouts", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)
score_task = task(score_rollouts, name="score-rollouts", cache_policy=NO_CACHE)
correct_task = task(with_noise_correction, name="noise-correction", cache_policy=NO_CACHE)
write_task = task(write_rewards, name="write-rewards", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)


@flow(name="verify-iteration", log_prints=True)
def verify_iteration(iteration: int, config: dict[str, Any] | None = None, lake_uri: str | None = None) -> dict[str, Any]:
    verify = VerifyConfig.model_validate(config or {})
    lake = Lake.open(lake_uri)
    with lake.run("verify-iteration", "verify", verify.model_dump(mode="json"), iteration=iteration,
                  prefect_flow_run_id=flow_run.id) as run:
        frame = read_task(lake, iteration)
        rewards = score_task(frame, verify)
        if verify.noise_correction:
            rewards = correct_task(lake, rewards)
        write_task(lake, run, iteration, rewards)
    import polars as pl

    summary = rewards.group_by("verifier", "verifier_version").agg(
        rollouts=pl.len(), mean_reward=pl.col("reward").mean(), correct=pl.col("correct").sum()).sort("verifier")
    return {"iteration": iteration, "run_id": run.run_id, "verifiers": summary.to_dicts()}


@flow(name="audit-verifier", log_prints=True)
def audit_verifier(verifier: str, version: str, noise: dict[str, Any], audit: str, lake_uri: str | None = None) -> str:
    lake = Lake.open(lake_uri)
    with lake.run("audit-verifier", "audit", {"verifier": verifier, "audit": audit, **noise},
                  prefect_flow_run_id=flow_run.id) as run:
        record_noise(lake, run, verifier, version, NoiseEstimate(**noise), audit)
    return run.run_id
