"""One RL iteration's sampling, composed: rounds of draw, sample and score until the batch is full
(`tasks/sampling/`, over the rollout stage's `sample` and the verification stage's `score`), or a self-play
iteration's proposer and solver rounds (`tasks/selfplay/`); then RISE's in-batch verification tasks
(`tasks/rise.py`). What the verifiers said becomes the reward training sees in the verification stage's own run
(`tasks/verification/stage.py:reward_steps`). `IterationConfig` is the part of a run config one iteration reads."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import polars as pl
from pydantic import Field, model_validator

from policy.sampling import Policy
from storage.config import Strict
from storage.lake import Lake
from storage.schemas import VERIFICATION_ROUND
from tasks.advantages.stage import AdvantageConfig
from tasks.rewards.compose import RewardConfig
from tasks.rise import SOURCE as SELF_VERIFY_SOURCE
from tasks.rise import SelfVerifyConfig, verification_problems
from tasks.rollout.stage import RolloutConfig, open_policy, rollout_sampler, training_bank, with_self_certainty
from tasks.sampling.rounds import BatchShortfall, DynamicSamplingConfig, fill_batch
from tasks.sampling.sampler import GroupSampler, sampling_history, selection_ledger
from tasks.sampling.selection import selection_labels
from tasks.selfplay.rows import problem_rows
from tasks.selfplay.stage import SelfPlayConfig, sample_selfplay, solve_frame, solve_problems
from tasks.verification.stage import (
    PROBLEM_FIELDS,
    VerifyConfig,
    own_rewards,
    score_with_components,
    verifier_pool,
)


class IterationConfig(Strict):
    """The sections of a run config that one RL iteration reads."""

    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    reward: RewardConfig = Field(
        default_factory=RewardConfig, description="how the reward training sees is composed (tasks/rewards/compose.py)"
    )
    advantages: AdvantageConfig = Field(default_factory=AdvantageConfig)
    selfplay: SelfPlayConfig = Field(
        default_factory=SelfPlayConfig,
        description="self-play: the policy proposes the tasks it solves (tasks/selfplay)",
    )
    selfverify: SelfVerifyConfig = Field(
        default_factory=SelfVerifyConfig,
        description="RISE: verification tasks made of the policy's own rollouts (tasks/rise.py)",
    )

    @model_validator(mode="after")
    def _verification_has_a_batch(self):
        """`selfverify.mode: in_batch` is refused with `selfplay.enabled` (it verifies the rollout stage's batch,
        and a self-play iteration samples its own): use `selfverify.mode: lagged` with self-play."""
        if self.selfplay.enabled and self.selfverify.enabled and self.selfverify.mode == "in_batch":
            raise ValueError(
                "selfverify.mode in_batch verifies the rollout stage's batch, and a self-play iteration "
                "samples its own: use selfverify.mode lagged with self-play, or turn one of them off"
            )
        return self


def needs_self_certainty(config: IterationConfig) -> bool:
    """A backend that does not report self-certainty must compute it: asked for, or the reward composes it."""
    wanted = config.rollout.self_certainty
    return config.rollout.backend != "hf" and (
        wanted or (wanted is None and "self_certainty" in config.reward.components)
    )


@dataclass
class SampledIteration:
    rollouts: pl.DataFrame
    rewards: pl.DataFrame  # the verifiers' reward rows, before the reward steps (`reward_steps`)
    rounds: int
    short_by: int
    failure: Exception | None  # a shortfall the config says must fail, or a backend error mid-way
    scored: pl.DataFrame | None = (
        None  # what was scored: rollouts with their problems (None: self-play composes its own)
    )
    proposals: pl.DataFrame | None = None  # self-play: every proposal, with its verdict and reward
    new_problems: pl.DataFrame | None = None  # self-play's prompts and valid tasks, RISE's in-batch tasks, for the bank


def sample_iteration(
    lake: Lake,
    config: IterationConfig,
    iteration: int,
    model_version: int,
    score: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
) -> SampledIteration:
    """Rounds of draw → sample → score until the batch is full or the round bound is hit.

    Each round is scored by `score` (the flow's fan-out over a Dask cluster), else by this process's
    verifier pool. A failure after the first round (a shortfall the config says must fail, an
    inference server that stays down) is returned, not raised, so that the rollouts and rewards
    already paid for are written before the iteration fails.
    """
    policy, tokenizer = open_policy(lake, config.rollout, model_version)
    verification_tasks = None
    if needs_self_certainty(config):
        policy = with_self_certainty(lake, policy, config.rollout, model_version)
    if config.selfplay.enabled:
        return _selfplay_iteration(lake, config, iteration, model_version, policy, tokenizer, score)
    bank = training_bank(lake, config.rollout.mix)
    rounds, short_by, failure = 0, 0, None
    lagged = config.selfverify.enabled and config.selfverify.mode == "lagged"
    try:
        with verifier_pool(config.verify) if score is None else contextlib.nullcontext() as pool:
            score = score or (lambda frame: score_with_components(frame, config.verify, config.reward, pool))
            sampler = GroupSampler(
                rollout_sampler(policy, tokenizer, config.rollout, iteration, model_version),
                score,
                bank,
                config.dynamic_sampling,
                config.rollout.mix,
                config.rollout.group_size,
                config.rollout.seed,
                iteration,
                config.verify.verifier,
                reserved_source=SELF_VERIFY_SOURCE,
                reserved_share=config.selfverify.ratio if lagged else 0.0,
                history=sampling_history(lake, config.dynamic_sampling, iteration),
                labels=bank_labels(lake, config, bank, iteration),
            )
            guided = config.dynamic_sampling.guidance.enabled
            try:
                filled = fill_batch(sampler.draw, config.dynamic_sampling, sampler.plan if guided else None)
                rounds, short_by = filled.rounds, filled.short_by
                if config.selfverify.enabled and config.selfverify.mode == "in_batch":
                    verification_tasks = verify_own(sampler, filled.groups, config, policy, tokenizer, model_version)
            except BatchShortfall as error:
                rounds, short_by, failure = error.rounds, error.short_by, error
            except Exception as error:
                if not sampler.rollouts:
                    raise
                rounds, failure = len(sampler.rollouts), error
    finally:
        getattr(policy, "close", lambda: None)()
    if not sampler.rollouts:
        raise ValueError(f"iteration {iteration}: no problem could be drawn from the bank")
    return SampledIteration(
        pl.concat(sampler.rollouts, how="diagonal_relaxed"),  # RISE's verification rounds carry no drawn_as
        pl.concat(sampler.rewards, how="diagonal_relaxed"),
        rounds,
        short_by,
        failure,
        scored=pl.concat(sampler.scored),
        new_problems=verification_tasks,
    )


def bank_labels(lake: Lake, config: IterationConfig, bank: pl.DataFrame, iteration: int) -> pl.DataFrame | None:
    """Selection's label and tier for each bank problem, from the difficulty ledger (None when selection is off)."""
    ledger = selection_ledger(lake, config.dynamic_sampling, iteration)
    if ledger is None:
        return None
    selection = config.dynamic_sampling.selection
    return selection_labels(bank, ledger, iteration, config.rollout.group_size, selection, config.rollout.seed)


def verify_own(
    sampler: GroupSampler,
    groups: pl.DataFrame,
    config: IterationConfig,
    policy: Policy,
    tokenizer: object | None,
    model_version: int,
) -> pl.DataFrame:
    """RISE in the batch: verification tasks from the kept groups' own solutions (tasks/rise.py),
    answered now by the same policy in round `VERIFICATION_ROUND`; their rollouts and rewards join the
    iteration's. Returns the tasks, for the bank."""
    kept = groups.filter("kept")["group_id"]
    solutions = pl.concat(sampler.rollouts).filter(pl.col("group_id").is_in(kept.implode()))["rollout_id"]
    scored = pl.concat(sampler.scored, how="diagonal_relaxed").filter(pl.col("rollout_id").is_in(solutions.implode()))
    verdicts = own_rewards(pl.concat(sampler.rewards, how="diagonal_relaxed"), scored, config.verify.verifier)
    frame = scored.join(verdicts.select("rollout_id", "correct"), on="rollout_id").join(
        sampler.bank.select("problem_id", "source").unique("problem_id"), on="problem_id", how="left"
    )
    tasks = problem_rows(verification_problems(frame, config.selfverify, sampler.iteration)).unique(
        "problem_id", keep="first", maintain_order=True
    )
    if tasks.is_empty():
        return tasks
    problems = tasks.select(*PROBLEM_FIELDS, "level")
    rows, rewards = solve_problems(
        problems,
        config,
        sampler.iteration,
        model_version,
        policy,
        tokenizer,
        sampler.score,
        round_=VERIFICATION_ROUND,
        role="verifier",
    )
    sampler.rollouts.append(rows)
    sampler.rewards.append(rewards)
    sampler.scored.append(solve_frame(rows, problems))
    return tasks


def _selfplay_iteration(
    lake: Lake,
    config: IterationConfig,
    iteration: int,
    model_version: int,
    policy: Policy,
    tokenizer,
    score: Callable[[pl.DataFrame], pl.DataFrame] | None,
) -> SampledIteration:
    """Proposer and solver rounds of a self-play iteration (tasks/selfplay/stage.py)."""
    try:
        with verifier_pool(config.verify) if score is None else contextlib.nullcontext() as pool:
            score = score or (lambda frame: score_with_components(frame, config.verify, config.reward, pool))
            sampled = sample_selfplay(lake, config, iteration, model_version, policy, tokenizer, score)
    finally:
        getattr(policy, "close", lambda: None)()
    return SampledIteration(
        sampled.rollouts,
        sampled.rewards,
        rounds=2,
        short_by=0,
        failure=None,
        proposals=sampled.proposals,
        new_problems=sampled.new_problems,
    )
