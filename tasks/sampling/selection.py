"""Selection by the difficulty ledger: which of the bank's problems a round draws first.

A trainer draws its bank epoch after epoch at random. The lake remembers every group of every problem (the
`problem_history` view, keyed by the problem's content hash, across runs), so before any rollout the platform
can say of each problem whether another group of it is likely to teach. Each problem is given one label,
`drawn_as`, and a tier; a round draws by the training mix from the first tier, then the next:

- tier 0: `unseen` (no group of it yet), `zone` (its posterior mean solve rate lies inside the learning zone,
  20-50 % by default: the band where a group's advantages are largest) and `revisit` (set aside, but drawn
  again at `revisit_rate` an iteration, so that a skill the policy has forgotten is noticed);
- tier 1: `outside_zone` (neither set aside nor in the zone);
- tier 2, set aside: `retired` (its pass rate over its groups, discounted by age, reached `retire_above`:
  ScaleRL's no-positive-resampling, Khatri et al. 2025, arXiv 2510.13786, retires prompts at 0.9) and
  `predicted_uniform` (the posterior gives a group of G responses that all agree, all right or all wrong, at
  least `skip_uniform`: GRESO's pre-rollout skip, Zheng et al. 2025, arXiv 2506.02177; DAPO would drop it).

Set-aside problems are drawn only when the other tiers cannot fill a round, so a small bank never runs dry.
Off by default: on `configs/peer-epochs.yaml` (with guidance) it drew fewer rollouts per kept group and learned
less per step than the mix's random draw (`rlvr bench peer`, docs/benchmarks.md).
The posterior is guided sampling's (`guided.py`): a Beta prior fitted per source and level to the latest
groups, plus the problem's own successes and failures, each weighted by `discount` per iteration of age.
Retirement reads the discounted pass rate alone, which age does not change: a retired problem stays retired
until a revisit's group says otherwise. Pure: the sampler reads the ledger and draws (`sampler.py`).
"""

from __future__ import annotations

import polars as pl
from pydantic import Field, model_validator

from storage.config import Strict
from storage.seeds import derive_seed
from tasks.curation.mix import sample_mix
from tasks.sampling.guided import keep_probability, with_posteriors

LEARNING_ZONE = (0.2, 0.5)
TIERS = {"unseen": 0, "zone": 0, "revisit": 0, "outside_zone": 1, "retired": 2, "predicted_uniform": 2}


class SelectionConfig(Strict):
    """Which problems a round draws first, by each one's groups in the lake (tasks/sampling/selection.py)."""

    enabled: bool = Field(
        False,
        description="order each round's draw by the difficulty ledger (off: by the mix alone); off by default: "
        "on configs/peer-epochs.yaml it cost accuracy (docs/benchmarks.md#on-a-bank-revisited-for-epochs)",
    )
    retire_above: float = Field(
        0.9, gt=0, le=1, description="retire a problem whose discounted pass rate reached this (ScaleRL: 0.9)"
    )
    min_trials: int = Field(8, ge=1, description="responses scored of a problem before it may be retired")
    skip_uniform: float = Field(
        0.75,
        gt=0,
        le=1,
        description="set aside a problem whose next group agrees throughout (all right or all wrong) with at "
        "least this posterior probability (GRESO)",
    )
    zone: tuple[float, float] = Field(
        LEARNING_ZONE, description="posterior mean solve rates drawn first (the learning zone)"
    )
    revisit_rate: float = Field(
        0.05, ge=0, le=1, description="share of the set-aside problems drawn first again each iteration"
    )
    discount: float = Field(0.9, gt=0, le=1, description="weight of a problem's evidence per iteration of age")
    history: int = Field(0, ge=0, description="past iterations of the ledger read (0: all of them)")
    prior_iterations: int = Field(
        2, ge=1, description="latest iterations whose groups fit the prior per source and level"
    )

    @model_validator(mode="after")
    def _zone_is_a_band(self):
        """`zone` is a band of solve rates: 0 ≤ low < high ≤ 1."""
        low, high = self.zone
        if not 0 <= low < high <= 1:
            raise ValueError(f"selection.zone {self.zone}: needs 0 ≤ low < high ≤ 1")
        return self


