"""Which stages a re-run executes, with which settings, and what each stage's fingerprint covers, worked
out from the lake alone. No Prefect here: the stage flows build their fingerprints through these
functions, and `rlvr stage` asks first whether every stage it was given would be skipped, in which
case it records the skips and starts no orchestration at all.

A stage is skipped when a completed run of it, for the same iteration, had the same fingerprint
(config, inputs and code; storage/fingerprints.py) and its output is still the one in place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc

from flows.run_config import EvaluationRunConfig
from storage.config import merged_config
from storage.fingerprints import fingerprint, in_place_run, run_ids
from storage.lake import Lake
from storage.registry import latest_version
from tasks.advantages.stage import latest_dbb_iteration
from tasks.evaluation import pinned_bank_version
from tasks.iteration import IterationConfig
from tasks.rewards.compose import RewardConfig
from tasks.verification.stage import VerifyConfig
from trainers.grpo import TrainConfig

STAGES = ("rollout", "verify", "advantages", "train", "evaluate")
ITERATION_OUTPUTS = {
    "rollout": ("rollouts", "rewards", "groups", "advantages", "batches", "dbb_state"),
    "verify": ("rewards",),
    "advantages": ("groups", "advantages", "batches", "dbb_state"),
    "train": (),
    "evaluate": (),
}
ITERATION_SECTIONS = tuple(IterationConfig.model_fields)  # rollout, dynamic_sampling, verify, advantages
EVALUATION_SECTIONS = tuple(EvaluationRunConfig.model_fields)  # the same, and evaluation
STAGE_SECTIONS = (*EVALUATION_SECTIONS, "train")  # what a re-run hands its stages (`rlvr stage --config`)
FLOW_OF = {
    "rollout": "rl-iteration",
    "verify": "verify-iteration",
    "advantages": "compute-advantages",
    "train": "train-policy",
    "evaluate": "evaluate-model",
}


@dataclass(frozen=True)
class StageKey:
    """What a stage run's output depends on: the config it records, its inputs, and (when the config holds
    settings that change only how the work is spread out) the part of the config that counts."""

    flow: str
    stage: str
    config: dict[str, Any]
    inputs: dict[str, Any]
    output_settings: dict[str, Any] | None = None

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.config if self.output_settings is None else self.output_settings, self.inputs)

    @property
    def parameters(self) -> dict[str, Any]:
        """What the run records in `runs.parameters`."""
        return {**self.config, "inputs": self.inputs, "fingerprint": self.fingerprint}


# ---- each stage's key ----------------------------------------------------------------------------------------
def latest_bank_version(lake: Lake) -> int | None:
    latest = lake.read("problems", columns=["bank_version"])["bank_version"].max()
    return None if latest is None else int(latest)


def rollout_key(settings: IterationConfig, model_version: int, bank_version: int | None) -> StageKey:
    return StageKey(
        "rl-iteration",
        "rollout",
        settings.model_dump(mode="json", include={"rollout", "dynamic_sampling"}),
        {"model_version": model_version, "bank_version": bank_version},
    )


def verify_key(
    lake: Lake,
    verify: VerifyConfig,
    iteration: int,
    flow: str = "verify-iteration",
    rollout_runs: list[str] | None = None,
    reward: RewardConfig | None = None,
) -> StageKey:
    rollouts = rollout_runs if rollout_runs is not None else run_ids(lake, "rollouts", iteration)
    config, output = verify.model_dump(mode="json"), verify.output_settings()
    if reward is not None and not reward.is_default():  # the default composition keeps older fingerprints
        config, output = ({**part, "reward": reward.model_dump(mode="json")} for part in (config, output))
    return StageKey(flow, "verify", config, {"rollouts": rollouts}, output)


def advantages_key(lake: Lake, settings: IterationConfig, iteration: int, model_version: int | None) -> StageKey:
    verifier = settings.advantages.verifier
    inputs = {
        "rollouts": run_ids(lake, "rollouts", iteration),
        "rewards": run_ids(lake, "rewards", iteration, None if verifier is None else pc.field("verifier") == verifier),
        "dbb_state": dbb_state_runs(lake, iteration),
        "model_version": model_version,
    }
    sections = {"advantages", "dynamic_sampling"} | ({"reward"} if not settings.reward.is_default() else set())
    return StageKey("compute-advantages", "advantages", settings.model_dump(mode="json", include=sections), inputs)


def dbb_state_runs(lake: Lake, iteration: int) -> list[str]:
    """The runs that wrote the DBB state the iteration's advantages start from (the latest earlier one)."""
    last = latest_dbb_iteration(lake, iteration)
    return [] if last is None else run_ids(lake, "dbb_state", last)


