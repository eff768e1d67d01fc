"""The RL loop: K iterations of rollout → verify → advantages → train → evaluate, resumable.

The loop keeps no state of its own: where to resume is read from the lake. The next iteration is
the one after the last with a row in `iteration_metrics`; if that iteration already registered a
trained version (a crash after training), it is not sampled or trained again, only evaluated and
recorded, so no iteration is repeated or lost.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any
from uuid import UUID

import polars as pl
import pyarrow.compute as pc
from prefect import flow
from prefect.runtime import flow_run
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from flows.artifacts import Publisher, publish_iteration, publishing
from flows.curation import curate_bank
from flows.evaluation import evaluate_model
from flows.policies import stage_task, writes_iterations
from flows.iteration import rl_iteration, train_policy
from flows.loop_state import resume_point
from flows.run_config import EvaluationRunConfig, RunConfig
from storage.lake import Lake
from tasks.advantages.dynamic_sampling import sampling_metrics
from tasks.curriculum.stage import current_level_weights, moved_gym_difficulty, rebalanced
from tasks.evaluation import overall_solve_rate
from tasks.progress import track
from tasks.rollout.stage import IterationConfig, current_model_version
from storage.registry import BRANCH
from trainers.stage import run_warmup, warmup_version

warmup_task = stage_task(run_warmup, "supervised-warm-up", gpu=True)


def iteration_row(lake: Lake, iteration: int, evaluation: pl.DataFrame | None) -> dict[str, Any]:
    """The iteration's metrics, read back from its tables (so a resumed iteration is recorded the same way)."""
    this = pc.field("iteration") == iteration
    groups = lake.read("groups", filter=this)
    levels = lake.read("problems", filter=pc.field("problem_id").isin(groups["problem_id"].unique().to_list()),
                       columns=["problem_id", "level"]).unique("problem_id")
    by_level = groups.join(levels, on="problem_id").group_by("level").agg(pl.col("solve_rate").mean()).sort("level")
    staleness = lake.read("advantages", filter=this, columns=["staleness"])["staleness"]
    rollouts = lake.read("rollouts", filter=this, columns=["model_version", "round"])
    rewards = lake.read("rewards", filter=this, columns=["reward"])["reward"]
    trained = lake.read("model_versions", filter=this & (pc.field("kind") != BRANCH),
                        columns=["model_version", "metrics"]).sort("model_version")
    training = json.loads(trained["metrics"][-1]) if trained.height else {}
    sampling = sampling_metrics(groups) if groups.height else {}
    return {
        "iteration": iteration, "model_version": int(rollouts["model_version"].min()) if rollouts.height else -1,
        "trained_version": int(trained["model_version"][-1]) if trained.height else None,
        "rounds": int(rollouts["round"].max()) if rollouts.height else None, "groups": groups.height,
        "groups_kept": int(groups["kept"].sum()), "filtered_share": sampling.get("filtered_share"),
        "learning_zone_share": sampling.get("learning_zone_share"),
        "mean_reward": float(rewards.mean()) if rewards.len() else None,
        "solve_rate_by_level": json.dumps({str(level): round(rate, 4) for level, rate in by_level.rows()}),
        "mean_staleness": float(staleness.mean()) if staleness.len() else None,
        "loss": training.get("loss"), "clip_fraction": training.get("clip_fraction"), "entropy": training.get("entropy"),
        "eval_solve_rate": overall_solve_rate(evaluation) if evaluation is not None else None,
        "created_at": datetime.now(timezone.utc)}


def evaluate_and_record(lake: Lake, settings: RunConfig, version: int, iteration: int) -> pl.DataFrame:
    """Held-out solve rate of `version` (the evaluation flow), read back as its `evaluations` rows."""
    evaluate_model(version, settings.model_dump(mode="json", include=set(EvaluationRunConfig.model_fields)), lake.uri,
                   iteration)
    return lake.read("evaluations", filter=pc.field("model_version") == version)


