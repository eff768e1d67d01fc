"""Sampling guided by the lake's history: the beta-binomial keep probability, the prior fitted to recent groups,
the ranking of candidates, the adaptive round size, and the guided loop on a real lake."""

import math

import numpy as np
import polars as pl
import pytest

from storage.seeds import derive_seed
from tasks.curation.mix import sample_mix
from tasks.iteration import IterationConfig
from tasks.sampling.guided import (
    GuidanceConfig,
    beta_prior,
    groups_to_draw,
    keep_probability,
    ranked_candidates,
)
from tasks.sampling.rounds import DynamicSamplingConfig, fill_batch
from tasks.sampling.sampler import GroupSampler


def exact_keep(alpha: float, beta: float, group_size: int, band=(0.0, 1.0), points: int = 200_001) -> float:
    """The same probability by numerical integration of the binomial over the Beta density."""
    p = np.linspace(0, 1, points)[1:-1]
    density = p ** (alpha - 1) * (1 - p) ** (beta - 1)
    density /= np.trapezoid(density, p)
    inside = sum(
        math.comb(group_size, k) * p**k * (1 - p) ** (group_size - k)
        for k in range(group_size + 1)
        if band[0] < k / group_size < band[1]
    )
    return float(np.trapezoid(density * inside, p))


@pytest.mark.parametrize(
    "alpha,beta,band", [(1.0, 1.0, (0.0, 1.0)), (2.0, 5.0, (0.0, 1.0)), (8.0, 1.5, (0.0, 1.0)), (3.0, 3.0, (0.3, 0.7))]
)
def test_keep_probability_is_the_beta_binomial_chance_of_a_kept_group(alpha, beta, band):
    assert keep_probability(alpha, beta, 8, band) == pytest.approx(exact_keep(alpha, beta, 8, band), abs=2e-3)


def test_keep_probability_of_a_known_solve_rate():
    # a near-certain p = 0.5 (huge α = β): 1 − 2 · 0.5^8; a problem always solved is almost never kept
    assert keep_probability(5e4, 5e4, 8) == pytest.approx(1 - 2 * 0.5**8, abs=1e-3)
    assert keep_probability(200.0, 0.5, 8) < 0.05


def test_the_prior_recovers_the_policys_spread_of_difficulty_net_of_binomial_noise():
    rng = np.random.default_rng(0)
    rates = rng.binomial(8, rng.beta(2.0, 3.0, 20_000)) / 8
    alpha, beta = beta_prior(rates, 8)
    assert alpha / (alpha + beta) == pytest.approx(0.4, abs=0.01)
    assert alpha + beta == pytest.approx(5.0, rel=0.15)  # not the much flatter spread of k / G itself


def candidates(n: int) -> pl.DataFrame:
    return pl.DataFrame({"problem_id": [f"p{i}" for i in range(n)], "source": ["drill"] * n, "level": [1] * n})


def test_candidates_with_signal_in_their_history_come_first_and_saturated_ones_last():
    history = pl.DataFrame(
        {
            "problem_id": ["p3", "p3", "p5", "p5", "p0"] + [f"q{i}" for i in range(20)],
            "iteration": [4, 3, 4, 3, 4] + [4] * 20,
            "solve_rate": [0.5, 0.5, 1.0, 1.0, 0.0] + [0.25, 0.5, 0.75, 1.0] * 5,
            "n_samples": [8] * 25,
        }
    )
    ranked = ranked_candidates(candidates(8), history, 5, 8, (0.0, 1.0), GuidanceConfig(enabled=True))
    order = ranked["problem_id"].to_list()
    assert order[0] == "p3"  # half solved, twice: the likeliest kept
    assert order[-2:] == ["p0", "p5"] or order[-2:] == ["p5", "p0"]  # always failed / always solved: last
    assert order[1:6] == ["p1", "p2", "p4", "p6", "p7"]  # unseen: the prior's chance, in the mix's order
    assert ranked["keep_probability"].is_sorted(descending=True)
    solved = ranked.filter(pl.col("problem_id") == "p5")
    assert solved["posterior_solve_rate"][0] > 0.8


