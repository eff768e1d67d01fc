"""The verification stage: score an iteration's rollouts into the `rewards` table.

Each rollout is joined with its problem, scored by the problem's verifier (or one named in the
config, to re-score old rollouts with a new verifier) across worker processes with a hard
per-item deadline, and written as one replace of (iteration, verifier, verifier version):
re-running replaces exactly that output, while another verifier's rewards stay beside it.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

import numpy as np
import polars as pl
import pyarrow.compute as pc
from pydantic import Field, model_validator

from storage.config import Strict
from storage.lake import Lake
from storage.outputs import Outputs
from storage.progress import track
from tasks.rewards.compose import RewardConfig, compose
from tasks.verification.engine import DEFAULT_VERIFIER, MAX_RESPONSE_CHARS, Scored, VerifierPool, version_of
from tasks.verification.files import BadLine, read_lines
from tasks.verifiers.noise import NoiseEstimate, corrected_reward, estimate_noise
from tasks.verifiers.process import warn_low_process_weight

PROBLEM_FIELDS = [
    "problem_id",
    "domain",
    "prompt",
    "answer",
    "tests",
    "entry_point",
    "verifier",
    "steps",
    "metadata",
    "params",
]
ROLLOUT_FIELDS = ["rollout_id", "iteration", "problem_id", "response", "n_tokens", "self_certainty"]


class VerifyConfig(Strict):
    """How the verification stage scores rollouts."""

    verifier: str | None = Field(
        None, description="score every rollout with this verifier instead of each problem's own"
    )
    options: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="options per verifier name, e.g. {code: {partial_credit: seed}, process: {process_weight: 0.5}}",
    )
    workers: int = Field(
        2,
        ge=0,
        description="worker processes; 0 scores in the orchestrator (bounded by a watchdog thread instead of a kill)",
    )
    item_timeout: float = Field(
        30.0,
        gt=0,
        description="seconds one rollout may take before its worker is killed "
        "(or, with workers 0, its scoring interrupted); it scores 0",
    )
    max_response_chars: int = Field(
        MAX_RESPONSE_CHARS, gt=0, description="longer responses score 0 ('too long') before any verifier reads them"
    )
    noise_correction: bool = Field(False, description="add corrected_reward from the verifier's latest audit")
    chunk_size: int = Field(0, ge=0, description="rollouts per scoring task; 0: the iteration is one task")
    task_runner: Literal["local", "dask"] = Field(
        "local",
        description="where chunks are scored: local (one after another here) or dask (in parallel on a Dask cluster)",
    )
    dask_address: str | None = Field(
        None,
        description="dask: the scheduler, e.g. tcp://scheduler:8786; none: a local cluster of dask_workers processes",
    )
    dask_workers: int = Field(2, ge=1, description="dask without an address: worker processes of the local cluster")

    # How the scoring is spread out, not what it yields: left out of the stage's fingerprint.
    EXECUTION_ONLY: ClassVar[frozenset[str]] = frozenset(
        {"workers", "chunk_size", "task_runner", "dask_address", "dask_workers"}
    )

    @model_validator(mode="after")
    def _danger_zone(self) -> VerifyConfig:
        """A warning, not a refusal: `options.process.process_weight` above 0 and at most 0.1 (the seed measured
        λ = 0.1 worse than outcome-only rewards)."""

        warn_low_process_weight(float((self.options.get("process") or {}).get("process_weight", 0.5)))
        return self

    def output_settings(self) -> dict[str, Any]:
        """The settings the rewards depend on."""
        return self.model_dump(mode="json", exclude=set(self.EXECUTION_ONLY))


def rollouts_with_problems(lake: Lake, iteration: int) -> pl.DataFrame:
    """The iteration's rollouts joined with their problems. A rollout whose problem is not in the bank is kept
    (`missing_problem`): it is reported and scored as skipped, never a reason to score nothing."""
    rollouts = lake.read("rollouts", filter=pc.field("iteration") == iteration, columns=ROLLOUT_FIELDS)
    if rollouts.is_empty():
        raise ValueError(f"iteration {iteration} has no rollouts in {lake.uri}")
    ids = rollouts["problem_id"].unique().to_list()
    problems = lake.read("problems", filter=pc.field("problem_id").isin(ids), columns=PROBLEM_FIELDS)
    joined = rollouts.join(
        problems.unique("problem_id").with_columns(missing_problem=pl.lit(False)), on="problem_id", how="left"
    )
    return joined.with_columns(pl.col("missing_problem").fill_null(True))


def verifier_pool(config: VerifyConfig) -> VerifierPool:
    return VerifierPool(
        workers=config.workers,
        item_timeout=config.item_timeout,
        options=config.options,
        max_response_chars=config.max_response_chars,
    )


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
            scored[i] = Scored(
                i,
                0.0,
                None,
                name,
                "unknown" if name == "unknown" else version_of(name),
                0.0,
                {"reason": "skipped: its problem is not in the bank"},
            )
    skipped = Counter(
        str(s.details["reason"]) for s in scored.values() if str(s.details.get("reason")).startswith("skipped")
    )
    if skipped:  # reported, and in each row's details; the rest is scored
        print(
            f"warning: {sum(skipped.values()):,} of {len(rows):,} rollouts could not be scored: "
            + "; ".join(f"{count:,} {reason}" for reason, count in skipped.items())
        )
    return pl.DataFrame(
        [
            {
                "iteration": row["iteration"],
                "rollout_id": row["rollout_id"],
                "problem_id": row["problem_id"],
                "verifier": scored[i].verifier,
                "verifier_version": scored[i].verifier_version,
                "reward": scored[i].reward,
                "correct": scored[i].correct,
                "format_reward": scored[i].format_reward,
                "process_reward": scored[i].details.get("process_reward"),
                "details": json.dumps(scored[i].details, default=str),
            }
            for i, row in enumerate(rows)
        ],
        schema_overrides={"correct": pl.Boolean, "process_reward": pl.Float64},
    )


def score_with_components(
    frame: pl.DataFrame, config: VerifyConfig, reward: RewardConfig, pool: VerifierPool | None = None
) -> pl.DataFrame:
    """Reward rows by the configured verifier (each problem's own by default) and by every other verifier the
    reward config reads (`verifier:NAME` components), each as its own rows."""
    pool = pool or verifier_pool(config)
    own = score_rollouts(frame, config, pool)
    others = [
        score_rollouts(frame, config.model_copy(update={"verifier": name}), pool) for name in reward.other_verifiers()
    ]
    return pl.concat([own, *others], how="diagonal_relaxed") if others else own


def with_composition(
    rewards: pl.DataFrame, frame: pl.DataFrame, reward: RewardConfig, verifier: str | None = None
) -> pl.DataFrame:
    """`composed_reward` and `reward_components` on the rows of each rollout's scoring verifier (`verifier`,
    else its problem's own): the reward config applied to the stored signals (tasks/rewards/compose.py)."""
    flagged = _flag_own(rewards.drop("composed_reward", "reward_components", strict=False), frame, verifier)
    own, others = flagged.filter("own"), flagged.filter(~pl.col("own"))
    composed = compose(composition_inputs(own, others, frame), reward).select(
        "rollout_id", "composed_reward", "reward_components"
    )
    return pl.concat([own.join(composed, on="rollout_id", how="left"), others], how="diagonal_relaxed").drop("own")


def own_rewards(rewards: pl.DataFrame, frame: pl.DataFrame, verifier: str | None = None) -> pl.DataFrame:
    """The reward rows of each rollout's scoring verifier (what dynamic sampling and lineage read)."""
    return _flag_own(rewards, frame, verifier).filter("own").drop("own")


def _flag_own(rewards: pl.DataFrame, frame: pl.DataFrame, verifier: str | None) -> pl.DataFrame:
    owners = frame.select("rollout_id", owner=scoring_verifier(verifier))
    return (
        rewards.join(owners, on="rollout_id", how="left")
        .with_columns(own=pl.col("verifier") == pl.col("owner"))
        .drop("owner")
    )


def scoring_verifier(verifier: str | None = None) -> pl.Expr:
    """The verifier that scores a rollout: the one configured, else its problem's own (engine.own_verifier)."""
    if verifier is not None:
        return pl.lit(verifier)
    named = pl.when(pl.col("verifier").fill_null("") != "").then(pl.col("verifier"))
    return pl.coalesce(named, pl.col("domain").replace_strict(DEFAULT_VERIFIER, default="math"), pl.lit("math"))


def composition_inputs(own: pl.DataFrame, others: pl.DataFrame, frame: pl.DataFrame) -> pl.DataFrame:
    """One row per rollout with every signal a component reads: its own verifier's reward, correct, format,
    process and corrected rewards, other verifiers' rewards as `verifier:NAME`, and the rollout's tokens,
    self-certainty and domain."""
    signals = own.select(
        "rollout_id",
        "reward",
        "correct",
        *[c for c in ("format_reward", "process_reward", "corrected_reward") if c in own.columns],
    )
    for name, part in others.partition_by("verifier", as_dict=True).items() if others.height else []:
        signals = signals.join(
            part.select("rollout_id", pl.col("reward").alias(f"verifier:{name[0]}")), on="rollout_id", how="left"
        )
    context = frame.select("rollout_id", *[c for c in ("n_tokens", "self_certainty", "domain") if c in frame.columns])
    joined = signals.join(context, on="rollout_id", how="left")
    for column, dtype in (
        ("corrected_reward", pl.Float64),
        ("process_reward", pl.Float64),
        ("self_certainty", pl.Float64),
        ("n_tokens", pl.Int64),
        ("domain", pl.String),
    ):
        if column not in joined.columns:
            joined = joined.with_columns(pl.lit(None, dtype).alias(column))
    return joined


def latest_noise(lake: Lake, verifier: str, version: str) -> NoiseEstimate | None:
    audits = lake.read(
        "verifier_noise", filter=(pc.field("verifier") == verifier) & (pc.field("verifier_version") == version)
    ).sort("created_at")
    if audits.is_empty():
        return None
    row = audits.row(-1, named=True)
    return NoiseEstimate(
        row["rho0"],
        row["rho1"],
        row["n_wrong"],
        row["n_correct"],
        row["rho0_low"],
        row["rho0_high"],
        row["rho1_low"],
        row["rho1_high"],
    )


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


def reward_steps(
    lake: Lake, rewards: pl.DataFrame, frame: pl.DataFrame, verify: VerifyConfig, reward: RewardConfig
) -> pl.DataFrame:
    """The verifiers' reward rows made the reward training sees: the noise correction of audited verifiers
    (`verify.noise_correction`, which reaches training through the reward config), then the composition."""
    if verify.noise_correction:
        rewards = with_noise_correction(lake, rewards)
    return with_composition(rewards, frame, reward, verify.verifier)


def reward_outputs(iteration: int, rewards: pl.DataFrame) -> Outputs:
    """The `rewards` slices for `Lake.commit`: one replace per (iteration, verifier, version) in the rows, so
    re-scoring with one verifier leaves another's rewards beside it."""
    outputs = Outputs()
    for (verifier, version), part in rewards.group_by("verifier", "verifier_version"):
        outputs.replace("rewards", part, {"iteration": iteration, "verifier": verifier, "verifier_version": version})
    return outputs


def noise_outputs(verifier: str, version: str, noise: NoiseEstimate, audit: str) -> Outputs:
    """An audit's row of `verifier_noise`, for `Lake.commit`."""
    return Outputs().append(
        "verifier_noise",
        pl.DataFrame(
            [
                {
                    "verifier": verifier,
                    "verifier_version": version,
                    "rho0": noise.rho0,
                    "rho1": noise.rho1,
                    "n_correct": noise.n_correct,
                    "n_wrong": noise.n_wrong,
                    "audit": audit,
                    "created_at": datetime.now(UTC),
                    "rho0_low": noise.rho0_low,
                    "rho0_high": noise.rho0_high,
                    "rho1_low": noise.rho1_low,
                    "rho1_high": noise.rho1_high,
                }
            ]
        ),
    )


def audit_file(
    path: str, verifier: str | None = None, reference: str | None = None, workers: int = 2
) -> tuple[str, str, NoiseEstimate, str]:
    """(verifier, version, noise with its intervals, what the truth was) of a verifier on a labelled sample:
    verify-file lines with a boolean `label`, or — with `reference` — the verdicts of a stricter verifier."""

    items = [line for line in read_lines(path) if not isinstance(line, BadLine)]
    if not items:
        raise ValueError(f"{path}: no usable lines")

    def verdicts(name: str | None) -> list:
        return sorted(
            VerifierPool(workers=workers).score([(p, r, name or v) for p, r, v in items]), key=lambda s: s.index
        )

    judged = verdicts(verifier)
    identities = {(s.verifier, s.verifier_version) for s in judged}
    if len(identities) != 1:
        raise ValueError(
            f"{path}: the lines are scored by {sorted(identities)}; audit one verifier at a time (--verifier)"
        )
    if reference:
        truth, audit = [s.correct for s in verdicts(reference)], f"reference verifier {reference} on {path}"
    else:
        truth, audit = [problem["label"] for problem, _, _ in items], f"labels in {path}"
        if any(t is None for t in truth):
            raise ValueError(f"{path}: every line needs a boolean `label` (or pass --reference)")
    noise = estimate_noise(np.array([bool(s.correct) for s in judged]), np.array([bool(t) for t in truth]))
    return judged[0].verifier, judged[0].verifier_version, noise, audit
