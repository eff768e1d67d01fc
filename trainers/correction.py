"""The rollout correction: one weight per token for the gap between the policy that sampled a response (its
`behaviour_logprobs`, from the inference engine, perhaps a version or more ago) and the trainer's own log-probs
of the same tokens at the batch's start (π_old, a no-grad pass of the version being trained).

Which log-probs feed which ratio, with Δ_t = log π_old(t) − log π_behaviour(t):
- the policy loss's ratio is π_θ / π_old (the clip anchors at the trainer's own policy, as TRL, verl and AReaL do
  once a correction is on: decoupled PPO, Hilton et al. 2021);
- each token's loss is multiplied by w_t below, a function of Δ alone (detached: π_old and π_behaviour are both
  fixed), then by the batch's per-response weight.

| mode            | w_t                                                                  | default bounds |
| `none`          | 1, and the ratio is π_θ / π_behaviour (no π_old pass)                 |                |
| `token_tis`     | clamp(exp(Δ_t), low, high)                          (TIS, Yao et al.)  | (none, 3)      |
| `sequence_tis`  | clamp(exp(Σ_t Δ_t), low, high), the same for every token of the row  | (none, 3)      |
| `token_mask`    | exp(Δ_t) inside [low, high], else 0                                  | (none, 3)      |
| `sequence_mask` | exp(Σ_t Δ_t) inside [low, high], else 0 for the whole row (MIS)      | (none, 3)      |
| `geometric`     | 1 when exp(mean_t Δ_t) is inside [low, high], else 0 for the row     | (1/high, 1.001) |
| `icepop`        | exp(Δ_t) inside [low, high], else 0                                  | (0.5, 5)       |

The first four are TRL 1.16's `vllm_importance_sampling_mode` (token_truncate, sequence_truncate, token_mask,
sequence_mask), with its `vllm_importance_sampling_clip_min` / `_clip_max` as `low` / `high` and the same
defaults; tests/trainers/test_correction.py runs TRL's own code on the same tensors. `geometric` is verl's
geometric rejection sampling (`rollout_rs: geometric`, verl/trainer/ppo/rollout_corr_helper.py
`compute_rollout_rejection_mask`, docs/algo/rollout_corr.md: the geometric mean of the token ratios, a lower
bound of 1/upper unless given, typical upper 1.0002-1.001), with no IS weight on the rows it keeps. `icepop` is
IcePop's double-sided token mask (Ling team, "Small Leak Can Sink a Great Ship", 2025: M(k) = k for
k ∈ [α, β], else 0, α = 0.5, β = 5). A row or token a mask rejects keeps its place in the loss's normaliser,
as TRL's masks do (verl drops rejected rows from the denominator), so a micro-batched step still adds up to the
whole batch's.

Staleness: π_behaviour is the sampling version's, so Δ holds both the version gap and the engine's, and w_t
corrects both; the advantage stage's sequence-level weight for stale rows (`advantages.off_policy_weight:
truncated`) would correct the version gap a second time, so a run refuses the two together, as it does with
the decoupled objective, which is `token_tis` with `high = importance_cap` (AReaL).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator

from storage.config import Strict

Mode = Literal["none", "token_tis", "sequence_tis", "token_mask", "sequence_mask", "geometric", "icepop"]
DEFAULT_BOUNDS: dict[str, tuple[float | None, float | None]] = {
    "token_tis": (None, 3.0),
    "sequence_tis": (None, 3.0),
    "token_mask": (None, 3.0),
    "sequence_mask": (None, 3.0),
    "geometric": (None, 1.001),  # low: 1 / high
    "icepop": (0.5, 5.0),
}


class RolloutCorrection(Strict):
    """How the trainer weights each token for the gap between the sampling engine and itself (trainers/correction.py)."""

    mode: Mode = Field(
        "none",
        description="none, token_tis, sequence_tis, token_mask, sequence_mask (TRL's vllm_importance_sampling_mode), "
        "geometric (verl's geometric rejection), icepop",
    )
    low: float | None = Field(
        None, ge=0, description="lower bound of the ratio; null: the mode's default (geometric: 1 / high)"
    )
    high: float | None = Field(None, gt=0, description="upper bound of the ratio; null: the mode's default")

    @model_validator(mode="after")
    def _ordered(self):
        """`low` ≤ `high`, after each mode's defaults are filled in."""
        low, high = self.bounds()
        if low is not None and high is not None and low > high:
            raise ValueError(f"rollout_correction: low {low} is above high {high}")
        return self

    def bounds(self) -> tuple[float | None, float | None]:
        """(low, high) with the mode's defaults filled in."""
        default_low, default_high = DEFAULT_BOUNDS.get(self.mode, (None, None))
        high = self.high if self.high is not None else default_high
        low = self.low if self.low is not None else default_low
        if self.mode == "geometric" and low is None:
            low = 1.0 / high
        return low, high


def inside(ratio: torch.Tensor, low: float | None, high: float | None) -> torch.Tensor:
    keep = torch.ones_like(ratio, dtype=torch.bool)
    if low is not None:
        keep &= ratio >= low
    if high is not None:
        keep &= ratio <= high
    return keep


def correction_weights(
    old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor, correction: RolloutCorrection
) -> torch.Tensor:
    """w_t of the module docstring, [B, T], 0 on padding.

    Args:
        old_logprobs: the trainer's log-probs at the batch's start (π_old), [B, T], no gradient.
        behaviour_logprobs: the sampler's, [B, T].
        mask: 1 for response tokens, [B, T].
    """
    mask = mask.to(old_logprobs.dtype)
    return weights_of_log_ratios(token_log_ratios(old_logprobs, behaviour_logprobs, mask), mask, correction)


def token_log_ratios(
    trainer_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Δ_t = log π_trainer − log π_behaviour on the response tokens, 0 elsewhere ([B, T], detached): the
    correction's input, and what a step keeps of a micro-batch for the mismatch table."""
    mask = mask.to(trainer_logprobs.dtype)
    return torch.nan_to_num((trainer_logprobs - behaviour_logprobs) * mask, nan=0.0).detach()


def weights_of_log_ratios(delta: torch.Tensor, mask: torch.Tensor, correction: RolloutCorrection) -> torch.Tensor:
    """w_t from Δ_t = log π_old − log π_behaviour ([B, T], 0 on padding) and the mask in Δ's dtype: what
    `rlvr analyze mismatch` replays on the stored Δ."""
    low, high = correction.bounds()
    mode = correction.mode
    if mode == "none":
        return mask
    if mode in ("token_tis", "token_mask", "icepop"):
        ratio = torch.exp(delta)  # [B, T]
    elif mode in ("sequence_tis", "sequence_mask"):
        ratio = torch.exp(delta.sum(-1, keepdim=True)).expand_as(delta)  # [B, T]: the row's product
    else:  # geometric
        mean = delta.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)
        return inside(torch.exp(mean), low, high).to(mask.dtype).expand_as(delta) * mask
    if mode.endswith("_tis"):
        return torch.clamp(ratio, min=low, max=high) * mask
    return ratio * inside(ratio, low, high).to(mask.dtype) * mask
