"""The policy-gradient losses, a registry of small functions of tensors (one per loss type, `LOSSES`).

Per token t of response i, with A_i the response's advantage and the ratio r = π_θ / π_behaviour:
- a **surrogate** gives the token's loss from r and A (PPO's clipped one, CISPO's clipped weight, SAPO's gate);
- the ratio is the token's own, or the **sequence's** (GSPO: exp of the mean log-ratio over the response);
- an **aggregation** turns tokens into one number, the part where the papers differ most.
Then, whatever the type: × w_i (the batch's per-response weight: importance weight or loss mask), × the per-token
weights (the decoupled objective's truncated π_prox / π_behaviour), + β · KL_k3(t) to a reference model
(k3 = exp(r − p) − (r − p) − 1; β = 0 disables it).

| type      | ratio    | surrogate                                  | aggregation                          |
| dapo      | token    | −min(r·A, clip(r, 1−ε_low, 1+ε_high)·A)    | Σ loss / Σ tokens of the whole batch |
| grpo      | token    | the same                                   | mean over sequences of token means   |
| dr_grpo   | token    | the same                                   | Σ loss / (sequences × L_max)         |
| bnpo      | token    | the same                                   | Σ loss / Σ tokens of the micro-batch |
| gspo      | sequence | the same, on the sequence's ratio          | mean over sequences of token means   |
| cispo     | token    | −sg(min(r, ε_max)) · A · log π_θ           | Σ loss / Σ tokens of the whole batch |
| sapo      | token    | −σ(τ(r − 1)) · 4/τ · A, τ by the sign of A | mean over sequences of token means   |

Papers: DAPO (Yu et al. 2025, arXiv:2503.14476: token-level mean, Clip-Higher ε_high > ε_low); GRPO (Shao et al.
2024, arXiv:2402.03300); Dr. GRPO (Liu et al. 2025, arXiv:2503.20783: no length bias); BNPO (Xiao et al. 2025,
arXiv:2506.02864: normalised by the batch's tokens); GSPO (Zheng et al. 2025, arXiv:2507.18071: the sequence's
length-normalised ratio, clipped per sequence); CISPO (MiniMax-M1, arXiv:2506.13585, with ScaleRL's ε_max,
arXiv:2510.13786: the importance weight clipped and detached, so every token keeps a gradient); SAPO (Gao et al.
2025, arXiv:2511.20347: a smooth temperature-controlled gate instead of a hard clip, τ_neg > τ_pos). Each matches
TRL 1.16's `GRPOTrainer._compute_loss` for the same `loss_type` (gspo: `loss_type="grpo"` with
`importance_sampling_level="sequence"`) to 1e-6 (tests/trainers/test_loss.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable
    clip_fraction: float  # share of (masked) tokens whose ratio was clipped (cispo: capped; sapo: none)
    kl: float  # mean k3 KL per token (0 without a reference)
    ratio_mean: float


@dataclass(frozen=True)
class Bounds:
    """What the surrogates read besides the ratio and the advantage."""

    epsilon_low: float = 0.2
    epsilon_high: float = 0.28
    cispo_max_ratio: float = 5.0  # ScaleRL's ε_max
    sapo_temperature_positive: float = 1.0
    sapo_temperature_negative: float = 1.05


Surrogate = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Bounds], tuple[torch.Tensor, torch.Tensor]]


def clipped(ratio: torch.Tensor, advantage: torch.Tensor, logprobs: torch.Tensor, bounds: Bounds):
    """PPO's clipped surrogate, negated: the loss and where the min picked the clipped term."""
    limited = torch.clamp(ratio, 1 - bounds.epsilon_low, 1 + bounds.epsilon_high)  # [B, T]
    per_token = -torch.min(ratio * advantage, limited * advantage)  # [B, T]
    return per_token, (ratio * advantage) > (limited * advantage)


def cispo(ratio: torch.Tensor, advantage: torch.Tensor, logprobs: torch.Tensor, bounds: Bounds):
    """CISPO: REINFORCE weighted by the detached, capped importance ratio."""
    weight = torch.clamp(ratio, max=bounds.cispo_max_ratio).detach()  # [B, T]
    return -weight * advantage * logprobs, ratio > bounds.cispo_max_ratio


def sapo(ratio: torch.Tensor, advantage: torch.Tensor, logprobs: torch.Tensor, bounds: Bounds):
    """SAPO: a sigmoid gate around r = 1 whose temperature depends on the advantage's sign (its gradient at
    r = 1 is the plain policy gradient's, and it fades smoothly instead of stopping at a clip)."""
    positive = torch.full_like(advantage, bounds.sapo_temperature_positive)
    temperature = torch.where(advantage > 0, positive, torch.full_like(advantage, bounds.sapo_temperature_negative))
    gate = torch.sigmoid(temperature * (ratio - 1)) * 4 / temperature  # [B, T]
    return -gate * advantage, torch.zeros_like(ratio, dtype=torch.bool)


@dataclass(frozen=True)
class Normalisers:
    """The counts the aggregations divide by."""

    sequences: torch.Tensor | int  # responses present (a zero-weight one is not)
    max_completion_length: int  # dr_grpo's constant
    batch_tokens: float | None  # the whole batch's Σ tokens when a batch is split into micro-batches