@flow(name="rl-loop", log_prints=True)
@writes_iterations
def rl_loop(config: dict[str, Any] | None = None, iterations: int | None = None,
            lake_uri: str | None = None) -> list[dict[str, Any]]:
    """Bring the lake to `iterations` RL iterations (default: the config's): a second run resumes where the
    first stopped, and a finished one has nothing left to do."""
    settings = RunConfig.model_validate(config or {})
    lake = Lake.open(lake_uri)
    iteration_config = settings.model_dump(mode="json", include=set(IterationConfig.model_fields))
    current_model_version(lake, settings.rollout.base_policy)
    if settings.warmup.enabled:
        warm = warmup_version(lake)
        if warm is None:
            with lake.run("rl-loop", "warmup", settings.warmup.model_dump(mode="json"),
                          prefect_flow_run_id=flow_run.id) as run:
                warmed = warmup_task(lake, run, settings)
            warm = warmed["model_version"]
            print(f"warm-up: model version {warm} after {warmed['steps']} steps, held-out sampled solve rate "
                  f"{warmed['solve_rate']:.1%} on {settings.warmup.eval_problems} problems")
        if lake.read("iteration_metrics", filter=pc.field("iteration") == 0).is_empty():   # the curve's start
            evaluation = evaluate_and_record(lake, settings, warm, iteration=0)
            with lake.run("rl-loop", "record", {}, iteration=0, prefect_flow_run_id=flow_run.id) as run:
                row = {"iteration": 0, "model_version": warm, "trained_version": warm,
                       "eval_solve_rate": overall_solve_rate(evaluation), "created_at": datetime.now(timezone.utc)}
                lake.replace("iteration_metrics", pl.DataFrame([row]), {"iteration": 0}, run)
    target = settings.loop.iterations if iterations is None else iterations
    total = max(0, target - resume_point(lake)[0] + 1)
    progress = create_progress_artifact(0.0, key="rl-loop-progress", description=f"{total} iterations to run")
    with publishing() as publish:                      # the artifacts are made beside the loop, not in its way
        return _iterations(lake, settings, iteration_config, total, progress, publish)


def _iterations(lake: Lake, settings: RunConfig, iteration_config: dict[str, Any], total: int, progress: UUID,
                publish: Publisher) -> list[dict[str, Any]]:
    """The next `total` iterations, each recorded in `iteration_metrics` and published as artifacts."""
    lake_uri = lake.uri
    rows = []
    for _ in track(range(total), "RL loop"):
        iteration, already_trained = resume_point(lake)
        if already_trained is None:
            if settings.curriculum.enabled:             # the latest rebalanced level mix, if any
                mix = {**iteration_config["rollout"]["mix"], "level_weights": current_level_weights(
                    lake, settings.rollout.mix.level_weights)}
                iteration_config["rollout"] = {**iteration_config["rollout"], "mix": mix}
            # the stage flows' bodies, run inside this flow run: a subflow costs ~0.5 s of Prefect bookkeeping
            rl_iteration.fn(iteration_config, iteration, lake_uri)
            version = train_policy.fn(iteration, settings.train.model_dump(mode="json"), lake_uri)["model_version"]
        else:
            version = already_trained
            print(f"iteration {iteration} already trained version {version}: evaluating and recording it")
        every = settings.loop.evaluate_every
        evaluation = evaluate_and_record(lake, settings, version, iteration) if every and iteration % every == 0 else None
        with lake.run("rl-loop", "record", {}, iteration=iteration, prefect_flow_run_id=flow_run.id) as run:
            row = iteration_row(lake, iteration, evaluation)
            lake.replace("iteration_metrics", pl.DataFrame([row]), {"iteration": iteration}, run)
        publish(publish_iteration, lake, row)           # its reads and API calls beside the next iteration
        if settings.curriculum.enabled and iteration % settings.curriculum.every == 0:
            with lake.run("rl-loop", "curriculum", settings.curriculum.model_dump(mode="json"), iteration=iteration,
                          prefect_flow_run_id=flow_run.id) as run:
                changes = rebalanced(lake, iteration, settings.curriculum, settings.rollout.mix.level_weights)
                lake.replace("curriculum", changes, {"iteration": iteration}, run)
            print("curriculum: " + ", ".join(f"level {level} {old:.0%}→{new:.0%} ({reason})" for level, old, new, reason
                                             in changes.select("level", "old_weight", "new_weight", "reason").rows()))
            if settings.curriculum.gym_difficulty:          # reasoning-gym sources move their difficulty step
                with lake.run("rl-loop", "gym-curriculum", settings.curriculum.model_dump(mode="json"),
                              iteration=iteration, prefect_flow_run_id=flow_run.id) as run:
                    moves = moved_gym_difficulty(lake, iteration, settings.curriculum,
                                                 lambda curation: curate_bank(curation, lake_uri))
                    lake.replace("gym_curriculum", moves, {"iteration": iteration}, run)
                for source, old, new, reason in moves.select("source", "old_step", "new_step", "reason").rows():
                    print(f"gym curriculum: {source} step {old}→{new} ({reason})")
        rows.append(row)
        publish(update_progress_artifact, progress, 100 * len(rows) / total)
    return rows