def selection_labels(
    bank: pl.DataFrame, ledger: pl.DataFrame, iteration: int, group_size: int, config: SelectionConfig, seed: int
) -> pl.DataFrame:
    """Per bank problem (problem_id, source, level): `drawn_as`, `tier` and its `posterior_solve_rate` (null when
    unseen), from the `ledger`'s groups (problem_id, iteration, solve_rate, n_samples) before `iteration`."""
    ledger = ledger.filter(pl.col("iteration") < iteration)
    seen = bank.select("problem_id", "source", "level").join(ledger.select("problem_id").unique(), on="problem_id")
    if seen.is_empty():
        return bank.select("problem_id", drawn_as=pl.lit("unseen"), tier=pl.lit(0), posterior_solve_rate=None).cast(
            {"posterior_solve_rate": pl.Float64}
        )
    frame = with_posteriors(seen, ledger, iteration, group_size, config.prior_iterations, config.discount, bank)
    uniform = 1 - keep_probability(frame["alpha"].to_numpy(), frame["beta"].to_numpy(), group_size)
    mean = pl.col("alpha") / (pl.col("alpha") + pl.col("beta"))
    pass_rate = pl.col("successes") / (pl.col("successes") + pl.col("failures"))
    low, high = config.zone
    revisited = pl.col("problem_id").hash(derive_seed(seed, iteration, "revisit") % 2**63) < config.revisit_rate * 2**64
    set_aside = (
        pl.when((pl.col("trials") >= config.min_trials) & (pass_rate >= config.retire_above))
        .then(pl.lit("retired"))
        .when(pl.Series(uniform) >= config.skip_uniform)
        .then(pl.lit("predicted_uniform"))
    )
    labelled = frame.select(
        "problem_id",
        posterior_solve_rate=mean,
        drawn_as=pl.when(set_aside.is_not_null() & revisited)
        .then(pl.lit("revisit"))
        .otherwise(set_aside)
        .fill_null(pl.when(mean.is_between(low, high)).then(pl.lit("zone")).otherwise(pl.lit("outside_zone"))),
    )
    return (
        bank.select("problem_id")
        .join(labelled, on="problem_id", how="left", maintain_order="left")
        .with_columns(pl.col("drawn_as").fill_null("unseen"))
        .with_columns(tier=pl.col("drawn_as").replace_strict(TIERS, return_dtype=pl.Int32))
        .select("problem_id", "drawn_as", "tier", "posterior_solve_rate")
    )


def draw_by_tier(
    available: pl.DataFrame,
    labels: pl.DataFrame | None,
    n: int,
    seed: int,
    level_weights: dict[int, float] | None,
    domain_weights: dict[str, float] | None,
) -> pl.DataFrame:
    """`n` of the `available` problems by the mix, tier 0 first, then 1, then 2 (each tier by the mix within it).
    Without labels, or while every available problem is in tier 0, the draw is the mix's own for this seed."""
    tiers = (
        available.join(labels.select("problem_id", "tier"), on="problem_id", how="left", maintain_order="left")
        if labels is not None
        else available.with_columns(tier=pl.lit(0, pl.Int32))
    ).with_columns(pl.col("tier").fill_null(0))
    parts, missing = [], n
    for tier in range(max(TIERS.values()) + 1):
        members = tiers.filter(pl.col("tier") == tier).drop("tier")
        take = min(missing, members.height)
        if take == 0:
            continue
        tier_seed = seed if tier == 0 else derive_seed(seed, "tier", tier)
        try:
            parts.append(sample_mix(members, take, tier_seed, level_weights, domain_weights))
        except ValueError:  # the mix's levels or domains hold fewer in this tier: its own order, seeded
            if labels is None:  # no tiers: the mix's own error, as an unselected draw gives it
                raise
            parts.append(members.sample(take, seed=tier_seed % 2**32))
        missing -= take
    return pl.concat(parts) if parts else available.clear()