def token_mean_over_batch(per_token: torch.Tensor, mask: torch.Tensor, counts: Normalisers) -> torch.Tensor:
    return (per_token * mask).sum() / (counts.batch_tokens or mask.sum().clamp(min=1.0))


def token_mean(per_token: torch.Tensor, mask: torch.Tensor, counts: Normalisers) -> torch.Tensor:
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


def sequence_mean(per_token: torch.Tensor, mask: torch.Tensor, counts: Normalisers) -> torch.Tensor:
    per_sequence = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # [B]
    return per_sequence.sum() / torch.as_tensor(counts.sequences, dtype=mask.dtype).clamp(min=1.0)


def constant_length(per_token: torch.Tensor, mask: torch.Tensor, counts: Normalisers) -> torch.Tensor:
    return (per_token * mask).sum() / (counts.sequences * counts.max_completion_length)


@dataclass(frozen=True)
class Objective:
    """One loss type: its surrogate, the level of its ratio and its aggregation. `whole_batch`: normalised by the
    whole batch's tokens, so micro-batches' losses add up to the batch's; else each micro-batch's loss is scaled
    by its share of the sequences."""

    surrogate: Surrogate
    ratio_level: Literal["token", "sequence"]
    aggregate: Callable[[torch.Tensor, torch.Tensor, Normalisers], torch.Tensor]
    whole_batch: bool = False


LOSSES: dict[str, Objective] = {
    "dapo": Objective(clipped, "token", token_mean_over_batch, whole_batch=True),
    "grpo": Objective(clipped, "token", sequence_mean),
    "dr_grpo": Objective(clipped, "token", constant_length),
    "bnpo": Objective(clipped, "token", token_mean),
    "gspo": Objective(clipped, "sequence", sequence_mean),
    "cispo": Objective(cispo, "token", token_mean_over_batch, whole_batch=True),
    "sapo": Objective(sapo, "token", sequence_mean),
}
LOSS_TYPES = tuple(LOSSES)


def log_ratio_at(level: str, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The token's own log-ratio, or its sequence's mean over the response's tokens (broadcast back to [B, T])."""
    if level == "token":
        return log_ratio
    sequence = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)  # [B, 1]
    return sequence.expand_as(log_ratio)


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
    cispo_max_ratio: float = 5.0,
    sapo_temperatures: tuple[float, float] = (1.0, 1.05),
) -> LossOutput:
    """The loss of `loss_type` (see the module docstring).

    Args:
        logprobs: log π_θ of the response tokens, [B, T] (differentiable).
        behaviour_logprobs: log-probs stored at sampling time, [B, T].
        advantages: one per response, [B].
        mask: 1 for response tokens, 0 for padding, [B, T].
        loss_type: a key of `LOSSES`.
        weights: per-response importance weights / loss masks from the batch table, [B]; a response with
            weight 0 leaves the loss and its normalisers, as if it were not in the batch.
        ref_logprobs: log-probs of a reference model, [B, T], for the KL penalty (with beta > 0).
        max_completion_length: dr_grpo's constant; default T.
        token_normaliser: the whole batch's Σ tokens when a batch is split for gradient accumulation (so that
            micro-batches add up to the full-batch loss of dapo and cispo); default Σ mask.
        token_weights: per-token weights, [B, T] (the decoupled objective's truncated π_proximal / π_behaviour).
        cispo_max_ratio: cispo's cap of the detached importance weight (ε_max).
        sapo_temperatures: sapo's (τ_pos, τ_neg).
    Returns:
        LossOutput with the scalar loss and detached statistics.
    """
    if loss_type not in LOSSES:
        raise ValueError(f"unknown loss_type {loss_type!r}: use one of {LOSS_TYPES}")
    objective = LOSSES[loss_type]
    bounds = Bounds(epsilon_low, epsilon_high, cispo_max_ratio, *sapo_temperatures)
    mask = mask.to(logprobs.dtype)
    if weights is not None:  # a zero weight (masked truncation) removes the response entirely
        mask = mask * (weights[:, None] > 0).to(mask.dtype)
    ratio = torch.exp(log_ratio_at(objective.ratio_level, logprobs - behaviour_logprobs, mask))  # [B, T]
    advantage = advantages[:, None]  # [B, 1]
    per_token, was_clipped = objective.surrogate(ratio, advantage, logprobs, bounds)  # [B, T] each
    if weights is not None:
        per_token = per_token * weights[:, None]
    if token_weights is not None:
        per_token = per_token * token_weights
    kl = torch.zeros_like(per_token)
    if beta and ref_logprobs is not None:
        delta = ref_logprobs - logprobs
        kl = torch.exp(delta) - delta - 1  # [B, T] k3 estimator
        per_token = per_token + beta * kl
    sequences = (mask.sum(-1) > 0).sum() if weights is not None else mask.shape[0]
    counts = Normalisers(sequences, max_completion_length or mask.shape[1], token_normaliser)
    loss = objective.aggregate(per_token, mask, counts)
    with torch.no_grad():
        tokens = mask.sum().clamp(min=1.0)
        stats = (was_clipped.to(mask.dtype) * mask).sum() / tokens, (kl * mask).sum() / tokens
        stats = (*stats, (ratio * mask).sum() / tokens)
    return LossOutput(loss, *(float(s) for s in stats))