def test_round_size_follows_the_predicted_keep_rate():
    assert groups_to_draw([1.0] * 50, 32, 0.8, cap=50) == 32  # sure to be kept: no oversampling
    high, low = groups_to_draw([0.9] * 200, 32, 0.8, 200), groups_to_draw([0.5] * 200, 32, 0.8, 200)
    assert 32 < high < 40 < 64 < low  # 1 / 0.9 and 1 / 0.5 of what is missing
    assert groups_to_draw([0.9] * 200, 32, 0.95, 200) > high  # more confidence, more groups
    assert groups_to_draw([0.5] * 40, 32, 0.8, cap=40) == 40  # capped by the candidates there are
    rng = np.random.default_rng(1)  # the confidence holds by simulation
    keep = [0.75] * 100
    n = groups_to_draw(keep, 32, 0.8, 100)
    filled = (rng.binomial(n, 0.75, 20_000) >= 32).mean()
    assert 0.78 <= filled <= 0.93


def test_fill_batch_draws_what_the_plan_says():
    asked, planned = [], []

    def draw(n_groups, round_):
        asked.append(n_groups)
        return pl.DataFrame(
            [
                {
                    "group_id": f"r{round_}-g{g}",
                    "problem_id": f"p{round_}-{g}",
                    "reward": float(i % 2),
                    "correct": bool(i % 2),
                    "model_version": 0,
                }
                for g in range(n_groups)
                for i in range(4)
            ]
        )

    def plan(missing, round_):
        planned.append((missing, round_))
        return missing + 1

    batch = fill_batch(draw, DynamicSamplingConfig(groups_per_batch=5, oversample=3.0), plan)
    assert planned == [(5, 1)] and asked == [6] and batch.short_by == 0


def test_each_round_is_planned_under_the_round_fill_batch_counts():
    """A round the plan sized without guidance (no pool could be drawn) still counts: the next round's pool is
    drawn with the next round's seed, not the same one again."""
    planned = []

    def draw(n_groups, round_):  # every group all wrong: nothing kept, every round is drawn
        return pl.DataFrame(
            [
                {
                    "group_id": f"r{round_}-g{g}",
                    "problem_id": f"p{round_}-{g}",
                    "reward": 0.0,
                    "correct": False,
                    "model_version": 0,
                }
                for g in range(n_groups)
                for _ in range(4)
            ]
        )

    fill_batch(
        draw,
        DynamicSamplingConfig(groups_per_batch=2, max_rounds=3),
        lambda missing, round_: planned.append(round_) or 2,
    )
    assert planned == [1, 2, 3]


def test_the_sampler_plans_from_its_history():
    """`GroupSampler.plan` ranks a pool drawn by the mix and sizes the round from the ranked predictions."""
    bank = pl.DataFrame(
        {
            "problem_id": [f"p{i}" for i in range(40)],
            "domain": ["math"] * 40,
            "prompt": ["q"] * 40,
            "answer": ["1"] * 40,
            "level": [1] * 40,
            "source": ["drill"] * 40,
        }
    )
    solved = [f"p{i}" for i in range(0, 40, 2)]  # half the bank: always solved, a few iterations ago
    history = pl.DataFrame(
        {"problem_id": solved * 2, "iteration": [4] * 20 + [3] * 20, "solve_rate": [1.0] * 40, "n_samples": [8] * 40}
    )
    history = pl.concat(
        [
            history,
            pl.DataFrame(
                {
                    "problem_id": [f"x{i}" for i in range(30)],
                    "iteration": [6, 5] * 15,
                    "solve_rate": [0.5, 0.25, 0.75] * 10,
                    "n_samples": [8] * 30,
                }
            ),
        ]
    )
    config = IterationConfig.model_validate(
        {
            "rollout": {"group_size": 8},
            "dynamic_sampling": {"groups_per_batch": 6, "guidance": {"enabled": True, "pool": 3.0}},
        }
    )
    rollout, sampling = config.rollout, config.dynamic_sampling

    def sampler_at(iteration: int, history: pl.DataFrame) -> GroupSampler:
        return GroupSampler(
            None, None, bank, sampling, rollout.mix, rollout.group_size, rollout.seed, iteration, None, history=history
        )

    sampler = sampler_at(7, history)
    n = sampler.plan(6, 2)
    keep = sampler.ranked["keep_probability"].to_list()
    assert sampler.ranked.height == 18 and n == groups_to_draw(keep, 6, 0.8, 18)
    assert not set(sampler.ranked.head(n)["problem_id"]) & set(solved)  # the solved ones are passed over
    assert sampler.planned == [{"round": 2, "groups": n, "expected_kept": pytest.approx(sum(keep[:n]))}]
    pool = sample_mix(
        bank,
        18,
        derive_seed(config.rollout.seed, 7, 2, "draw"),
        config.rollout.mix.level_weights,
        config.rollout.mix.domain_weights,
    )
    assert set(sampler.ranked["problem_id"]) == set(pool["problem_id"])  # drawn with the round's own seed
    fresh = sampler_at(1, history.clear())
    assert fresh.plan(6, 1) == math.ceil(6 * 1.5) and fresh.ranked is None  # no history: the fixed oversampling


