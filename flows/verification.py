"""The verification flow: score one iteration's rollouts into `rewards` (or re-score them with another
verifier), and the audit that estimates a verifier's noise."""

from __future__ import annotations

from typing import Any

import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from flows.policies import stage_task
from flows.skipping import unchanged_or_fingerprint
from storage.fingerprints import run_ids
from storage.lake import Lake
from tasks.verification import (VerifyConfig, record_noise, rollouts_with_problems, score_rollouts,
                                with_noise_correction, write_rewards)
from tasks.verifiers.noise import NoiseEstimate

read_task = stage_task(rollouts_with_problems, "read-rollouts", retry_delays=[2, 5])
score_task = task(score_rollouts, name="score-rollouts", cache_policy=NO_CACHE)
correct_task = task(with_noise_correction, name="noise-correction", cache_policy=NO_CACHE)
write_task = stage_task(write_rewards, "write-rewards", retry_delays=[2, 5])


@flow(name="verify-iteration", log_prints=True)
def verify_iteration(iteration: int, config: dict[str, Any] | None = None, lake_uri: str | None = None,
                     force: bool = True) -> dict[str, Any]:
    """Score (or re-score, with another verifier config) an iteration's stored rollouts into `rewards`."""
    verify = VerifyConfig.model_validate(config or {})
    lake = Lake.open(lake_uri)
    parameters, skipped = unchanged_or_fingerprint(lake, "verify-iteration", "verify", iteration,
                                                   verify.model_dump(mode="json"),
                                                   {"rollouts": run_ids(lake, "rollouts", iteration)}, force)
    if skipped:
        return skipped
    with lake.run("verify-iteration", "verify", parameters, iteration=iteration,
                  prefect_flow_run_id=flow_run.id) as run:
        frame = read_task(lake, iteration)
        rewards = score_task(frame, verify)
        if verify.noise_correction:
            rewards = correct_task(lake, rewards)
        write_task(lake, run, iteration, rewards)
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
