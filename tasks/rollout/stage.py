"""The rollout stage: draw prompts from the bank by the training mix, sample G responses each from
the policy, and score them, one generation round at a time for dynamic sampling.

`GroupSampler.draw` is the `draw_groups` callback of `dynamic_sampling.fill_batch`: each round
draws problems not yet drawn this iteration, and keeps every rollout and reward it made, kept
or not, so that the stage writes all of them and the groups table can say why each was dropped.
Ids sort in draw order: group `i00003-r02-g000007` is the 8th group of round 2 of iteration 3.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import polars as pl
import pyarrow.compute as pc
from pydantic import Field

from policy.certainty import WithSelfCertainty
from policy.checkpoints import load_policy, load_tokenizer
from policy.hf import HFPolicy
from policy.openai_backend import OpenAIBackendConfig, OpenAIPolicy
from policy.prompts import PromptConfig, format_prompt
from policy.sampling import Policy, SamplerConfig
from storage.config import Strict
from storage.lake import Lake
from storage.registry import latest_version, version_row
from storage.seeds import derive_seed
from tasks.advantages.dynamic_sampling import DynamicSamplingConfig
from tasks.advantages.guided_sampling import HISTORY_COLUMNS, groups_to_draw, ranked_candidates
from tasks.advantages.shaping import success
from tasks.curation.config import MixConfig
from tasks.curation.mix import sample_mix
from tasks.curation.stage import bank_problems
from tasks.curriculum.stage import at_current_difficulty
from tasks.rise import SOURCE as SELF_VERIFY_SOURCE
from tasks.rise import SelfVerifyConfig
from tasks.rollout.base_policy import BasePolicyConfig, ensure_base_policy
from tasks.rollout.episodes import EpisodePolicy, ToolConfig
from tasks.rollout.rows import rollout_rows
from tasks.verification.stage import PROBLEM_FIELDS, own_rewards


class RolloutConfig(Strict):
    """Which policy samples, how prompts are drawn and formatted, and how responses are sampled."""

    backend: Literal["hf", "openai"] = Field(
        "hf", description="hf: transformers in this process; openai: OpenAI-compatible servers (vLLM)"
    )
    group_size: int = Field(16, ge=2, description="G: responses sampled per prompt")
    seed: int = Field(0, description="root seed; each round's draw and sampling seeds derive from it and the iteration")
    mix: MixConfig = Field(default_factory=MixConfig, description="level and domain mix of the drawn prompts")
    prompt: PromptConfig = Field(default_factory=PromptConfig, description="prompt template")
    sampler: SamplerConfig = Field(default_factory=SamplerConfig, description="sampling parameters")
    device: str = Field("cpu", description="hf backend: torch device")
    devices: list[str] = Field(
        default_factory=list,
        description="the devices the sampling role holds (the hf "
        "backend samples on the first; self-certainty and the agreement gate load the local "
        "copy there); empty: [device]. A run refuses to train on one of them unless "
        "train.share_devices",
    )
    batch_size: int = Field(
        512,
        ge=1,
        description="hf backend: sequences generated together (rows that end "
        "leave the batch, so larger is faster while memory lasts: on CPU the tiny model samples a "
        "round fastest in one batch)",
    )
    openai: OpenAIBackendConfig = Field(default_factory=OpenAIBackendConfig, description="openai backend: servers")
    self_certainty: bool | None = Field(
        None,
        description="openai backend: compute each rollout's self-certainty "
        "from a forward pass of the local copy of the version (null: only when "
        "the reward composes it); the hf backend always records it",
    )
    base_policy: BasePolicyConfig = Field(default_factory=BasePolicyConfig, description="what model version 0 is")
    logprob_check_prompts: int = Field(
        4,
        ge=0,
        description="openai backend: prompts of the log-prob agreement "
        "gate run on each endpoint for each version published (2 short samples "
        "each); 0 = no gate",
    )
    logprob_tolerance: float = Field(
        0.05,
        gt=0,
        description="openai backend: the most the mean |server log p - "
        "trainer log p| per token may be before the gate fails (bf16 servers: ~0.01)",
    )
    tools: ToolConfig = Field(
        default_factory=ToolConfig, description="multi-turn episodes with tool calls (tasks/rollout/episodes.py)"
    )

    def sampling_device(self) -> str:
        """Where this process samples and loads the local copy: the first of `devices`, else `device`."""
        return self.devices[0] if self.devices else self.device


@dataclass
class GroupSampler:
    """Draws, samples and scores groups round by round; keeps everything it made."""

    rollout: RolloutConfig
    sampling: DynamicSamplingConfig
    selfverify: SelfVerifyConfig  # lagged RISE: a share of each round's draw is banked verification tasks
    verifier: str | None  # the verifier whose verdict says a rollout is correct (verify.verifier)
    policy: Policy
    tokenizer: object | None
    score: Callable[[pl.DataFrame], pl.DataFrame]  # rollouts with their problems -> reward rows
    bank: pl.DataFrame
    iteration: int
    model_version: int
    rollouts: list[pl.DataFrame] = field(default_factory=list)
    rewards: list[pl.DataFrame] = field(default_factory=list)
    scored: list[pl.DataFrame] = field(default_factory=list)  # what was scored: rollouts with their problems
    drawn: set[str] = field(default_factory=set)
    history: pl.DataFrame | None = None  # guided sampling: the lake's past groups (problem_id, iteration, ...)
    ranked: pl.DataFrame | None = None  # guided sampling: this round's candidates, likeliest kept first
    planned: list[dict] = field(default_factory=list)  # guided sampling: per round, groups drawn and expected kept

    def plan(self, missing: int, round_: int) -> int:
        """Guided sampling: rank a pool of candidates drawn by the mix by their predicted keep probability, and
        draw as many as those predictions need to fill the batch (tasks/advantages/guided_sampling.py). Without
        history (a first iteration) the round is `oversample` × missing, drawn by the mix. `round_` is the
        generation round it plans (its pool's seed), as `fill_batch` counts them."""
        sampling, rollout = self.sampling, self.rollout
        guidance = sampling.guidance
        self.ranked = None
        if self.history is None or self.history.is_empty():
            return math.ceil(missing * sampling.oversample)
        available = self._available().filter(pl.col("source") != SELF_VERIFY_SOURCE)
        pool = min(available.height, math.ceil(missing * guidance.pool))
        try:
            candidates = sample_mix(
                available,
                pool,
                derive_seed(rollout.seed, self.iteration, round_, "draw"),
                rollout.mix.level_weights,
                rollout.mix.domain_weights,
            )
        except ValueError:  # the mix's levels hold fewer: draw as an unguided round does
            return math.ceil(missing * sampling.oversample)
        self.ranked = ranked_candidates(
            candidates, self.history, self.iteration, rollout.group_size, sampling.band, guidance, self.bank
        )
        keep = self.ranked["keep_probability"].to_list()
        n = groups_to_draw(keep, missing, guidance.confidence, cap=len(keep))
        self.planned.append({"round": round_, "groups": n, "expected_kept": float(sum(keep[:n]))})
        return n

    def _available(self) -> pl.DataFrame:
        return self.bank.filter(~pl.col("problem_id").is_in(list(self.drawn)))

    def draw(self, n_groups: int, round_: int) -> pl.DataFrame:
        """`n_groups` new groups, scored: one row per rollout with group_id, problem_id, reward, correct."""
        rollout = self.rollout
        available = self._available()
        n = min(n_groups, available.height)
        if n == 0:
            return pl.DataFrame(
                schema={"group_id": pl.String, "problem_id": pl.String, "reward": pl.Float64, "correct": pl.Boolean}
            )
        problems = self._drawn(available, n, derive_seed(rollout.seed, self.iteration, round_, "draw"))
        self.drawn.update(problems["problem_id"].to_list())
        prompts = [format_prompt(text, rollout.prompt, self.tokenizer) for text in problems["prompt"]]
        seed = derive_seed(rollout.seed, self.iteration, round_, "sample")
        groups = self.policy.generate(prompts, rollout.group_size, rollout.sampler, seed, self.model_version)
        sampler = {
            "backend": rollout.backend,
            "group_size": rollout.group_size,
            **rollout.sampler.model_dump(),
            "prompt": rollout.prompt.model_dump(),
            **({"tools": rollout.tools.model_dump()} if rollout.tools.enabled else {}),
        }
        rows = rollout_rows(
            problems,
            prompts,
            groups,
            iteration=self.iteration,
            round_=round_,
            model_version=self.model_version,
            sampler=sampler,
            seed=seed,
        )
        to_score = rows.select("rollout_id", "iteration", "problem_id", "response", "n_tokens", "self_certainty").join(
            problems.select(PROBLEM_FIELDS), on="problem_id", how="left"
        )
        rewards = self.score(to_score)
        self.rollouts.append(rows)
        self.rewards.append(rewards)
        self.scored.append(to_score)
        own = own_rewards(rewards, to_score, self.verifier)
        return rows.select("rollout_id", "group_id", "problem_id").join(
            own.select("rollout_id", "reward", correct=success()), on="rollout_id", how="left", maintain_order="left"
        )

    def _drawn(self, available: pl.DataFrame, n: int, seed: int) -> pl.DataFrame:
        """`n` problems by the training mix; with self-verification, `selfverify.ratio` of them are verification
        tasks (as many as the bank holds), the rest the mix's."""
        mix, verify = self.rollout.mix, self.selfverify
        lagged = verify.enabled and verify.mode == "lagged"
        is_task = pl.col("source") == SELF_VERIFY_SOURCE
        tasks = available.filter(is_task) if lagged else available.clear()
        others = available.filter(~is_task)
        n_tasks = min(tasks.height, round(n * verify.ratio)) if lagged else 0
        n_others = min(others.height, n - n_tasks)
        if self.ranked is not None:  # guided: the likeliest-kept candidates of `plan`
            parts = [self.ranked.head(n_others).select(others.columns)] if n_others else []
        else:
            parts = [sample_mix(others, n_others, seed, mix.level_weights, mix.domain_weights)] if n_others else []
        if n_tasks:
            parts.append(tasks.sort("problem_id").sample(n_tasks, seed=derive_seed(seed, "self-verify") % 2**32))
        return pl.concat(parts) if parts else available.clear()


def sampling_history(lake: Lake, config: DynamicSamplingConfig, iteration: int) -> pl.DataFrame | None:
    """Guided sampling's evidence: the groups of the last `guidance.history` iterations (None when off)."""
    if not config.guidance.enabled or not lake.exists("groups"):
        return None
    window = (pc.field("iteration") >= iteration - config.guidance.history) & (pc.field("iteration") < iteration)
    return lake.read("groups", filter=window, columns=HISTORY_COLUMNS)


def training_bank(lake: Lake, mix: MixConfig) -> pl.DataFrame:
    # a reasoning-gym source the curriculum moved is drawn at its current step only
    problems = at_current_difficulty(lake, bank_problems(lake, mix.bank_version, mix.split))
    if problems.is_empty():
        raise ValueError(f"the bank at {lake.uri} holds no {mix.split} problems: run `rlvr curate` first")
    return problems.select(*PROBLEM_FIELDS, "level", "source")


def open_policy(lake: Lake, config: RolloutConfig, model_version: int) -> tuple[Policy, object | None]:
    """The configured backend holding `model_version`, and the tokenizer chat templates need (if any)."""
    row = version_row(lake, model_version)
    checkpoint = row["checkpoint_uri"]
    if config.backend == "hf":
        model, tokenizer = load_policy(checkpoint, config.sampling_device(), read_only=True)
        policy = HFPolicy(model, tokenizer, model_version, config.batch_size)
    else:
        tokenizer = None
        if config.prompt.template == "chat" or config.tools.enabled:  # episodes tokenize the tool's output
            tokenizer = load_tokenizer(checkpoint)
        served = {model_version: row["served_name"]} if row["served_name"] else {}
        policy = OpenAIPolicy(config.openai, os.environ.get(config.openai.api_key_env), served)
    return (EpisodePolicy(policy, tokenizer, config.tools) if config.tools.enabled else policy), tokenizer


def with_self_certainty(lake: Lake, policy: Policy, config: RolloutConfig, model_version: int) -> Policy:
    """`policy`, its samples' self-certainty filled from the local copy of `model_version` (policy/certainty.py)."""
    model, tokenizer = load_policy(version_row(lake, model_version)["checkpoint_uri"], config.sampling_device())
    return WithSelfCertainty(policy, model, tokenizer, config.batch_size)


def next_iteration(lake: Lake) -> int:
    iterations = lake.read("rollouts", columns=["iteration"])["iteration"]
    return int(iterations.max() or 0) + 1


def current_model_version(lake: Lake, base: BasePolicyConfig) -> int:
    """The latest registered version; registers version 0 first on a new lake."""
    latest = latest_version(lake)
    return latest if latest is not None else ensure_base_policy(lake, base)
