"""Training mixes: a seeded draw from the bank by level (default 20/45/30/5 %) and by domain.

Counts are allocated by largest remainder, so a mix of 100 at 20/45/30/5 is exactly 20/45/30/5.
When a level (or a domain within a level) has fewer problems than its share, it gives all it has
and the shortfall is spread over the others in proportion to their weights.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

import polars as pl

from storage.seeds import derive_seed

DEFAULT_LEVEL_WEIGHTS = {1: 0.20, 2: 0.45, 3: 0.30, 4: 0.05}


def allocate(total: int, weights: dict[Hashable, float], capacity: dict[Hashable, int]) -> dict[Hashable, int]:
    """Integer counts summing to `total`, proportional to `weights`, never above `capacity`."""
    counts = {key: 0 for key in weights}
    remaining = total
    open_keys = [k for k in weights if weights[k] > 0 and capacity.get(k, 0) > 0]
    while remaining > 0 and open_keys:
        weight_sum = sum(weights[k] for k in open_keys)
        exact = {k: remaining * weights[k] / weight_sum for k in open_keys}
        share = {k: math.floor(exact[k]) for k in open_keys}
        by_remainder = sorted(open_keys, key=lambda k: (exact[k] - share[k], weights[k]), reverse=True)
        for k in by_remainder[: remaining - sum(share.values())]:
            share[k] += 1
        for k in open_keys:
            granted = min(share[k], capacity[k] - counts[k])
            counts[k] += granted
            remaining -= granted
        open_keys = [k for k in open_keys if counts[k] < capacity[k]]
    return counts


def sample_mix(
    problems: pl.DataFrame,
    n: int,
    seed: int,
    level_weights: dict[int, float] | None = None,
    domain_weights: dict[str, float] | None = None,
) -> pl.DataFrame:
    """Draw `n` distinct problems: level shares first, then domain shares within each level.

    Without `domain_weights`, domains keep their share of the bank within each level.
    The same (bank, n, seed, weights) always gives the same rows in the same order.
    """
    level_weights = level_weights or DEFAULT_LEVEL_WEIGHTS
    if domain_weights:
        unknown = set(domain_weights) - set(problems["domain"].unique().to_list())
        if unknown:
            raise ValueError(f"domain weights name domains the selection does not hold: {sorted(unknown)}")
    if n > problems.height:
        raise ValueError(f"cannot draw {n} problems: the selection holds only {problems.height}")
    cells = problems.group_by("level", "domain").len()
    level_capacity = {lvl: int(c) for lvl, c in cells.group_by("level").agg(pl.col("len").sum()).iter_rows()}
    level_counts = allocate(n, {lvl: level_weights.get(lvl, 0.0) for lvl in level_capacity}, level_capacity)
    if sum(level_counts.values()) < n:
        raise ValueError(
            f"cannot draw {n} problems with level weights {level_weights}: levels with weight hold "
            f"only {sum(level_counts.values())}"
        )
    parts = []
    for level, level_n in sorted(level_counts.items()):
        domain_capacity = {d: int(c) for lvl, d, c in cells.filter(pl.col("level") == level).iter_rows()}
        weights = (
            {d: domain_weights.get(d, 0.0) for d in domain_capacity}
            if domain_weights
            else {d: float(c) for d, c in domain_capacity.items()}
        )
        domain_counts = allocate(level_n, weights, domain_capacity)
        if sum(domain_counts.values()) < level_n:
            raise ValueError(
                f"level {level}: domains with weight hold only {sum(domain_counts.values())} of the "
                f"{level_n} problems the mix needs"
            )
        for domain, count in sorted(domain_counts.items()):
            if count:
                cell = problems.filter((pl.col("level") == level) & (pl.col("domain") == domain)).sort("problem_id")
                parts.append(cell.sample(count, seed=derive_seed(seed, level, domain) % 2**32))
    if not parts:
        return problems.clear()
    return pl.concat(parts).sample(fraction=1.0, shuffle=True, seed=derive_seed(seed, "order") % 2**32)
