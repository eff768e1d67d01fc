"""The steps of one loop iteration that the sync and the overlapped loop share: which level mix to
sample with, and what follows a training step (evaluation, the `iteration_metrics` row, the
curriculum and the iteration's artifacts)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pyarrow.compute as pc
from prefect.runtime import flow_run

from flows.artifacts import Publisher, publish_iteration
from flows.curation import curate_bank
from flows.evaluation import evaluate_model
from flows.run_config import EvaluationRunConfig, RunConfig
from storage.lake import Lake
from storage.outputs import Outputs
from storage.registry import BRANCH
from storage.schemas import VERIFICATION_ROUND
from tasks.curriculum.stage import current_level_weights, moved_gym_difficulty, rebalanced
from tasks.evaluation import overall_solve_rate
from tasks.iteration import IterationConfig
from tasks.sampling.rounds import sampling_metrics

MISMATCH_METRICS = (
    "mismatch_mean_abs_delta",
    "mismatch_kl_k3",
    "mismatch_outside_share",
    "correction_masked_share",
)

# What a run computes once and compares each iteration with, by (lake uri, iteration): the first iteration's
# self-reward health. A run holds the loop lease, so no other writer re-runs that iteration while it lives.
Baselines = dict[tuple[str, int], pl.DataFrame]


def iteration_row(lake: Lake, iteration: int, evaluation: pl.DataFrame | None) -> dict[str, Any]:
    """The iteration's metrics, read back from its tables (so a resumed iteration is recorded the same way)."""
    this = pc.field("iteration") == iteration
    groups = lake.read("groups", filter=this)  # the mix's groups: RISE's in-batch verification groups apart
    groups = groups.filter(pl.col("round").fill_null(0) != VERIFICATION_ROUND) if "round" in groups.columns else groups
    levels = lake.read(
        "problems",
        filter=pc.field("problem_id").isin(groups["problem_id"].unique().to_list()),
        columns=["problem_id", "level"],
    ).unique("problem_id")
    by_level = groups.join(levels, on="problem_id").group_by("level").agg(pl.col("solve_rate").mean()).sort("level")
    staleness = lake.read("advantages", filter=this, columns=["staleness"])["staleness"]
    rollouts = lake.read("rollouts", filter=this, columns=["model_version", "round", "self_certainty"])
    rewards = lake.read("rewards", filter=this, columns=["reward"])["reward"]
    trained = lake.read(
        "model_versions", filter=this & (pc.field("kind") != BRANCH), columns=["model_version", "metrics"]
    ).sort("model_version")
    training = json.loads(trained["metrics"][-1]) if trained.height else {}
    sampling = sampling_metrics(groups) if groups.height else {}
    return {
        "iteration": iteration,
        "model_version": int(rollouts["model_version"].min()) if rollouts.height else -1,
        "trained_version": int(trained["model_version"][-1]) if trained.height else None,
        "rounds": drawn_rounds(rollouts["round"]),
        "groups": groups.height,
        "groups_kept": int(groups["kept"].sum()),
        "filtered_share": sampling.get("filtered_share"),
        "learning_zone_share": sampling.get("learning_zone_share"),
        "mean_reward": float(rewards.mean()) if rewards.len() else None,
        "solve_rate_by_level": json.dumps({str(level): round(rate, 4) for level, rate in by_level.rows()}),
        "mean_staleness": float(staleness.mean()) if staleness.len() else None,
        "loss": training.get("loss"),
        "clip_fraction": training.get("clip_fraction"),
        "entropy": training.get("entropy"),
        "eval_solve_rate": overall_solve_rate(evaluation) if evaluation is not None else None,
        "created_at": datetime.now(UTC),
        "mean_self_certainty": rollouts["self_certainty"].mean(),
        **{name: training.get(name) for name in MISMATCH_METRICS},
    }


def drawn_rounds(rounds: pl.Series) -> int | None:
    """The generation rounds an iteration took (RISE's verification round is not one)."""
    drawn = rounds.filter(rounds.fill_null(0) != VERIFICATION_ROUND)
    return int(drawn.max()) if drawn.len() and drawn.max() is not None else None


def evaluate_and_record(lake: Lake, settings: RunConfig, version: int, iteration: int) -> pl.DataFrame:
    """Held-out solve rate of `version` (the evaluation flow), read back as its `evaluations` rows."""
    evaluate_model(
        version, settings.model_dump(mode="json", include=set(EvaluationRunConfig.model_fields)), lake.uri, iteration
    )
    return lake.read("evaluations", filter=pc.field("model_version") == version)


def iteration_sections(settings: RunConfig) -> IterationConfig:
    """The sections of a run config one iteration reads, as the iteration's own config (its fingerprint's)."""
    return IterationConfig.model_validate(settings.model_dump(include=set(IterationConfig.model_fields)))


def sampling_config(lake: Lake, settings: RunConfig, iteration_config: IterationConfig) -> IterationConfig:
    """The iteration sections to sample the next iteration with: the latest rebalanced level mix, if any."""
    if not settings.curriculum.enabled:
        return iteration_config
    rollout = iteration_config.rollout
    weights = current_level_weights(lake, settings.rollout.mix.level_weights)
    mix = rollout.mix.model_validate({**rollout.mix.model_dump(), "level_weights": weights})
    return iteration_config.model_copy(update={"rollout": rollout.model_copy(update={"mix": mix})})


