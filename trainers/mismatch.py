"""The gap between the sampler's log-probs and the trainer's, kept for every trained rollout (the `mismatch`
table), and what each rollout correction would make of it, from those stored rows alone.

Per rollout, with Δ_t = log π_trainer(t) − log π_behaviour(t) over its response tokens (π_trainer: the trained
version at the batch's start, the correction's π_old):
- `mean_abs_delta`, `max_abs_delta`: mean and largest |Δ_t|;
- `sequence_log_ratio`: Σ_t Δ_t, the log of the sequence's importance ratio;
- `kl_k3`: the mean over tokens of exp(Δ_t) − 1 − Δ_t, the k3 estimate of KL(π_behaviour ‖ π_trainer) from
  samples of π_behaviour (Schulman's k3, always ≥ 0);
- `outside_share`: the share of tokens whose ratio exp(Δ_t) lies outside the run's correction bounds
  (the token modes' (none, 3) when no correction is on).
`what_each_mode_keeps` replays `trainers/correction.py` on the stored Δ lists, chunk by chunk.
"""

from __future__ import annotations

import polars as pl
import torch

from trainers.correction import DEFAULT_BOUNDS, RolloutCorrection, correction_weights, inside

MODES = ("token_tis", "sequence_tis", "token_mask", "sequence_mask", "geometric", "icepop")
CHUNK_ROWS = 65_536


def observed_bounds(correction: RolloutCorrection) -> tuple[float | None, float | None]:
    """The bounds `outside_share` is measured against: the correction's, else the token modes' defaults."""
    return correction.bounds() if correction.mode != "none" else DEFAULT_BOUNDS["token_mask"]


def mismatch_rows(
    rollout_ids: list[str],
    trainer_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    correction: RolloutCorrection,
    after_updates: int,
) -> list[dict]:
    """One `mismatch` row per rollout of a micro-batch ([B, T] tensors; `after_updates`: optimizer steps the
    trainer's log-probs were taken after, 0 when they are the batch start's)."""
    mask = mask.to(trainer_logprobs.dtype)
    delta = torch.nan_to_num((trainer_logprobs - behaviour_logprobs) * mask, nan=0.0).detach()  # [B, T]
    tokens = mask.sum(-1).clamp(min=1.0)  # [B]
    outside = ~inside(torch.exp(delta), *observed_bounds(correction)) & (mask > 0)  # [B, T]
    figures = {
        "mean_abs_delta": delta.abs().sum(-1) / tokens,
        "max_abs_delta": delta.abs().amax(-1),
        "sequence_log_ratio": delta.sum(-1),
        "kl_k3": ((torch.exp(delta) - 1 - delta) * mask).sum(-1) / tokens,
        "outside_share": outside.sum(-1) / tokens,
    }
    columns = {name: values.double().cpu().tolist() for name, values in figures.items()}
    lengths = mask.sum(-1).long().cpu().tolist()
    deltas = delta.double().cpu().tolist()
    return [
        {
            "rollout_id": rollout_id,
            "log_ratio": [value for value, kept in zip(row, weights) if kept] if length else [],
            "n_tokens": length,
            "after_updates": after_updates,
            **{name: values[i] for name, values in columns.items()},
        }
        for i, (rollout_id, row, weights, length) in enumerate(zip(rollout_ids, deltas, mask.cpu().tolist(), lengths))
    ]


def mismatch_metrics(rows: list[dict]) -> dict:
    """The step's token-weighted means of the rows' figures (this process's rows), for iteration_metrics."""
    tokens = sum(row["n_tokens"] for row in rows)
    if not tokens:
        return {"mismatch_mean_abs_delta": None, "mismatch_kl_k3": None, "mismatch_outside_share": None}
    return {
        f"mismatch_{name}": sum(row[name] * row["n_tokens"] for row in rows) / tokens
        for name in ("mean_abs_delta", "kl_k3", "outside_share")
    }


def padded(lists: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max((len(row) for row in lists), default=0)
    values = torch.zeros(len(lists), max(width, 1), dtype=torch.float64)
    mask = torch.zeros_like(values)
    for i, row in enumerate(lists):
        values[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
        mask[i, : len(row)] = 1.0
    return values, mask


def what_each_mode_keeps(
    log_ratios: pl.Series, bounds: dict[str, tuple[float | None, float | None]] | None = None
) -> pl.DataFrame:
    """Per correction mode at its bounds (`bounds` overrides a mode's (low, high)): the share of tokens and of
    sequences it masks, its mean token weight and the effective sample size of its weights,
    (Σ w)² / (n Σ w²) over the kept and masked tokens alike (1: every token weighs the same)."""
    corrections = [RolloutCorrection(mode=mode, **_bounds_of(mode, bounds)) for mode in MODES]
    totals = {mode: torch.zeros(6, dtype=torch.float64) for mode in MODES}  # tokens, masked, Σw, Σw², rows, rows masked
    for start in range(0, len(log_ratios), CHUNK_ROWS):
        delta, mask = padded(log_ratios.slice(start, CHUNK_ROWS).to_list())
        for correction in corrections:
            weights = correction_weights(delta, torch.zeros_like(delta), mask, correction)  # [B, T]
            masked = (weights == 0) & (mask > 0)
            totals[correction.mode] += torch.stack(
                [
                    mask.sum(),
                    masked.sum(),
                    weights.sum(),
                    (weights**2).sum(),
                    (mask.sum(-1) > 0).sum(),
                    (masked.any(-1) & (mask.sum(-1) > 0)).sum(),
                ]
            ).double()
    rows = []
    for correction in corrections:
        tokens, masked, total, squares, sequences, sequences_masked = totals[correction.mode].tolist()
        low, high = correction.bounds()
        rows.append(
            {
                "mode": correction.mode,
                "low": low,
                "high": high,
                "tokens_masked_share": masked / tokens if tokens else 0.0,
                "sequences_masked_share": sequences_masked / sequences if sequences else 0.0,
                "mean_weight": total / tokens if tokens else 0.0,
                "effective_sample_size": total**2 / (tokens * squares) if squares else 0.0,
            }
        )
    return pl.DataFrame(rows, schema_overrides={"low": pl.Float64, "high": pl.Float64})


def _bounds_of(mode: str, bounds: dict | None) -> dict:
    low, high = (bounds or {}).get(mode, (None, None))
    return {"low": low, "high": high}