def train_key(lake: Lake, settings: TrainConfig, iteration: int, parent: int | None) -> StageKey:
    batch = lake.read("batches", filter=pc.field("iteration") == iteration, columns=["batch_id"])
    return StageKey(
        "train-policy",
        "train",
        settings.model_dump(mode="json"),
        {"batch_id": batch["batch_id"][0] if batch.height else None, "parent": parent},
    )


def evaluate_key(lake: Lake, settings: EvaluationRunConfig, version: int) -> StageKey:
    truth = settings.verify.model_copy(update={"verifier": None})  # evaluation scores with the problems' own
    return StageKey(
        "evaluate-model",
        "evaluate",
        settings.evaluation.model_dump(mode="json"),
        {"model_version": version, "bank_version": pinned_bank_version(lake)},
        {
            "evaluation": settings.evaluation.model_dump(mode="json"),  # what the numbers depend on
            "rollout": settings.rollout.model_dump(mode="json"),
            "verify": truth.output_settings(),
        },
    )


# ---- skipping ------------------------------------------------------------------------------------------------
def skip_if_in_place(
    lake: Lake, key: StageKey, iteration: int, force: bool, prefect_flow_run_id: str | None = None
) -> dict[str, Any] | None:
    """Unless `force`: when an identical run's output is in place, record a `skipped` run and return the skip
    summary (naming the run whose output stands); else None."""
    same_as = None if force else in_place_run(lake, key.stage, iteration, key.fingerprint)
    if same_as is None:
        return None
    run = lake.record_skipped(
        key.flow,
        key.stage,
        {**key.parameters, "same_as": same_as},
        iteration=iteration,
        prefect_flow_run_id=prefect_flow_run_id,
    )
    return {"stage": key.stage, "iteration": iteration, "skipped": True, "same_as": same_as, "run_id": run.run_id}


def config_of(parameters: dict[str, Any]) -> dict[str, Any]:
    """A recorded run's config: its parameters without what the skip check added."""
    return {key: value for key, value in parameters.items() if key not in ("inputs", "fingerprint", "same_as")}


# ---- re-running a chain of stages ----------------------------------------------------------------------------
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
    chain = list(STAGES[STAGES.index(stage) : last + 1])
    return [chain[0], *chain[3:]] if stage == "rollout" else chain  # rl-iteration includes verify and advantages


def recorded_config(lake: Lake, iteration: int | None = None, sampling: bool = False) -> dict[str, Any]:
    """The run config sections the iteration's stages (default: any iteration's) last completed with;
    sections never run are absent, so they take their defaults. Runs of a chain that was rolled back
    do not count. With `sampling` (a rollout re-run), the verify section is the one the sampling flow
    scored with, not a later re-score's, and advantages use that flow's scores."""
    completed = pc.field("status") == "completed"
    runs = lake.read(
        "runs",
        filter=completed if iteration is None else completed & (pc.field("iteration") == iteration),
        columns=["flow", "stage", "parameters", "started_at"],
    ).sort("started_at")
    config: dict[str, Any] = {}
    for flow_name, stage, text in runs.select("flow", "stage", "parameters").rows():
        parameters = config_of(json.loads(text))
        if sampling and stage == "verify" and flow_name != "rl-iteration":
            continue
        if stage in ("rollout", "advantages"):
            config.update({k: v for k, v in parameters.items() if k in ITERATION_SECTIONS})
        elif stage == "verify":  # how scoring was spread out is this machine's business, not the record's
            if "reward" in parameters:
                config["reward"] = parameters.pop("reward")
            config["verify"] = {k: v for k, v in parameters.items() if k not in VerifyConfig.EXECUTION_ONLY}
        elif stage == "train":
            config["train"] = parameters
        elif stage == "evaluate":  # a re-score with another verifier is a one-off, not a setting to keep
            config["evaluation"] = {k: v for k, v in parameters.items() if k != "verifier"}
    if sampling and "advantages" in config:
        config["advantages"] = {**config["advantages"], "verifier": None}
    return config