def test_the_prior_of_a_source_comes_from_its_past_groups_in_the_bank_not_among_the_candidates():
    """Most problems of past groups are not among a round's candidates: the prior per (source, level) takes
    their source and level from the bank. Source `hard` was solved about 10 % of the time, `easy` about 90 %;
    a fresh candidate of each, with no history of its own, inherits its source's prior."""
    past = [f"h{i}" for i in range(12)] + [f"e{i}" for i in range(12)]
    bank = pl.DataFrame(
        {
            "problem_id": past + ["new-hard", "new-easy"],
            "level": [1] * 26,
            "source": ["hard"] * 12 + ["easy"] * 12 + ["hard", "easy"],
        }
    )
    history = pl.DataFrame(
        {
            "problem_id": past,
            "iteration": [4] * 24,
            "n_samples": [8] * 24,
            "solve_rate": [0.125, 0.0, 0.25] * 4 + [0.875, 1.0, 0.75] * 4,
        }
    )
    candidates = bank.filter(pl.col("problem_id").str.starts_with("new"))
    ranked = ranked_candidates(candidates, history, 5, 8, (0.0, 1.0), GuidanceConfig(enabled=True), bank)
    rate = dict(zip(ranked["problem_id"], ranked["posterior_solve_rate"]))
    assert rate["new-hard"] < 0.2 and rate["new-easy"] > 0.8
    alone = ranked_candidates(candidates, history, 5, 8, (0.0, 1.0), GuidanceConfig(enabled=True))
    assert alone["posterior_solve_rate"].n_unique() == 1  # without the bank: the one fallback prior


def test_a_guided_loop_fills_its_batches_and_stores_everything(prefect_api, tmp_path):
    from helpers import CONFIG, curated

    from flows.iteration import rl_iteration
    from storage.lake import Lake

    lake_uri = str(tmp_path / "lake")
    curated(lake_uri)
    guided = {**CONFIG, "dynamic_sampling": {**CONFIG["dynamic_sampling"], "guidance": {"enabled": True}}}
    results = [rl_iteration(guided, lake_uri=lake_uri) for _ in range(3)]
    assert [r["groups_kept"] for r in results] == [3, 3, 3]
    lake = Lake.open(lake_uri)
    groups, rollouts = lake.read("groups"), lake.read("rollouts")
    assert rollouts.height == groups["n_samples"].sum() and rollouts["rollout_id"].n_unique() == rollouts.height
    first_rounds = groups.filter(pl.col("round") == 1).group_by("iteration").len().sort("iteration")["len"].to_list()
    assert first_rounds[0] == math.ceil(3 * 1.5)  # iteration 1 has no history: the fixed oversampling
    assert all(3 <= n <= 9 for n in first_rounds[1:])  # then sized by prediction, within the pool
