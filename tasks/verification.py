"""The verification stage: score an iteration's rollouts into the `rewards` table.

Each rollout is joined with its problem, scored by the problem's verifier (or one named in the
config, to re-score old rollouts with a new verifier) across worker processes with a hard
per-item deadline, and written as one replace of (iteration, verifier, verifier version):
re-running replaces exactly that output, while another verifier's rewards stay beside it.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timezone
from typing import Any, ClassVar, Literal

import numpy as np
import polars as pl
import pyarrow.compute as pc
from pydantic import Field

from storage.lake import Lake
from storage.runs import Run
from tasks.curation.config import Strict
from tasks.progress import track
from tasks.verifiers.engine import MAX_RESPONSE_CHARS, Scored, VerifierPool, version_of
from tasks.verifiers.noise import NoiseEstimate, corrected_reward

PROBLEM_FIELDS = ["problem_id", "domain", "prompt", "answer", "tests", "entry_point", "verifier", "steps", "metadata",
                  "params"]


class VerifyConfig(Strict):
    """How the verification stage scores rollouts."""

    verifier: str | None = Field(None, description="score every rollout with this verifier instead of each problem's own")
    options: dict[str, dict[str, Any]] = Field(default_factory=dict, description="options per verifier name, "
                                               "e.g. {code: {partial_credit: seed}, process: {process_weight: 0.5}}")
    workers: int = Field(2, ge=0, description="worker processes; 0 scores in the orchestrator (bounded by a watchdog "
                         "thread instead of a kill)")
    item_timeout: float = Field(30.0, gt=0, description="seconds one rollout may take before its worker is killed "
                                "(or, with workers 0, its scoring interrupted); it scores 0")
    max_response_chars: int = Field(MAX_RESPONSE_CHARS, gt=0, description="longer responses score 0 ('too long') "
                                    "before any verifier reads them")
    noise_correction: bool = Field(False, description="add corrected_reward from the verifier's latest audit")
    chunk_size: int = Field(0, ge=0, description="rollouts per scoring task; 0: the iteration is one task")
    task_runner: Literal["local", "dask"] = Field("local", description="where chunks are scored: local (one "
                                                  "after another here) or dask (in parallel on a Dask cluster)")
    dask_address: str | None = Field(None, description="dask: the scheduler, e.g. tcp://scheduler:8786; "
                                     "none: a local cluster of dask_workers processes")
    dask_workers: int = Field(2, ge=1, description="dask without an address: worker processes of the local cluster")

    # How the scoring is spread out, not what it yields: left out of the stage's fingerprint.
    EXECUTION_ONLY: ClassVar[frozenset[str]] = frozenset({"workers", "chunk_size", "task_runner", "dask_address",
                                                          "dask_workers"})

    def output_settings(self) -> dict[str, Any]:
        """The settings the rewards depend on."""
        return self.model_dump(mode="json", exclude=set(self.EXECUTION_ONLY))


def rollouts_with_problems(lake: Lake, iteration: int) -> pl.DataFrame:
    """The iteration's rollouts joined with their problems. A rollout whose problem is not in the bank is kept
    (`missing_problem`): it is reported and scored as skipped, never a reason to score nothing."""
    rollouts = lake.read("rollouts", filter=pc.field("iteration") == iteration,
                         columns=["rollout_id", "iteration", "problem_id", "response"])
    if rollouts.is_empty():
        raise ValueError(f"iteration {iteration} has no rollouts in {lake.uri}")
    ids = rollouts["problem_id"].unique().to_list()
    problems = lake.read("problems", filter=pc.field("problem_id").isin(ids), columns=PROBLEM_FIELDS)
    joined = rollouts.join(problems.unique("problem_id").with_columns(missing_problem=pl.lit(False)),
                           on="problem_id", how="left")
    return joined.with_columns(pl.col("missing_problem").fill_null(True))


def verifier_pool(config: VerifyConfig) -> VerifierPool:
    return VerifierPool(workers=config.workers, item_timeout=config.item_timeout, options=config.options,
                        max_response_chars=config.max_response_chars)


def score_rollouts(frame: pl.DataFrame, config: VerifyConfig, pool: VerifierPool | None = None) -> pl.DataFrame:
    """Reward rows (without run id) for every rollout of the frame; a started `pool` is reused."""
    rows = frame.to_dicts()
    pool = pool or verifier_pool(config)
    usable = [i for i, row in enumerate(rows) if not row.get("missing_problem")]
    items = ((rows[i], rows[i]["response"], config.verifier) for i in usable)
    scored = {usable[s.index]: s for s in track(pool.score(items), "verifying", total=len(usable))}
    for i, row in enumerate(rows):
        if row.get("missing_problem"):
            name = config.verifier or "unknown"
            scored[i] = Scored(i, 0.0, None, name, "unknown" if name == "unknown" else version_of(name), 0.0,
                               {"reason": "skipped: its problem is not in the bank"})
    skipped = Counter(str(s.details["reason"]) for s in scored.values() if str(s.details.get("reason")).startswith("skipped"))
    if skipped:                                        # reported, and in each row's details; the rest is scored
        print(f"warning: {sum(skipped.values()):,} of {len(rows):,} rollouts could not be scored: "
              + "; ".join(f"{count:,} {reason}" for reason, count in skipped.items()))
    return pl.DataFrame([{
        "iteration": row["iteration"], "rollout_id": row["rollout_id"], "problem_id": row["problem_id"],
        "verifier": scored[i].verifier, "verifier_version": scored[i].verifier_version,
        "reward": scored[i].reward, "correct": scored[i].correct, "format_reward": scored[i].format_reward,
        "process_reward": scored[i].details.get("process_reward"),
        "details": json.dumps(scored[i].details, default=str),
    } for i, row in enumerate(rows)], schema_overrides={"correct": pl.Boolean, "process_reward": pl.Float64})


def latest_noise(lake: Lake, verifier: str, version: str) -> NoiseEstimate | None:
    audits = lake.read("verifier_noise", filter=(pc.field("verifier") == verifier)
                       & (pc.field("verifier_version") == version)).sort("created_at")
    if audits.is_empty():
        return None
    row = audits.row(-1, named=True)
    return NoiseEstimate(row["rho0"], row["rho1"], row["n_wrong"], row["n_correct"])


def with_noise_correction(lake: Lake, rewards: pl.DataFrame) -> pl.DataFrame:
    """Fill corrected_reward for every (verifier, version) that has an audit."""
    corrected = np.full(rewards.height, np.nan)
    groups = rewards.with_row_index().group_by("verifier", "verifier_version").agg("index")
    for verifier, version, index in groups.rows():
        noise = latest_noise(lake, verifier, version)
        if noise is not None:
            positions = np.asarray(index)
            corrected[positions] = corrected_reward(rewards["reward"].to_numpy()[positions], noise.rho0, noise.rho1)
    return rewards.with_columns(corrected_reward=pl.Series(corrected).fill_nan(None))


def write_rewards(lake: Lake, run: Run, iteration: int, rewards: pl.DataFrame) -> None:
    """One replace per (iteration, verifier, version) present in the rows."""
    for (verifier, version), part in rewards.group_by("verifier", "verifier_version"):
        lake.replace("rewards", part, {"iteration": iteration, "verifier": verifier, "verifier_version": version}, run)


def record_noise(lake: Lake, run: Run, verifier: str, version: str, noise: NoiseEstimate, audit: str) -> None:
    lake.append("verifier_noise", pl.DataFrame([{
        "verifier": verifier, "verifier_version": version, "rho0": noise.rho0, "rho1": noise.rho1,
        "n_correct": noise.n_correct, "n_wrong": noise.n_wrong, "audit": audit,
        "created_at": datetime.now(timezone.utc)}]), run)