def chain_settings(lake: Lake, iteration: int, chain: list[str], overrides: dict[str, Any]) -> dict[str, Any]:
    """The settings a chain re-runs with: each section as the iteration last ran it, overridden section by
    section; a new verifier in a chain that re-scores also makes the advantages use its scores."""
    recorded = recorded_config(lake, iteration, sampling=chain[0] == "rollout")
    settings = merged_config(recorded, overrides)
    new_verify = overrides.get("verify") or {}
    if (
        "verify" in chain
        and "verifier" in new_verify
        and "verifier" not in (overrides.get("advantages") or {})
        and new_verify["verifier"] != (recorded.get("verify") or {}).get("verifier")
    ):
        settings["advantages"] = {**settings.get("advantages", {}), "verifier": new_verify["verifier"]}  # new scores
    return settings


def policy_version_of(lake: Lake, iteration: int) -> int | None:
    """The version current when the iteration was trained (the parent of its first trained version), else the
    latest: freshness and the training step of a re-run are measured from it, as they were the first time."""
    trained = lake.read(
        "model_versions",
        filter=(pc.field("iteration") == iteration) & (pc.field("kind") == "rl"),
        columns=["model_version", "parent_version"],
    )
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


def sampled_version_of(lake: Lake, iteration: int) -> int | None:
    """The version that sampled the iteration's rollouts (None before any were sampled)."""
    sampled = lake.read("rollouts", filter=pc.field("iteration") == iteration, columns=["model_version"])
    return int(sampled["model_version"].min()) if sampled.height else None


def stage_key(lake: Lake, stage: str, iteration: int, settings: dict[str, Any]) -> StageKey | None:
    """The key a re-run of `stage` would have now (None: it cannot be known before running, e.g. nothing
    was sampled yet, so the stage must run)."""
    iteration_settings = IterationConfig.model_validate({k: v for k, v in settings.items() if k in ITERATION_SECTIONS})
    if stage == "rollout":
        version = sampled_version_of(lake, iteration)
        return None if version is None else rollout_key(iteration_settings, version, latest_bank_version(lake))
    if stage == "verify":
        return verify_key(lake, iteration_settings.verify, iteration, reward=iteration_settings.reward)
    if stage == "advantages":
        return advantages_key(lake, iteration_settings, iteration, policy_version_of(lake, iteration))
    if stage == "train":
        return train_key(
            lake, TrainConfig.model_validate(settings.get("train") or {}), iteration, policy_version_of(lake, iteration)
        )
    try:
        version = trained_version_of(lake, iteration)
    except ValueError:
        return None
    return evaluate_key(
        lake,
        EvaluationRunConfig.model_validate({k: v for k, v in settings.items() if k in EVALUATION_SECTIONS}),
        version,
    )


def skipped_chain(
    lake: Lake, stage: str, iteration: int, overrides: dict[str, Any], downstream: bool, through: str | None
) -> list[dict[str, Any]] | None:
    """When every stage of the chain would be skipped, record the skips and return their summaries (nothing
    needs orchestrating); else None, and the chain runs as a flow."""
    chain = stage_chain(stage, downstream, through)
    settings = chain_settings(lake, iteration, chain, overrides)
    keys = [stage_key(lake, name, iteration, settings) for name in chain]
    if any(key is None or in_place_run(lake, key.stage, iteration, key.fingerprint) is None for key in keys):
        return None
    summaries = []
    for key in keys:
        summary = skip_if_in_place(lake, key, iteration, force=False)
        if key.stage == "train":
            summary["model_version"] = trained_version(lake, summary["same_as"])
        elif key.stage == "evaluate":
            summary["model_version"] = key.inputs["model_version"]
        summaries.append(summary)
    return summaries


def trained_version(lake: Lake, run_id: str) -> int | None:
    """The model version a train run registered (None if it kept no group and trained nothing)."""
    rows = lake.read("model_versions", filter=pc.field("run_id") == run_id, columns=["model_version"])
    return int(rows["model_version"][0]) if rows.height else None


def iteration_of_version(lake: Lake, version: int) -> int:
    """The iteration that trained `version` (0 for the base and warm-up versions)."""
    rows = lake.read("model_versions", filter=pc.field("model_version") == version, columns=["iteration"])
    value = rows["iteration"][0] if rows.height else None
    return int(value) if value is not None else 0
