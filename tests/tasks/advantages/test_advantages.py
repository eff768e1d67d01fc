"""Advantage estimators, DBB state, overlong shaping, group filtering and staleness: hand-worked values."""

import math

import polars as pl
import pytest

from tasks.advantages.estimators import EPSILON, advantages, dbb_update, with_dbb_state
from tasks.advantages.shaping import shape_overlong, staleness, truncated_importance_weight
from tasks.sampling.groups import group_statistics

# group g1: rewards 1, 0, 0, 1 (mean 0.5, sample std √(1/3)); group g2: all 1 (std 0)
ROLLOUTS = pl.DataFrame(
    {
        "group_id": ["g1"] * 4 + ["g2"] * 4,
        "problem_id": ["p1"] * 4 + ["p2"] * 4,
        "model_version": [0] * 8,
        "reward": [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0],
        "correct": [True, False, False, True, True, True, True, True],
    }
)


def advantage_values(estimator, frame=ROLLOUTS):
    return advantages(frame, estimator)["advantage"].to_list()


def test_grpo():
    scale = 0.5 / (math.sqrt(1 / 3) + EPSILON)  # 0.5 / (0.57735 + 1e-4) = 0.86588
    assert advantage_values("grpo") == pytest.approx([scale, -scale, -scale, scale, 0, 0, 0, 0])


def test_dr_grpo_drops_the_std():
    assert advantage_values("dr_grpo") == pytest.approx([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])


def test_rloo_leaves_one_out():
    # a 1 in g1 is compared with the other three (1, 0, 0): mean 1/3, so 2/3; a 0 with (1, 0, 1): −2/3
    assert advantage_values("rloo") == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0, 0])


def test_batch_std_normalises_by_the_whole_batch():
    batch_std = math.sqrt(((6 * 0.25**2) + (2 * 0.75**2)) / 7)  # rewards' sample std over all 8: 0.46291
    scale = 0.5 / (batch_std + EPSILON)
    assert advantage_values("batch_std") == pytest.approx([scale, -scale, -scale, scale, 0, 0, 0, 0])


def test_dbb_uses_the_problem_history_as_baseline():
    state = pl.DataFrame({"problem_id": ["p1", "p2"], "dbb_alpha": [3.0, 1.0], "dbb_beta": [1.0, 3.0]})
    values = advantage_values("dbb", with_dbb_state(ROLLOUTS, state))
    # p1's baseline 3/4: 1 → 0.25, 0 → −0.75; p2's 1/4: the all-correct group still carries +0.75 each
    assert values == pytest.approx([0.25, -0.75, -0.75, 0.25, 0.75, 0.75, 0.75, 0.75])
    with pytest.raises(ValueError, match="dbb_alpha"):
        advantages(ROLLOUTS, "dbb")


def test_dbb_state_across_iterations():
    state = pl.DataFrame({"problem_id": ["p1", "p9"], "dbb_alpha": [3.0, 5.0], "dbb_beta": [1.0, 5.0]})
    after = dbb_update(state, ROLLOUTS, discount=0.5)
    rows = {r["problem_id"]: (r["dbb_alpha"], r["dbb_beta"]) for r in after.iter_rows(named=True)}
    assert rows["p1"] == (0.5 * 3 + 2, 0.5 * 1 + 2)  # 2 successes, 2 failures
    assert rows["p2"] == (0.5 * 1 + 4, 0.5 * 1 + 0)  # first seen: the prior (1, 1), then 4 successes
    assert rows["p9"] == (5.0, 5.0)  # not sampled: unchanged
    again = dbb_update(after, ROLLOUTS.filter(pl.col("problem_id") == "p2"), discount=0.5)
    assert dict(zip(again["problem_id"], again["dbb_alpha"]))["p2"] == pytest.approx(0.5 * 4.5 + 4)


def test_unknown_estimator():
    with pytest.raises(ValueError, match="unknown estimator"):
        advantages(ROLLOUTS, "ppo")


def test_overlong_shaping():
    frame = pl.DataFrame(
        {
            "reward": [1.0] * 5,
            "n_tokens": [70, 80, 90, 100, 120],
            "finish_reason": ["stop", "stop", "stop", "length", "length"],
        }
    )
    shaped = shape_overlong(frame, max_length=100, cache_length=20, factor=1.0)
    # L ≤ 80: no penalty; 90: halfway down the 20-token buffer, −0.5; 100: −1; beyond: floored at −1
    assert shaped["shaped_reward"].to_list() == pytest.approx([1.0, 1.0, 0.5, 0.0, 0.0])
    assert shaped["loss_mask"].to_list() == [1.0] * 5
    masked = shape_overlong(frame, 100, 20, factor=0.5, mask_truncated=True)
    assert masked["shaped_reward"].to_list() == pytest.approx([1.0, 1.0, 0.75, 0.5, 0.5])
    assert masked["loss_mask"].to_list() == [1.0, 1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="cache_length"):
        shape_overlong(frame, 100, 100)


