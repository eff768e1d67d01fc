"""Re-running one stage of an iteration, and optionally every stage after it.

Stages in order: rollout → verify → advantages → train → evaluate. `rollout` is the whole
`rl-iteration` flow (dynamic sampling needs rewards and groups to know when to stop), so its
downstream starts at train. Each stage replaces exactly its own output for the iteration and
records a new row in `runs`; the old run's row stays, so both are visible.

A stage whose inputs, config and code are unchanged since a run whose output is still in place
is skipped unless forced (storage/fingerprints.py). Without a config, each stage re-runs with the
config of its previous run for that iteration; a given config overrides it section by section
(a file holding only `verify: {verifier: process}` re-scores with the process verifier and keeps
every other setting). A downstream chain is all or nothing for the iteration's tables: if a later
stage fails, the slices the chain already replaced are put back. A model version registered by
`train` is kept (versions are never deleted; its lineage shows what it was trained on).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow.compute as pc
from prefect import flow
from prefect.runtime import flow_run

from flows.policies import writes_iterations
from flows.evaluation import EvaluationRunConfig, evaluate_model
from flows.iteration import compute_advantages, rl_iteration, train_policy
from flows.skipping import config_of
from flows.verification import verify_iteration
from storage.fingerprints import OUTPUT_TABLE
from storage.lake import Lake
from tasks.rollout.stage import IterationConfig
from tasks.verification import VerifyConfig
from storage.runs import utc_now
from tasks.curation.config import merged_config
from trainers.registry import latest_version

STAGES = ("rollout", "verify", "advantages", "train", "evaluate")
ITERATION_OUTPUTS = {"rollout": ("rollouts", "rewards", "groups", "advantages", "batches", "dbb_state"),
                     "verify": ("rewards",), "advantages": ("groups", "advantages", "batches", "dbb_state"),
                     "train": (), "evaluate": ()}
ITERATION_SECTIONS = tuple(IterationConfig.model_fields)                # rollout, dynamic_sampling, verify, advantages
EVALUATION_SECTIONS = tuple(EvaluationRunConfig.model_fields)          # the same, and evaluation


def stage_chain(stage: str, downstream: bool, through: str | None = None) -> list[str]:
    """The stages a re-run executes, in order: `stage`, then with `downstream` every later one up to
    `through` (default: evaluate)."""
    for name in (stage, through):
        if name is not None and name not in STAGES:
            raise ValueError(f"unknown stage {name!r}; stages are {', '.join(STAGES)}")
    if not downstream:
        return [stage]
    last = STAGES.index(through or "evaluate")
    if last < STAGES.index(stage):
        raise ValueError(f"--through {through} comes before {stage}; stages run {' → '.join(STAGES)}")
    chain = list(STAGES[STAGES.index(stage):last + 1])
    return [chain[0], *chain[3:]] if stage == "rollout" else chain   # rl-iteration includes verify and advantages


def recorded_config(lake: Lake, iteration: int | None = None, sampling: bool = False) -> dict[str, Any]:
    """The run config sections the iteration's stages (default: any iteration's) last completed with;
    sections never run are absent, so they take their defaults. Runs of a chain that was rolled back
    do not count. With `sampling` (a rollout re-run), the verify section is the one the sampling flow
    scored with, not a later re-score's, and advantages use that flow's scores."""
    completed = pc.field("status") == "completed"
    runs = lake.read("runs", filter=completed if iteration is None else completed & (pc.field("iteration") == iteration),
                     columns=["flow", "stage", "parameters", "started_at"]).sort("started_at")
    config: dict[str, Any] = {}
    for flow_name, stage, text in runs.select("flow", "stage", "parameters").rows():
        parameters = config_of(json.loads(text))
        if sampling and stage == "verify" and flow_name != "rl-iteration":
            continue
        if stage in ("rollout", "advantages"):
            config.update({k: v for k, v in parameters.items() if k in ITERATION_SECTIONS})
        elif stage == "verify":     # how scoring was spread out is this machine's business, not the record's
            config["verify"] = {k: v for k, v in parameters.items() if k not in VerifyConfig.EXECUTION_ONLY}
        elif stage == "train":
            config["train"] = parameters
        elif stage == "evaluate":
            config["evaluation"] = parameters
    if sampling and "advantages" in config:
        config["advantages"] = {**config["advantages"], "verifier": None}
    return config


def policy_version_of(lake: Lake, iteration: int) -> int | None:
    """The version current when the iteration was trained (the parent of its first trained version), else the
    latest: freshness and the training step of a re-run are measured from it, as they were the first time."""
    trained = lake.read("model_versions", filter=(pc.field("iteration") == iteration) & (pc.field("kind") == "rl"),
                        columns=["model_version", "parent_version"])
    if trained.height:
        return int(trained.sort("model_version")["parent_version"][0])
    return latest_version(lake)


def trained_version_of(lake: Lake, iteration: int) -> int:
    """The newest version trained on the iteration (a branch, after a re-run of its train stage); for
    iteration 0, the version the loop started from (the warm-up's, else version 0)."""
    if iteration == 0:
        start = lake.read("iteration_metrics", filter=pc.field("iteration") == 0, columns=["trained_version"])
        return int(start["trained_version"][0]) if start.height else 0
    trained = lake.read("model_versions", filter=pc.field("iteration") == iteration, columns=["model_version"])
    if trained.is_empty():
        raise ValueError(f"iteration {iteration} has no trained model version to evaluate; run its train stage first")
    return int(trained["model_version"].max())


def _run_stage(lake: Lake, stage: str, iteration: int, config: dict[str, Any], force: bool) -> dict[str, Any]:
    iteration_config = {k: v for k, v in config.items() if k in ITERATION_SECTIONS}
    if stage == "rollout":
        sampled = lake.read("rollouts", filter=pc.field("iteration") == iteration, columns=["model_version"])
        version = int(sampled["model_version"].min()) if sampled.height else None
        return {"stage": stage, **rl_iteration(iteration_config, iteration, lake.uri, version, force,
                                               policy_version_of(lake, iteration))}
    if stage == "verify":
        return {"stage": stage, **verify_iteration(iteration, config.get("verify"), lake.uri, force)}
    if stage == "advantages":
        return {"stage": stage, **compute_advantages(iteration, iteration_config, lake.uri,
                                                     policy_version_of(lake, iteration), force)}
    if stage == "train":
        return {"stage": stage, **train_policy(iteration, config.get("train"), lake.uri,
                                               policy_version_of(lake, iteration), force)}
    evaluation_config = {k: v for k, v in config.items() if k in EVALUATION_SECTIONS}
    return {"stage": stage, **evaluate_model(trained_version_of(lake, iteration), evaluation_config, lake.uri,
                                             iteration, force)}


@flow(name="rerun-stage", log_prints=True)
@writes_iterations
def rerun_stage(stage: str, iteration: int, config: dict[str, Any] | None = None, downstream: bool = False,
                force: bool = False, lake_uri: str | None = None, through: str | None = None) -> list[dict[str, Any]]:
    """Re-run `stage` of `iteration` (with `downstream`, every later stage up to `through`); returns one
    summary per stage."""
    lake = Lake.open(lake_uri)
    chain = stage_chain(stage, downstream, through)
    overrides = config or {}
    recorded = recorded_config(lake, iteration, sampling=chain[0] == "rollout")
    settings = merged_config(recorded, overrides)
    new_verify = overrides.get("verify") or {}
    if ("verify" in chain and "verifier" in new_verify and "verifier" not in (overrides.get("advantages") or {})
            and new_verify["verifier"] != (recorded.get("verify") or {}).get("verifier")):
        settings["advantages"] = {**settings.get("advantages", {}), "verifier": new_verify["verifier"]}   # new scores
    tables = sorted({table for name in chain for table in ITERATION_OUTPUTS[name]})
    before = {table: _version(lake, table) for table in tables}
    started = utc_now()
    results = []
    try:
        for name in chain:
            results.append(_run_stage(lake, name, iteration, settings, force))
    except BaseException:
        if results or chain[0] != "rollout":      # a failed rollout alone keeps what it sampled and scored
            _restore(lake, iteration, before, chain, started)
        raise
    return results


def _version(lake: Lake, table: str) -> int | None:
    delta = lake.table(table)
    return None if delta is None else delta.version()


def _restore(lake: Lake, iteration: int, before: dict[str, int | None], chain: list[str], started) -> None:
    """Put back every iteration slice the failed chain changed, under a run of its own, and mark the chain's
    completed runs `rolled_back` (their output is gone, so they are no one's recorded config)."""
    changed = [table for table, version in before.items() if _version(lake, table) != version]
    if not changed:
        return
    with lake.run("rerun-stage", "restore", {"tables": changed, "versions": before}, iteration=iteration,
                  prefect_flow_run_id=flow_run.id) as run:
        for table in changed:
            lake.restore(table, {"iteration": iteration}, before[table], run)
    stages = {"rollout", "verify", "advantages"} & set(chain) | ({"verify", "advantages"} if "rollout" in chain else set())
    lake.mark_runs(iteration, stages, since=started, status="rolled_back",
                   unless_in={stage: OUTPUT_TABLE[stage] for stage in stages})
    print(f"iteration {iteration}: a stage failed; restored {', '.join(changed)} as they were")


@flow(name="rescore", log_prints=True)
def rescore(iterations: list[int], config: dict[str, Any] | None = None, through: str = "advantages",
            force: bool = False, lake_uri: str | None = None) -> list[dict[str, Any]]:
    """Re-score the chosen iterations' stored rollouts with another verifier config, then re-run the stages
    after verification up to `through` (advantages by default: groups and batch from the new scores;
    `verify` re-scores only; `train` / `evaluate` also train a branch version from each)."""
    return [summary for iteration in iterations
            for summary in rerun_stage("verify", iteration, config, through != "verify", force, lake_uri, through)]
