"""Dynamic sampling: the resampling loop, its bound, surplus groups, shortfall handling, metrics."""

import polars as pl
import pytest

from tasks.sampling.rounds import BatchShortfall, DynamicSamplingConfig, fill_batch, sampling_metrics


def fake_policy(solve_rates: list[float], group_size: int = 4):
    """Draws groups whose solve rates cycle through `solve_rates`; records what was asked."""
    asked = []

    def draw(n_groups: int, round_: int) -> pl.DataFrame:
        asked.append(n_groups)
        rows = []
        for g in range(n_groups):
            index = sum(asked[:-1]) + g
            rate = solve_rates[index % len(solve_rates)]
            correct = [i < round(rate * group_size) for i in range(group_size)]
            rows += [
                {
                    "group_id": f"r{round_}-g{g}",
                    "problem_id": f"p{index}",
                    "reward": float(c),
                    "correct": c,
                    "model_version": 0,
                }
                for c in correct
            ]
        return pl.DataFrame(rows)

    return draw, asked


def test_the_loop_draws_until_the_batch_is_full():
    draw, asked = fake_policy([0.0, 0.5, 1.0, 0.25])  # half the groups are informative
    batch = fill_batch(draw, DynamicSamplingConfig(groups_per_batch=6, oversample=1.0, max_rounds=10))
    assert batch.short_by == 0 and batch.rollouts["group_id"].n_unique() == 6
    assert asked == [6, 3, 2, 1]  # each round asks for the groups still missing
    assert batch.rounds == 4
    reasons = batch.groups["filter_reason"].value_counts().sort("filter_reason", nulls_last=True)
    assert dict(reasons.rows()) == {"all_correct": 3, "all_wrong": 3, None: 6}  # 12 groups drawn


def test_surplus_informative_groups_are_recorded_not_used():
    draw, _ = fake_policy([0.5])
    batch = fill_batch(draw, DynamicSamplingConfig(groups_per_batch=4, oversample=2.0))
    assert batch.rounds == 1 and batch.rollouts["group_id"].n_unique() == 4
    assert batch.groups["filter_reason"].to_list() == [None] * 4 + ["surplus"] * 4
    assert batch.groups["kept"].sum() == 4


def test_the_round_bound_gives_a_smaller_batch_or_a_clear_error():
    draw, asked = fake_policy([0.0, 0.0, 0.0, 0.5])  # one group in four carries signal
    batch = fill_batch(draw, DynamicSamplingConfig(groups_per_batch=8, oversample=1.0, max_rounds=2))
    # round 1: 8 groups, 2 informative; round 2: the 6 missing, 1 informative; then the bound
    assert batch.rounds == 2 and asked == [8, 6] and batch.short_by == 8 - 3
    draw, _ = fake_policy([1.0])
    with pytest.raises(BatchShortfall, match="after 3 generation rounds only 0 of 5 groups were informative"):
        fill_batch(draw, DynamicSamplingConfig(groups_per_batch=5, max_rounds=3, on_shortfall="fail"))


def test_a_narrower_band():
    draw, _ = fake_policy([0.25, 0.5, 0.75])
    batch = fill_batch(draw, DynamicSamplingConfig(groups_per_batch=3, band=(0.3, 0.7), oversample=3.0))
    assert set(batch.rollouts["solve_rate"].unique().to_list()) == {0.5}
    assert batch.groups.filter(pl.col("filter_reason") == "outside_band").height == 6


def test_metrics():
    draw, _ = fake_policy([0.0, 0.25, 0.5, 1.0])
    batch = fill_batch(draw, DynamicSamplingConfig(groups_per_batch=2, oversample=2.0))
    metrics = sampling_metrics(batch.groups)
    assert metrics["groups"] == 4 and metrics["filtered_share"] == 0.5
    assert metrics["solve_rate_histogram"] == {"0.0-0.2": 1, "0.2-0.4": 1, "0.4-0.6": 1, "0.6-0.8": 0, "0.8-1.0": 1}
    assert metrics["learning_zone_share"] == 0.5
