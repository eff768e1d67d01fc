"""What every policy backend shares: the sampler config, one sampled response, and the maths of
the sampling distribution (temperature, top-k, top-p) and of self-certainty.

Behaviour log-probs are those of the distribution actually sampled: with the defaults (top_k 0,
top_p 1) that is softmax(logits / temperature), which is what the trainer recomputes. Leaving
transformers' default top-k 50 on would make the stored log-probs lie about the ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from pydantic import Field

from storage.config import Strict


class SamplerConfig(Strict):
    """How responses are sampled; stored in full with every rollout."""

    temperature: float = Field(1.0, ge=0, description="softmax temperature; 0 = greedy (log-probs then 0)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass; 1 = off (keep for on-policy ratios)")
    top_k: int = Field(0, ge=0, description="sample among the k likeliest tokens; 0 = off")
    max_new_tokens: int = Field(
        256, ge=1, description="response length cap; a response that hits it ends with 'length'"
    )
    stop: list[str] = Field(default_factory=list, description="strings that end a response (besides end-of-text)")


@dataclass
class Sample:
    """One response: text, tokens with behaviour log-probs, and how it ended."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # stop | length
    prompt_token_ids: list[int] | None = None
    self_certainty: float | None = None
    backend: str = ""
    # a multi-turn episode (tasks/rollout/episodes.py): 0 on the tool's tokens, 1 on the model's
    loss_mask: list[int] | None = None
    turns: list[dict] | None = None  # each segment: role (model or tool), text, tokens; tool: error
    tool_calls: int | None = None
    tool_errors: int | None = None


class Policy(Protocol):
    """A sampler of groups: `n` responses for each prompt (a text, or token ids to continue exactly)."""

    def generate(
        self, prompts: list[str] | list[list[int]], n: int, sampler: SamplerConfig, seed: int, model_version: int
    ) -> list[list[Sample]]: ...


@dataclass(frozen=True)
class Penalties:
    """What a server may do to the logits besides temperature, top-k and top-p, as vLLM does it.

    The platform never wants any of it: the trainer recomputes softmax(logits / T), so every request
    states these neutral (`NEUTRAL`). A server that applies them anyway (vLLM takes omitted ones from
    the model's generation_config.json) samples from, and returns log-probs of, another distribution.
    `rlvr policy serve` applies them so that tests see that bias.
    """

    repetition_penalty: float = 1.0  # > 1: logits of tokens seen in prompt or output divided (> 0) or multiplied
    presence_penalty: float = 0.0  # subtracted once from the logit of each token already in the output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    min_p: float = 0.0  # after temperature: drop tokens below min_p × the top token's probability

    @property
    def neutral(self) -> bool:
        return self == Penalties()

    def penalise(self, logits, in_prompt, output_counts):
        """vLLM's order: repetition over prompt and output, then frequency and presence over the output. [B, V]"""
        import torch

        seen = in_prompt | (output_counts > 0)
        penalty = torch.where(seen, self.repetition_penalty, 1.0)
        logits = torch.where(logits > 0, logits / penalty, logits * penalty)
        return logits - self.frequency_penalty * output_counts - self.presence_penalty * (output_counts > 0)


NO_PENALTIES = Penalties()
NEUTRAL = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0}


def sampling_logprobs(logits, sampler: SamplerConfig, min_p: float = 0.0):
    """Log-probs of the distribution the sampler draws from: temperature, then min-p (a server's, never
    ours), then top-k, then top-p. [B, V]"""
    import torch

    scaled = logits / max(sampler.temperature, 1e-6)
    if min_p > 0:
        probs = torch.softmax(scaled, dim=-1)
        scaled = scaled.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, float("-inf"))
    if sampler.top_k and sampler.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, sampler.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if sampler.top_p < 1.0:
        ordered, order = torch.sort(scaled, descending=True, dim=-1)
        probs = torch.softmax(ordered, dim=-1)
        outside = probs.cumsum(-1) - probs >= sampler.top_p  # keep the smallest set reaching top_p (as HF)
        scaled = scaled.scatter(-1, order, ordered.masked_fill(outside, float("-inf")))
    return torch.log_softmax(scaled, dim=-1)


def self_certainty(logits, logprobs=None):
    """KL(uniform ‖ softmax(logits)) per row: −log V − mean_j log p_j (INTUITOR). [B]
    `logprobs`: log_softmax(logits) when the caller has it already."""
    import torch

    if logprobs is None:
        logprobs = torch.log_softmax(logits.float(), dim=-1)
    return -math.log(logits.shape[-1]) - logprobs.mean(dim=-1)


def sampled_temperature(sampler: dict) -> float:
    """The temperature a rollout was sampled at (greedy rows are scored at 1: their log-probs are 0 anyway)."""
    return float(sampler.get("temperature", 1.0)) or 1.0
