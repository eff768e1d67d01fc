"""The rollout stage: it only samples. The drawn problems' prompts are formatted and G responses each sampled
from the policy, one generation round at a time (`rollout_sampler`, the `sample` side of
`tasks/sampling/sampler.py`, which draws, has the verification stage score, and refills). Here too: the policy
a run samples from (`open_policy`), the bank it draws from, the iteration and version it samples at.
Ids sort in draw order: group `i00003-r02-g000007` is the 8th group of round 2 of iteration 3.
"""

from __future__ import annotations

import os
from typing import Literal

import polars as pl
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
from tasks.curation.config import MixConfig
from tasks.curation.mix import sample_mix
from tasks.curation.stage import bank_problems
from tasks.curriculum.stage import at_current_difficulty
from tasks.rollout.base_policy import BasePolicyConfig, ensure_base_policy
from tasks.rollout.episodes import EpisodePolicy, ToolConfig
from tasks.rollout.rows import rollout_rows
from tasks.sampling.sampler import Sample
from tasks.verification.stage import PROBLEM_FIELDS


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


def rollout_sampler(
    policy: Policy, tokenizer: object | None, config: RolloutConfig, iteration: int, model_version: int
) -> Sample:
    """The rollout stage's side of a round (`tasks/sampling/sampler.py`): each drawn problem's prompt formatted,
    G responses sampled with the round's seed, one row per rollout."""
    sampler = {
        "backend": config.backend,
        "group_size": config.group_size,
        **config.sampler.model_dump(),
        "prompt": config.prompt.model_dump(),
        **({"tools": config.tools.model_dump()} if config.tools.enabled else {}),
    }

    def sample(problems: pl.DataFrame, round_: int, seed: int) -> pl.DataFrame:
        prompts = [format_prompt(text, config.prompt, tokenizer) for text in problems["prompt"]]
        groups = policy.generate(prompts, config.group_size, config.sampler, seed, model_version)
        return rollout_rows(
            problems,
            prompts,
            groups,
            iteration=iteration,
            round_=round_,
            model_version=model_version,
            sampler=sampler,
            seed=seed,
        )

    return sample


def training_bank(lake: Lake, mix: MixConfig) -> pl.DataFrame:
    """The problems RL draws from: the split at the mix's bank version, a reasoning-gym source the curriculum moved
    at its current step only, and with `mix.bank_size` a fixed subset of them drawn by the mix."""
    problems = at_current_difficulty(lake, bank_problems(lake, mix.bank_version, mix.split))
    if problems.is_empty():
        raise ValueError(f"the bank at {lake.uri} holds no {mix.split} problems: run `rlvr curate` first")
    problems = problems.select(*PROBLEM_FIELDS, "level", "source")
    if mix.bank_size is None or mix.bank_size >= problems.height:
        return problems
    return sample_mix(problems.sort("problem_id"), mix.bank_size, mix.seed, mix.level_weights, mix.domain_weights)


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
