"""The mismatch figures of `rlvr bench mismatch` (server − trainer log-probs), on numbers worked by hand."""

import math

import pytest

from bench.engine_mismatch import mismatch_figures


def test_figures_per_token_and_per_sequence():
    figures = mismatch_figures([[0.1, -0.2], [0.0, 0.0, 1.0], []])
    assert figures["tokens"] == 5 and figures["sequences"] == 2
    assert figures["mean_abs_delta"] == pytest.approx((0.1 + 0.2 + 1.0) / 5)
    assert figures["max_abs_delta"] == 1.0 and figures["p50_abs_delta"] == 0.1
    assert figures["ratio_min"] == pytest.approx(math.exp(-1.0)) and figures["ratio_max"] == pytest.approx(
        math.exp(0.2)
    )
    assert figures["tokens_outside_half_to_two"] == pytest.approx(1 / 5)  # exp(-1) < 0.5
    # sequence log ratios (trainer − server, summed): +0.1 and −1.0
    assert figures["mean_abs_sequence_log_ratio"] == pytest.approx((0.1 + 1.0) / 2)
    assert figures["max_abs_sequence_log_ratio"] == pytest.approx(1.0)
    assert figures["sequences_outside_half_to_two"] == pytest.approx(1 / 2)
