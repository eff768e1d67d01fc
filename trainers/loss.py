"""The clipped policy-gradient loss of GRPO and DAPO, as one pure function of tensors.

Per token t of response i (PPO's surrogate, negated):
    ratio      = exp(log π_θ(t) − log π_behaviour(t))
    loss(i, t) = −min(ratio · A_i, clip(ratio, 1 − ε_low, 1 + ε_high) · A_i) · w_i  [+ β · KL_k3(t)]
with A_i the advantage of the response, w_i its importance weight (1 on-policy), and Clip-Higher
when ε_high > ε_low (DAPO). Aggregation over tokens, the part where the papers differ:
- `dapo`: token-level mean over the whole batch, Σ loss / Σ tokens (long responses weigh more);
- `grpo`: each sequence's token mean, then the mean over sequences;
- `dr_grpo`: Σ loss / (sequences × max_completion_length), a constant normaliser (no length bias).
KL to a reference model uses the k3 estimator exp(r − p) − (r − p) − 1 (β = 0 disables it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_TYPES = ("dapo", "grpo", "dr_grpo")


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable
    clip_fraction: float  # share of (masked) tokens whose ratio was clipped
    kl: float  # mean k3 KL per token (0 without a reference)
    ratio_mean: float


def policy_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str = "dapo",
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.28,
    weights: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    max_completion_length: int | None = None,
    token_normaliser: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> LossOutput:
    """The clipped surrogate loss.

    Args:
        logprobs: log π_θ of the response tokens, [B, T] (differentiable).
        behaviour_logprobs: log-probs stored at sampling time, [B, T].
        advantages: one per response, [B].
        mask: 1 for response tokens, 0 for padding, [B, T].
        loss_type: dapo, grpo or dr_grpo (aggregation, see the module docstring).
        weights: per-response importance weights / loss masks from the batch table, [B]; a response with
            weight 0 leaves the loss and its normalisers, as if it were not in the batch.
        ref_logprobs: log-probs of a reference model, [B, T], for the KL penalty (with beta > 0).
        max_completion_length: dr_grpo's constant; default T.
        token_normaliser: dapo's Σ tokens when a batch is split for gradient accumulation (the
            whole batch's count, so that micro-batches add up to the full-batch loss); default Σ mask.
        token_weights: per-token weights, [B, T] (the decoupled objective's truncated
            π_proximal / π_behaviour); default none.
    Returns:
        LossOutput with the scalar loss and detached statistics.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}: use one of {LOSS_TYPES}")
    mask = mask.to(logprobs.dtype)
    if weights is not None:  # a zero weight (masked truncation) removes the response entirely
        mask = mask * (weights[:, None] > 0).to(mask.dtype)
    ratio = torch.exp(logprobs - behaviour_logprobs)  # [B, T]
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)  # [B, T]
    advantage = advantages[:, None]  # [B, 1]
    per_token = -torch.min(ratio * advantage, clipped * advantage)  # [B, T]
    if weights is not None:
        per_token = per_token * weights[:, None]
    if token_weights is not None:
        per_token = per_token * token_weights
    kl = torch.zeros_like(per_token)
    if beta and ref_logprobs is not None:
        delta = ref_logprobs - logprobs
        kl = torch.exp(delta) - delta - 1  # [B, T] k3 estimator
        per_token = per_token + beta * kl
    if loss_type == "dapo":
        loss = (per_token * mask).sum() / (token_normaliser or mask.sum().clamp(min=1.0))
    elif loss_type == "grpo":
        present = (mask.sum(-1) > 0).to(mask.dtype) if weights is not None else torch.ones_like(mask[:, 0])
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / present.sum().clamp(min=1.0)
    else:
        sequences = (mask.sum(-1) > 0).sum() if weights is not None else mask.shape[0]
        loss = (per_token * mask).sum() / (sequences * (max_completion_length or mask.shape[1]))
    with torch.no_grad():
        tokens = mask.sum().clamp(min=1.0)
        was_clipped = ((ratio * advantage) > (clipped * advantage)).to(mask.dtype)  # min picked the clipped term
        stats = ((was_clipped * mask).sum() / tokens, (kl * mask).sum() / tokens, (ratio * mask).sum() / tokens)
    return LossOutput(loss, *(float(s) for s in stats))
