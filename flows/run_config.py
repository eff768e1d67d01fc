"""The typed run configs the flows read, without Prefect: the command line validates a config file
(and decides whether any orchestration is needed) before it starts a server."""

from __future__ import annotations

from pydantic import Field

from tasks.curation.config import Strict
from tasks.curriculum.stage import CurriculumConfig
from tasks.evaluation import EvalConfig
from tasks.rollout.stage import IterationConfig
from trainers.grpo import TrainConfig
from trainers.warmup import WarmupConfig


class LoopConfig(Strict):
    """How many iterations, and how often to evaluate."""

    iterations: int = Field(0, ge=0, description="iterations the run should reach; a run resumes after the last "
                            "recorded one (--iterations overrides)")
    evaluate_every: int = Field(1, ge=0, description="evaluate the trained version every this many iterations; 0 = never")


class RunConfig(IterationConfig):
    """The stages of a run config that the loop reads (the bank section is the curation flow's)."""

    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    evaluation: EvalConfig = Field(default_factory=EvalConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    loop: LoopConfig = Field(default_factory=LoopConfig)


class EvaluationRunConfig(IterationConfig):
    """The sections evaluation reads: the held-out draw, plus the rollout (policy, prompt) and verify sections."""

    evaluation: EvalConfig = Field(default_factory=EvalConfig, description="the held-out draw and its sampling")
