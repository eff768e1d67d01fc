"""How much of a loop's wall time no stage run covers, for the benchmarks that time the loop (learning, peer)."""

from __future__ import annotations

import polars as pl


def outside_share(runs: pl.DataFrame) -> float | None:
    """The share of the span from the first run's start to the last run's end that no run covers: stage runs
    that overlap (the overlapped loop's sampler and trainer, a run inside another) count once, as the union of
    their intervals. None when no run has ended."""
    spans = runs.select("started_at", "ended_at").drop_nulls().sort("started_at")
    if spans.is_empty():
        return None
    covered, start, end = 0.0, None, None
    for began, ended in spans.iter_rows():
        if end is None or began > end:  # a gap: the merged interval before it is complete
            if end is not None:
                covered += (end - start).total_seconds()
            start, end = began, ended
        else:
            end = max(end, ended)
    covered += (end - start).total_seconds()
    span = (spans["ended_at"].max() - spans["started_at"].min()).total_seconds()
    return 1 - covered / span if span > 0 else None
