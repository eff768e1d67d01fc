"""Sampling guided by the lake's history: which problems to draw, and how many, before any rollout.

DAPO's dynamic sampling throws away the groups whose responses all agree (solve rate 0 or 1), and a
fixed oversampling factor pays for them in advance, whatever the policy's current keep rate. The lake
holds every problem's past groups, so the platform can predict, problem by problem, how likely a new
group is to carry signal, and then

- prefer problems whose posterior solve rate lies inside the band, passing over those the policy has
  lately always solved or always failed (GRESO's pre-rollout filtering, Zheng et al. 2025);
- draw only as many groups as those predictions need to fill the batch with a stated confidence
  (adaptive oversampling), instead of `oversample` × the groups still missing.

The model: a problem's solve rate p ~ Beta(α, β). The prior is fitted per (source, level) by the method
of moments to the latest iterations' group solve rates, net of binomial noise (the current policy's
spread of difficulty); a problem's own past groups add their successes and failures, discounted by
age. A new group of G responses is kept when k/G lies strictly inside the band; under the posterior k
is beta-binomial, so the keep probability is a finite sum. Pure: the sampler reads the history (`sampler.py`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np
import polars as pl
from pydantic import Field

from storage.config import Strict

HISTORY_COLUMNS = ["problem_id", "iteration", "solve_rate", "n_samples"]
MIN_GROUPS_FOR_A_PRIOR = 8  # fewer groups at a (source, level): its prior is the whole history's


class GuidanceConfig(Strict):
    """How the lake's history guides dynamic sampling (off: every round draws `oversample` × the missing groups
    by the mix, at random)."""

    enabled: bool = Field(
        False,
        description="rank the drawn candidates by their predicted keep probability and "
        "size each round by those predictions instead of `oversample`",
    )
    confidence: float = Field(
        0.8,
        gt=0,
        lt=1,
        description="probability that a round fills the batch, by the "
        "predictions (higher draws more groups, fewer second rounds)",
    )
    history: int = Field(10, ge=1, description="past iterations of groups read from the lake")
    prior_iterations: int = Field(
        2,
        ge=1,
        description="latest iterations whose groups fit the prior per source "
        "and level (the current policy's spread of difficulty)",
    )
    discount: float = Field(0.7, gt=0, le=1, description="weight of a problem's own evidence per iteration of age")
    pool: float = Field(
        3.0,
        ge=1,
        description="candidates drawn by the mix per group missing; a round draws the "
        "likeliest of them, as many as the predictions need (so this is also the most it draws)",
    )


def beta_prior(solve_rates: Sequence[float], group_size: int) -> tuple[float, float]:
    """Beta(α, β) whose mean and variance match these groups' solve rates, net of the binomial noise of
    G samples: Var(k/G) = m(1 − m)/G + Var(p)(1 − 1/G)."""
    rates = np.asarray(solve_rates, dtype=float)
    mean = float(np.clip(rates.mean(), 0.02, 0.98)) if rates.size else 0.5
    observed = float(rates.var()) if rates.size > 1 else 0.0
    spread = (observed - mean * (1 - mean) / group_size) / (1 - 1 / group_size) if group_size > 1 else observed
    spread = min(max(spread, mean * (1 - mean) / 201), mean * (1 - mean) / 2)  # strength α + β within [1, 200]
    strength = mean * (1 - mean) / spread - 1
    return mean * strength, (1 - mean) * strength


_lgamma = np.vectorize(math.lgamma, otypes=[float])


def _log_beta(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _lgamma(a) + _lgamma(b) - _lgamma(a + b)


def keep_probability(alpha, beta, group_size: int, band: tuple[float, float] = (0.0, 1.0)) -> np.ndarray:
    """P(k/G strictly inside `band`) for k ~ BetaBinomial(G, α, β): the chance a new group is kept."""
    alpha, beta = np.asarray(alpha, dtype=float), np.asarray(beta, dtype=float)
    low, high = band
    total = np.zeros(np.broadcast(alpha, beta).shape)
    for k in range(group_size + 1):
        if low < k / group_size < high:
            log_choose = math.lgamma(group_size + 1) - math.lgamma(k + 1) - math.lgamma(group_size - k + 1)
            total += np.exp(log_choose + _log_beta(k + alpha, group_size - k + beta) - _log_beta(alpha, beta))
    return np.clip(total, 0.0, 1.0)


def problem_evidence(history: pl.DataFrame, iteration: int, discount: float) -> pl.DataFrame:
    """Per problem, its past groups' successes and failures, each weighted by discount ** age, and its trials
    (responses scored, unweighted)."""
    weight = pl.lit(discount).pow(iteration - pl.col("iteration"))
    solved = pl.col("solve_rate") * pl.col("n_samples")
    return (
        history.filter(pl.col("solve_rate").is_not_null())
        .group_by("problem_id")
        .agg(
            successes=(weight * solved).sum(),
            failures=(weight * (pl.col("n_samples") - solved)).sum(),
            trials=pl.col("n_samples").sum(),
        )
    )


def fitted_priors(history: pl.DataFrame, problems: pl.DataFrame, latest: int, group_size: int) -> pl.DataFrame:
    """(source, level, prior_alpha, prior_beta) from the groups of the `latest` iterations with history, with a
    row of null source and level for the whole of them (the fallback). `problems` says each history problem's
    source and level: the bank, not a round's candidates, which hold few of the problems of past groups."""
    recent_iterations = history["iteration"].unique().sort(descending=True).head(latest)
    recent = history.filter(
        pl.col("iteration").is_in(recent_iterations.implode()) & pl.col("solve_rate").is_not_null()
    ).join(problems.select("problem_id", "source", "level"), on="problem_id", how="left")
    rows = [{"source": None, "level": None, **_prior_row(recent["solve_rate"], group_size)}]
    for (source, level), part in recent.group_by("source", "level"):
        if part.height >= MIN_GROUPS_FOR_A_PRIOR:
            rows.append({"source": source, "level": level, **_prior_row(part["solve_rate"], group_size)})
    return pl.DataFrame(
        rows, schema={"source": pl.String, "level": pl.Int64, "prior_alpha": pl.Float64, "prior_beta": pl.Float64}
    )


