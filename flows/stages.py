"""Re-running one stage of an iteration, and optionally every stage after it.

Stages in order: rollout → verify → advantages → train → evaluate. `rollout` is the whole
`rl-iteration` flow (dynamic sampling needs rewards and groups to know when to stop), so its
downstream starts at train. Each stage replaces exactly its own output for the iteration and
records a new row in `runs`; the old run's row stays, so both are visible.

A stage whose inputs, config and code are unchanged since a run whose output is still in place
is skipped unless forced (flows/stage_plans.py). Without a config, each stage re-runs with the
config of its previous run for that iteration; a given config overrides it section by section
(a file holding only `verify: {verifier: process}` re-scores with the process verifier and keeps
every other setting). A downstream chain is all or nothing for the iteration's tables: if a later
stage fails, the slices the chain already replaced are put back. A model version registered by
`train` is kept (versions are never deleted; its lineage shows what it was trained on).
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from flows.evaluation import evaluate_model
from flows.iteration import compute_advantages, rl_iteration, train_policy
from flows.policies import writes_iterations
from flows.stage_plans import (
    EVALUATION_SECTIONS,
    ITERATION_OUTPUTS,
    ITERATION_SECTIONS,
    chain_settings,
    policy_version_of,
    sampled_version_of,
    stage_chain,
    trained_version_of,
)
from flows.verification import verify_iteration
from storage.fingerprints import OUTPUT_TABLE
from storage.lake import Lake
from storage.runs import utc_now


def _run_stage(lake: Lake, stage: str, iteration: int, config: dict[str, Any], force: bool) -> dict[str, Any]:
    iteration_config = {k: v for k, v in config.items() if k in ITERATION_SECTIONS}
    if stage == "rollout":
        return {
            "stage": stage,
            **rl_iteration(
                iteration_config,
                iteration,
                lake.uri,
                sampled_version_of(lake, iteration),
                force,
                policy_version_of(lake, iteration),
            ),
        }
    if stage == "verify":
        return {
            "stage": stage,
            **verify_iteration(iteration, config.get("verify"), lake.uri, force, config.get("reward")),
        }
    if stage == "advantages":
        return {
            "stage": stage,
            **compute_advantages(iteration, iteration_config, lake.uri, policy_version_of(lake, iteration), force),
        }
    if stage == "train":
        return {
            "stage": stage,
            **train_policy(iteration, config.get("train"), lake.uri, policy_version_of(lake, iteration), force),
        }
    evaluation_config = {k: v for k, v in config.items() if k in EVALUATION_SECTIONS}
    return {
        "stage": stage,
        **evaluate_model(trained_version_of(lake, iteration), evaluation_config, lake.uri, iteration, force),
    }


@flow(name="rerun-stage", log_prints=True)
@writes_iterations
def rerun_stage(
    stage: str,
    iteration: int,
    config: dict[str, Any] | None = None,
    downstream: bool = False,
    force: bool = False,
    lake_uri: str | None = None,
    through: str | None = None,
) -> list[dict[str, Any]]:
    """Re-run `stage` of `iteration` (with `downstream`, every later stage up to `through`); returns one
    summary per stage."""
    lake = Lake.open(lake_uri)
    chain = stage_chain(stage, downstream, through)
    settings = chain_settings(lake, iteration, chain, config or {})
    tables = sorted({table for name in chain for table in ITERATION_OUTPUTS[name]})
    before = {table: _version(lake, table) for table in tables}
    started = utc_now()
    results = []
    try:
        for name in chain:
            results.append(_run_stage(lake, name, iteration, settings, force))
    except BaseException:
        if results or chain[0] != "rollout":  # a failed rollout alone keeps what it sampled and scored
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
    with lake.run(
        "rerun-stage",
        "restore",
        {"tables": changed, "versions": before},
        iteration=iteration,
        prefect_flow_run_id=flow_run.id,
    ) as run:
        for table in changed:
            lake.restore(table, {"iteration": iteration}, before[table], run)
    stages = {"rollout", "verify", "advantages"} & set(chain) | (
        {"verify", "advantages"} if "rollout" in chain else set()
    )
    lake.mark_runs(
        iteration,
        stages,
        since=started,
        status="rolled_back",
        unless_in={stage: OUTPUT_TABLE[stage] for stage in stages},
    )
    print(f"iteration {iteration}: a stage failed; restored {', '.join(changed)} as they were")


@flow(name="rescore", log_prints=True)
def rescore(
    iterations: list[int],
    config: dict[str, Any] | None = None,
    through: str = "advantages",
    force: bool = False,
    lake_uri: str | None = None,
) -> list[dict[str, Any]]:
    """Re-score the chosen iterations' stored rollouts with another verifier config, then re-run the stages
    after verification up to `through` (advantages by default: groups and batch from the new scores;
    `verify` re-scores only; `train` / `evaluate` also train a branch version from each)."""
    return [
        summary
        for iteration in iterations
        for summary in rerun_stage("verify", iteration, config, through != "verify", force, lake_uri, through)
    ]
