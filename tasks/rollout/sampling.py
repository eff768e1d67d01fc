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

from tasks.config import Strict


class SamplerConfig(Strict):
    """How responses are sampled; stored in full with every rollout."""

    temperature: float = Field(1.0, ge=0, description="softmax temperature; 0 = greedy (log-probs then 0)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass; 1 = off (keep for on-policy ratios)")
    top_k: int = Field(0, ge=0, description="sample among the k likeliest tokens; 0 = off")
    max_new_tokens: int = Field(256, ge=1, description="response length cap; a response that hits it ends with 'length'")
    stop: list[str] = Field(default_factory=list, description="strings that end a response (besides end-of-text)")


@dataclass
class Sample:
    """One response: text, tokens with behaviour log-probs, and how it ended."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str                 # stop | length
    prompt_token_ids: list[int] | None = None
    self_certainty: float | None = None
    backend: str = ""
    # a multi-turn episode (tasks/rollout/episodes.py): 0 on the tool's tokens, 1 on the model's
    loss_mask: list[int] | None = None
    turns: list[dict] | None = None    # each segment: role (model or tool), text, tokens; tool: error
    tool_calls: int | None = None
    tool_errors: int | None = None


class Policy(Protocol):
    """A sampler of groups: `n` responses for each prompt (a text, or token ids to continue exactly)."""

    def generate(self, prompts: list[str] | list[list[int]], n: int, sampler: SamplerConfig, seed: int,
                 model_version: int) -> list[list[Sample]]: ...


def sampling_logprobs(logits, sampler: SamplerConfig):
    """Log-probs of the distribution the sampler draws from: temperature, then top-k, then top-p. [B, V]"""
    import torch

    scaled = logits / max(sampler.temperature, 1e-6)
    if sampler.top_k and sampler.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, sampler.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if sampler.top_p < 1.0:
        ordered, order = torch.sort(scaled, descending=True, dim=-1)
        probs = torch.softmax(ordered, dim=-1)
        outside = probs.cumsum(-1) - probs >= sampler.top_p         # keep the smallest set reaching top_p (as HF)
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