def _prior_row(rates: pl.Series, group_size: int) -> dict:
    alpha, beta = beta_prior(rates.to_list(), group_size)
    return {"prior_alpha": alpha, "prior_beta": beta}


def with_posteriors(
    candidates: pl.DataFrame,
    history: pl.DataFrame,
    iteration: int,
    group_size: int,
    prior_iterations: int,
    discount: float,
    bank: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """`candidates` (problem_id, source, level) with each one's posterior (`alpha`, `beta`): the prior fitted to the
    history's latest groups by the source and level the `bank` gives them (default: the candidates'), plus the
    problem's own discounted `successes` and `failures` (0 without any) and its `trials` (null without any)."""
    priors = fitted_priors(history, bank if bank is not None else candidates, prior_iterations, group_size)
    fallback = priors.filter(pl.col("source").is_null()).row(0, named=True)
    evidence = problem_evidence(history, iteration, discount)
    return (
        candidates.join(priors.filter(pl.col("source").is_not_null()), on=["source", "level"], how="left")
        .join(evidence, on="problem_id", how="left", maintain_order="left")
        .with_columns(pl.col("successes", "failures").fill_null(0.0))
        .with_columns(
            alpha=pl.col("prior_alpha").fill_null(fallback["prior_alpha"]) + pl.col("successes"),
            beta=pl.col("prior_beta").fill_null(fallback["prior_beta"]) + pl.col("failures"),
        )
        .drop("prior_alpha", "prior_beta")
    )


def ranked_candidates(
    candidates: pl.DataFrame,
    history: pl.DataFrame,
    iteration: int,
    group_size: int,
    band: tuple[float, float],
    config: GuidanceConfig,
    bank: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """`candidates` (problem_id, source, level; in the mix's random order) with their posterior (alpha, beta),
    `posterior_solve_rate` and `keep_probability`, likeliest to be kept first (ties keep the mix's order). The
    priors are fitted to the history's groups by the source and level the `bank` gives them (default: the
    candidates')."""
    frame = with_posteriors(
        candidates.with_row_index("mix_order"),
        history,
        iteration,
        group_size,
        config.prior_iterations,
        config.discount,
        bank if bank is not None else candidates,
    )
    keep = keep_probability(frame["alpha"].to_numpy(), frame["beta"].to_numpy(), group_size, band)
    return (
        frame.with_columns(
            posterior_solve_rate=pl.col("alpha") / (pl.col("alpha") + pl.col("beta")), keep_probability=pl.Series(keep)
        )
        .sort(["keep_probability", "mix_order"], descending=[True, False])
        .drop("mix_order", "successes", "failures", "trials")
    )


def groups_to_draw(keep_probabilities: Sequence[float], missing: int, confidence: float, cap: int) -> int:
    """The fewest candidates, taken in order, whose kept groups reach `missing` with probability ≥ `confidence`
    (a normal approximation of the Poisson-binomial count, with continuity correction); at most `cap`."""
    z = NormalDist().inv_cdf(confidence)
    mean = variance = 0.0
    limit = min(cap, len(keep_probabilities))
    for n, q in enumerate(keep_probabilities[:limit], start=1):
        mean, variance = mean + q, variance + q * (1 - q)
        if n >= missing and mean - z * math.sqrt(variance) >= missing - 0.5:
            return n
    return max(limit, min(missing, len(keep_probabilities)))