def finish_iteration(
    lake: Lake,
    settings: RunConfig,
    iteration: int,
    version: int,
    artifacts: Publisher,
    baselines: Baselines | None = None,
) -> dict[str, Any]:
    """After `version` trained on `iteration`: evaluate it when due, record the iteration's row, publish its
    artifacts beside the loop, and rebalance the curriculum when due. Returns the row. `baselines`: the run's
    own (one per run, see `check_self_reward`)."""
    every = settings.loop.evaluate_every
    evaluation = evaluate_and_record(lake, settings, version, iteration) if every and iteration % every == 0 else None
    with lake.run("rl-loop", "record", {}, iteration=iteration, prefect_flow_run_id=flow_run.id) as run:
        row = iteration_row(lake, iteration, evaluation)
        lake.commit(Outputs().replace("iteration_metrics", pl.DataFrame([row]), {"iteration": iteration}), run)
    artifacts(publish_iteration, lake, row)  # its reads and API calls beside the next iteration
    if settings.curriculum.enabled and iteration % settings.curriculum.every == 0:
        rebalance(lake, settings, iteration)
    if settings.selfplay.enabled:
        check_collapse(lake, settings, iteration, row["eval_solve_rate"])
    if not settings.reward.has_external_verifier():
        check_self_reward(lake, settings, iteration, {} if baselines is None else baselines)
    return row


def check_self_reward(lake: Lake, settings: RunConfig, iteration: int, baselines: Baselines) -> None:
    """The tripwire of a reward no verifier grounds (tasks/rewards/collapse.py), after the iteration is recorded:
    the loop stops with what fired; a later `rlvr run` (with the tripwire lowered or off) resumes. The first
    iteration's part of the comparison is kept in `baselines`, so each later iteration reads its own rollouts."""
    from tasks.rewards.collapse import collapsed, self_reward_health
    from tasks.selfplay.health import CollapseDetected

    metrics = lake.read("iteration_metrics", columns=["iteration", "entropy"])
    first = int(metrics.filter(pl.col("iteration") > 0)["iteration"].min())  # 0: the warm-up, no rollouts
    key = (lake.uri, first)
    wanted = [iteration] if key in baselines else sorted({first, iteration})
    health = self_reward_health(
        lake.read("rollouts", filter=pc.field("iteration").isin(wanted), columns=["iteration", "response", "n_tokens"]),
        metrics,
    )
    if key not in baselines:
        baselines[key] = health.filter(pl.col("iteration") == first)
    health = pl.concat([baselines[key], health.filter(pl.col("iteration") != first)])  # first ≤ iteration
    fired = collapsed(health, iteration, settings.reward.tripwire)
    if fired:
        raise CollapseDetected(
            f"the self-rewarded run stopped after iteration {iteration}: "
            + "; ".join(fired)
            + ' (the reward has no verifier; see `rlvr sql "select * from iteration_metrics"`)'
        )


def check_collapse(lake: Lake, settings: RunConfig, iteration: int, eval_solve_rate: float | None) -> None:
    """Self-play's tripwire (tasks/selfplay/health.py), after the iteration is recorded: the loop stops with
    what fired; a later `rlvr run` (with the tripwire raised or off) resumes at the next iteration."""
    from tasks.selfplay.health import CollapseDetected, proposal_health, tripped

    fired = tripped(proposal_health(lake.read("proposals")), eval_solve_rate, iteration, settings.selfplay.tripwire)
    if fired:
        raise CollapseDetected(
            f"self-play stopped after iteration {iteration}: "
            + "; ".join(fired)
            + ' (see `rlvr sql "select * from proposal_health"`)'
        )


def rebalance(lake: Lake, settings: RunConfig, iteration: int) -> None:
    """The curriculum's decisions after `iteration`: the level mix, and reasoning-gym sources' difficulty."""
    with lake.run(
        "rl-loop",
        "curriculum",
        settings.curriculum.model_dump(mode="json"),
        iteration=iteration,
        prefect_flow_run_id=flow_run.id,
    ) as run:
        changes = rebalanced(lake, iteration, settings.curriculum, settings.rollout.mix.level_weights)
        lake.commit(Outputs().replace("curriculum", changes, {"iteration": iteration}), run)
    print(
        "curriculum: "
        + ", ".join(
            f"level {level} {old:.0%}→{new:.0%} ({reason})"
            for level, old, new, reason in changes.select("level", "old_weight", "new_weight", "reason").rows()
        )
    )
    if settings.curriculum.gym_difficulty:  # reasoning-gym sources move their difficulty step
        with lake.run(
            "rl-loop",
            "gym-curriculum",
            settings.curriculum.model_dump(mode="json"),
            iteration=iteration,
            prefect_flow_run_id=flow_run.id,
        ) as run:
            moves = moved_gym_difficulty(
                lake, iteration, settings.curriculum, lambda curation: curate_bank(curation, lake.uri)
            )
            lake.commit(Outputs().replace("gym_curriculum", moves, {"iteration": iteration}), run)
        for source, old, new, reason in moves.select("source", "old_step", "new_step", "reason").rows():
            print(f"gym curriculum: {source} step {old}→{new} ({reason})")