def test_group_filter_reasons():
    frame = pl.concat(
        [
            ROLLOUTS,
            pl.DataFrame(
                {
                    "group_id": ["g3"] * 4,
                    "problem_id": ["p3"] * 4,
                    "model_version": [0] * 4,
                    "reward": [0.0] * 4,
                    "correct": [False] * 4,
                }
            ),
            pl.DataFrame(
                {
                    "group_id": ["g4"] * 4,
                    "problem_id": ["p4"] * 4,
                    "model_version": [0] * 4,
                    "reward": [1.0, 0, 0, 0],
                    "correct": [True, False, False, False],
                }
            ),
        ]
    )
    stats = group_statistics(frame).sort("group_id")
    assert stats.select("group_id", "solve_rate", "kept", "filter_reason").rows() == [
        ("g1", 0.5, True, None),
        ("g2", 1.0, False, "all_correct"),
        ("g3", 0.0, False, "all_wrong"),
        ("g4", 0.25, True, None),
    ]
    narrow = group_statistics(frame, band=(0.3, 0.9)).sort("group_id")
    assert narrow["filter_reason"].to_list() == [None, "all_correct", "all_wrong", "outside_band"]
    assert stats.filter(pl.col("group_id") == "g1")["std_reward"][0] == pytest.approx(math.sqrt(1 / 3))


def test_staleness_classes():
    frame = pl.DataFrame({"model_version": [5, 4, 2, 1]})
    classified = staleness(frame, current_version=5, max_stale_versions=3)
    assert classified.select("staleness", "freshness").rows() == [
        (0, "fresh"),
        (1, "acceptable"),
        (3, "acceptable"),
        (4, "stale"),
    ]


def test_truncated_importance_weight():
    frame = pl.DataFrame({"current": [-1.0, -2.0, -3.0], "behaviour": [-2.0, -1.0, -3.0]})
    weights = frame.select(w=truncated_importance_weight(pl.col("current"), pl.col("behaviour"), cap=2.0))["w"]
    assert weights.to_list() == pytest.approx([2.0, math.exp(-1), 1.0])  # e ≈ 2.72 truncated to 2


def test_keeping_informative_groups_then_advantages_matches_the_group_table():
    from tasks.sampling.groups import keep_informative_groups, with_group_columns

    kept = advantages(keep_informative_groups(with_group_columns(ROLLOUTS)), "grpo")
    assert kept["group_id"].unique().to_list() == ["g1"]
    assert kept["advantage"].to_list() == pytest.approx(advantage_values("grpo")[:4])
    assert group_statistics(ROLLOUTS).filter("kept")["group_id"].to_list() == ["g1"]


# ---- DBB keeps the groups that are its reason to exist (issue 14) -------------------------------------------
def _dbb_frame(rewards_by_group):
    rows = [
        {
            "rollout_id": f"{g}-{i}",
            "group_id": g,
            "problem_id": g,
            "round": 1,
            "model_version": 0,
            "n_tokens": 10,
            "finish_reason": "stop",
            "reward": r,
            "correct": bool(r),
        }
        for g, rewards in rewards_by_group.items()
        for i, r in enumerate(rewards)
    ]
    return pl.DataFrame(rows)


def test_dbb_keeps_an_all_correct_group_on_a_hard_problem():
    from tasks.advantages.stage import AdvantageConfig, compute
    from tasks.sampling.rounds import DynamicSamplingConfig

    # history by hand: "hard" was solved 1 of 9 times (α = 1, β = 9 → baseline 0.1); "easy" 9 of 10 (α 9, β 1 → 0.9);
    # "even" has baseline exactly 1.0 (α 5, β 0) and is all-correct again: no signal at all.
    state = pl.DataFrame(
        {"problem_id": ["hard", "easy", "even"], "dbb_alpha": [1.0, 9.0, 5.0], "dbb_beta": [9.0, 1.0, 0.0]}
    )
    scored = _dbb_frame({"hard": [1.0] * 4, "easy": [0.0] * 4, "even": [1.0] * 4, "mixed": [1.0, 0.0, 1.0, 0.0]})
    result = compute(scored, AdvantageConfig(estimator="dbb"), DynamicSamplingConfig(groups_per_batch=8), 0, state)
    groups = {row["group_id"]: row for row in result["groups"].iter_rows(named=True)}
    assert groups["hard"]["kept"] and groups["easy"]["kept"] and groups["mixed"]["kept"]
    assert not groups["even"]["kept"] and groups["even"]["filter_reason"] == "zero_advantage"
    advantages = dict(result["advantages"].select("rollout_id", "advantage").rows())
    assert advantages["hard-0"] == pytest.approx(0.9) and advantages["easy-0"] == pytest.approx(-0.9)
    assert set(result["batch"]["group_id"]) == {"hard", "easy", "mixed"}
    # the user's band still decides where it says so
    narrow = compute(
        scored, AdvantageConfig(estimator="dbb"), DynamicSamplingConfig(groups_per_batch=8, band=(0.2, 0.8)), 0, state
    )
    assert set(narrow["batch"]["group_id"]) == {"mixed"}


def test_a_band_past_zero_and_one_keeps_all_correct_and_all_wrong_groups():
    from tasks.sampling.groups import filter_reason, kept

    rates = pl.DataFrame({"solve_rate": [0.0, 0.5, 1.0]})
    assert rates.select(kept=kept((-0.1, 1.1)))["kept"].to_list() == [True, True, True]
    assert rates.select(reason=filter_reason((0.0, 1.0)))["reason"].to_list() == ["all_wrong", None, "all_correct"]
    assert rates.select(reason=filter_reason((0.2, 0.4)))["reason"].to_list() == [
        "all_wrong",
        "outside_band",
        "all_correct",
    ]
