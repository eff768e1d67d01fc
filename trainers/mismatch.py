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

import bisect
import warnings

import numpy as np
import polars as pl
import torch

from policy.logprobs import padded_spans
from trainers.correction import DEFAULT_BOUNDS, RolloutCorrection, inside, weights_of_log_ratios

MODES = ("token_tis", "sequence_tis", "token_mask", "sequence_mask", "geometric", "icepop")
CHUNK_TOKENS = 1 << 20  # padded tokens a replayed chunk holds: [B, T] float32 of 4 MiB, near the caches


def observed_bounds(correction: RolloutCorrection) -> tuple[float | None, float | None]:
    """The bounds `outside_share` is measured against: the correction's, else the token modes' defaults."""
    return correction.bounds() if correction.mode != "none" else DEFAULT_BOUNDS["token_mask"]


def mismatch_rows(
    rollout_ids: list[str],
    delta: torch.Tensor,
    mask: torch.Tensor,
    correction: RolloutCorrection,
    after_updates: int,
) -> list[dict]:
    """One `mismatch` row per rollout of a micro-batch (`delta` from `token_log_ratios`, [B, T]; `after_updates`:
    optimizer steps the trainer's log-probs were taken after, 0 when they are the batch start's)."""
    kept = mask > 0
    tokens = kept.sum(-1).clamp(min=1).to(delta.dtype)  # [B]
    outside = ~inside(torch.exp(delta), *observed_bounds(correction)) & kept  # [B, T]
    figures = {
        "mean_abs_delta": delta.abs().sum(-1) / tokens,
        "max_abs_delta": delta.abs().amax(-1),
        "sequence_log_ratio": delta.sum(-1),
        "kl_k3": ((torch.exp(delta) - 1 - delta) * kept).sum(-1) / tokens,
        "outside_share": outside.sum(-1) / tokens,
    }
    columns = {name: values.double().cpu().tolist() for name, values in figures.items()}
    flat = delta[kept].double().cpu().tolist()  # the kept tokens' Δ, row after row
    lengths = kept.sum(-1).cpu().tolist()
    rows, start = [], 0
    for i, (rollout_id, length) in enumerate(zip(rollout_ids, lengths)):
        rows.append(
            {
                "rollout_id": rollout_id,
                "log_ratio": flat[start : start + length],
                "n_tokens": length,
                "after_updates": after_updates,
                **{name: values[i] for name, values in columns.items()},
            }
        )
        start += length
    return rows


def mismatch_metrics(rows: list[dict]) -> dict:
    """The step's token-weighted means of the rows' figures (this process's rows), for iteration_metrics."""
    tokens = sum(row["n_tokens"] for row in rows)
    if not tokens:
        return {"mismatch_mean_abs_delta": None, "mismatch_kl_k3": None, "mismatch_outside_share": None}
    return {
        f"mismatch_{name}": sum(row[name] * row["n_tokens"] for row in rows) / tokens
        for name in ("mean_abs_delta", "kl_k3", "outside_share")
    }


def what_each_mode_keeps(
    log_ratios: pl.Series, bounds: dict[str, tuple[float | None, float | None]] | None = None
) -> pl.DataFrame:
    """Per correction mode at its bounds (`bounds` overrides a mode's (low, high)): the share of tokens and of
    sequences it masks, its mean token weight and the effective sample size of its weights,
    (Σ w)² / (n Σ w²) over the kept and masked tokens alike (1: every token weighs the same).

    The rows are replayed shortest first, in chunks of at most CHUNK_TOKENS padded tokens: a chunk pads only to
    its own longest row (a long tail of lengths does not pad every chunk), and every figure is a sum, so the
    order does not change it."""
    corrections = [RolloutCorrection(mode=mode, **_bounds_of(mode, bounds)) for mode in MODES]
    totals = {mode: torch.zeros(4, dtype=torch.float64) for mode in MODES}  # masked tokens, Σw, Σw², masked rows
    tokens = sequences = 0
    # the column's own buffer, not a copy (a first touch of fresh memory is the replay's slowest part); each chunk
    # in float32, as the step computed Δ (the stored float64 values are its float32 ones, exactly)
    with warnings.catch_warnings():  # read-only: the replay only gathers from it
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.from_numpy(log_ratios.to_arrow().flatten().to_numpy())
    lengths = torch.from_numpy(log_ratios.list.len().fill_null(0).to_numpy().astype(np.int64, copy=False))
    starts = lengths.cumsum(0) - lengths
    order = torch.argsort(lengths, stable=True)
    for chunk in chunks_by_padded_size(lengths[order].tolist(), CHUNK_TOKENS):
        chosen = order[chunk]
        delta, mask = (values.float() for values in padded_spans(flat, starts[chosen], lengths[chosen]))
        tokens += int(lengths[chosen].sum())
        sequences += int((lengths[chosen] > 0).sum())
        response = mask > 0
        for correction in corrections:
            weights = weights_of_log_ratios(delta, mask, correction)  # [B, T]
            masked = (weights == 0) & response
            totals[correction.mode] += torch.tensor(  # torch's float sums are cascaded: float32 is enough
                [float(masked.sum()), float(weights.sum()), float(weights.square().sum()), float(masked.any(-1).sum())],
                dtype=torch.float64,
            )
    rows = []
    for correction in corrections:
        masked, total, squares, sequences_masked = totals[correction.mode].tolist()
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


def chunks_by_padded_size(sorted_lengths: list[int], budget: int) -> list[slice]:
    """Consecutive slices of rows sorted by length, each as long as its rows × its longest row stays within
    `budget` (a single row longer than it is a chunk of its own)."""
    chunks, start = [], 0
    while start < len(sorted_lengths):
        # the furthest end whose padded size fits: rows × the last (longest) row's length
        end = (
            start
            + 1
            + bisect.bisect_right(
                range(start + 1, len(sorted_lengths)), budget, key=lambda end: (end + 1 - start) * sorted_lengths[end]
            )
        )
        chunks.append(slice(start, end))
        start = end
    return chunks
