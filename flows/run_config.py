"""The typed run configs the flows read, without Prefect: the command line validates a config file
(and decides whether any orchestration is needed) before it starts a server."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from policy.publish import PublishConfig
from storage.config import Strict, read_yaml, validated_config
from tasks.curation.config import CurationConfig
from tasks.curriculum.stage import CurriculumConfig
from tasks.evaluation import EvalConfig
from tasks.iteration import IterationConfig
from trainers.grpo import TrainConfig
from trainers.warmup import WarmupConfig


class LoopConfig(Strict):
    """How many iterations, how often to evaluate, and whether sampling overlaps training."""

    iterations: int = Field(
        0,
        ge=0,
        description="iterations the run should reach; a run resumes after the last "
        "recorded one (--iterations overrides)",
    )
    evaluate_every: int = Field(
        1, ge=0, description="evaluate the trained version every this many iterations; 0 = never"
    )
    mode: Literal["sync", "async"] = Field(
        "sync",
        description="sync: sample, then train, one iteration after "
        "another; async: sample the next iterations while one trains",
    )
    max_staleness: int = Field(
        2,
        ge=0,
        description="async: how many versions a batch's sampling version may lag "
        "the version that trains on it (the sampler waits rather than exceed it)",
    )
    roles: Literal["threads", "deployments"] = Field(
        "threads",
        description="async: threads runs the sampler and "
        "the trainer inside the loop's flow run; deployments runs each "
        "as a flow run of its deployment, on the workers that take them",
    )
    sampler_deployment: str = Field(
        "rollout-producer/async",
        description="roles deployments: the sampler's deployment (<flow name>/<deployment name>)",
    )
    trainer_deployment: str = Field("policy-trainer/async", description="roles deployments: the trainer's deployment")
    worker_timeout: float = Field(
        600.0,
        gt=0,
        description="roles deployments: seconds a role's flow run may wait "
        "for a worker to start it before the loop gives up (and says to start one)",
    )


class RunConfig(IterationConfig):
    """The stages of a run config that the loop reads (the bank section is the curation flow's)."""

    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    publish: PublishConfig = Field(
        default_factory=PublishConfig, description="how trained versions reach the openai backend's servers"
    )
    evaluation: EvalConfig = Field(default_factory=EvalConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    loop: LoopConfig = Field(default_factory=LoopConfig)

    @model_validator(mode="after")
    def _staleness_fits(self) -> RunConfig:
        """With `loop.mode: async`, `loop.max_staleness` ≤ `advantages.max_stale_versions` (else the overlapped loop
        drops its own batches); `train.off_policy_loss: decoupled` or a `train.rollout_correction` needs
        `advantages.off_policy_weight: none` (else the correction is applied twice)."""
        if self.loop.mode == "async" and self.loop.max_staleness > self.advantages.max_stale_versions:
            raise ValueError(
                f"loop.max_staleness {self.loop.max_staleness} exceeds advantages.max_stale_versions "
                f"{self.advantages.max_stale_versions}: the overlapped loop would drop its own batches"
            )
        if self.train.correction().mode != "none" and self.advantages.off_policy_weight == "truncated":
            what = (
                "train.off_policy_loss decoupled"
                if self.train.off_policy_loss == "decoupled"
                else f"train.rollout_correction {self.train.rollout_correction.mode}"
            )
            raise ValueError(
                f"{what} weights every off-policy token already: set "
                "advantages.off_policy_weight: none (else the correction is applied twice)"
            )
        return self


class EvaluationRunConfig(IterationConfig):
    """The sections evaluation reads: the held-out draw, plus the rollout (policy, prompt) and verify sections."""

    evaluation: EvalConfig = Field(default_factory=EvalConfig, description="the held-out draw and its sampling")


NOT_RUN_SECTIONS = ("bank",)  # a run config's sections that are not RunConfig's (the curation's)


def load_run_config(path: Path | str) -> RunConfig:
    """Every stage section of a run config except the bank (the curation flow's), validated; a misspelt section
    is an error naming the file, not ignored. Raises ValueError."""
    return _stage_sections(read_yaml(Path(path)), path)


def _stage_sections(whole: dict, path: Path | str) -> RunConfig:
    """`load_run_config` of the file already read (`whole`)."""
    unknown = sorted(set(whole) - set(RunConfig.model_fields) - set(NOT_RUN_SECTIONS))
    if unknown:
        raise ValueError(
            f"{path}: unknown section(s) {', '.join(unknown)}; a run config has "
            f"{', '.join(sorted([*RunConfig.model_fields, *NOT_RUN_SECTIONS]))}"
        )
    return validated_config(whole, path, RunConfig, tuple(RunConfig.model_fields))


def load_run_configs(path: Path | str) -> tuple[CurationConfig, RunConfig]:
    """A run config whole: its `bank:` section (the problems the run curates) and its stage sections. Errors in
    both are reported together; a file without `bank:` is said to be that, not read as a curation config. The
    file (and its `base:` files) is read once."""
    whole = read_yaml(Path(path))
    errors, curation, settings = [], None, None
    try:
        settings = _stage_sections(whole, path)
    except ValueError as error:
        errors.append(str(error))
    if "bank" not in whole:
        errors.append(
            f"{path}: a run config (what `rlvr run` reads) needs a `bank:` section, the "
            "sources of the problems the run curates and trains on; this file has none. Add one, or vary a config that has "
            "one with `base: demo.yaml` (a path relative to this file)"
        )
    else:
        try:
            curation = validated_config(whole, path, CurationConfig, section="bank")
        except ValueError as error:
            errors.append(str(error))
    if errors:
        raise ValueError("\n".join(errors))
    return curation, settings
