"""The loop's time outside its stage runs (bench/stage_time.py), as the learning and peer benchmarks report it."""

from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from bench.stage_time import outside_share

T0 = datetime(2026, 12, 6, tzinfo=UTC)


def runs(*intervals) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "started_at": [T0 + timedelta(seconds=a) for a, _ in intervals],
            "ended_at": [None if b is None else T0 + timedelta(seconds=b) for _, b in intervals],
        }
    )


def test_time_outside_the_stage_runs_counts_overlapping_runs_once():
    """The overlapped loop's sampler and trainer run at once: [0, 6] and [2, 8] cover 8 s of a 10 s span, not
    12 (which gave a negative share, −73 % in a peer run); [9, 10] adds one; a run inside another adds nothing."""
    overlapped = runs((0, 6), (2, 8), (3, 4), (9, 10))
    assert outside_share(overlapped) == pytest.approx(1 - 9 / 10)


def test_runs_one_after_another_leave_their_gaps_outside():
    assert outside_share(runs((0, 2), (3, 5), (6, 10))) == pytest.approx(2 / 10)
    assert outside_share(runs((0, 10), (4, None))) == pytest.approx(0.0)  # a run that never ended is left out
    assert outside_share(runs((0, None))) is None
