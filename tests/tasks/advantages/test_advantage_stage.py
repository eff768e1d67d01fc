"""The advantage stage over the lake: groups, advantages, batches and DBB state, with lineage by SQL."""

import math

import polars as pl
import pytest
from helpers import seed_iteration

from storage.catalog import open_catalog
from tasks.advantages.stage import (
    AdvantageConfig,
    batch_id_of,
    batch_outputs,
    compute,
    latest_dbb_state,
    scored_rollouts,
)
from tasks.sampling.rounds import DynamicSamplingConfig
from tasks.verification.stage import VerifyConfig, reward_outputs, rollouts_with_problems, score_rollouts


def verified_iteration(lake, iteration=1):
    seed_iteration(lake, iteration)
    rewards = score_rollouts(rollouts_with_problems(lake, iteration), VerifyConfig(workers=0))
    with lake.run("test", "verify", {}, iteration=iteration) as run:
        lake.commit(reward_outputs(iteration, rewards), run)


def run_stage(lake, iteration, config=AdvantageConfig(), sampling=DynamicSamplingConfig()):
    results = compute(
        scored_rollouts(lake, iteration, None),
        config,
        sampling,
        current_version=0,
        dbb_state=latest_dbb_state(lake, iteration),
    )
    with lake.run("test", "advantages", config.model_dump(), iteration=iteration) as run:
        lake.commit(batch_outputs(iteration, results, batch_id_of(iteration, run)), run)
        return batch_id_of(iteration, run)


def test_tables_and_values(tmp_path):
    from storage.lake import Lake

    lake = Lake.open(str(tmp_path / "lake"))
    verified_iteration(lake)
    batch_id = run_stage(lake, 1)
    groups = lake.read("groups")
    assert groups.height == 5 and groups["kept"].all() and groups["solve_rate"].to_list() == [0.5] * 5
    scale = 0.5 / (math.sqrt(0.5) + 1e-4)  # a group of (1, 0): mean 0.5, sample std √0.5
    advantages = lake.read("advantages").sort("rollout_id")
    assert sorted(advantages["advantage"].round(6).to_list()) == sorted([round(scale, 6), round(-scale, 6)] * 5)
    batch = lake.read("batches")
    assert batch.height == 10 and batch["batch_id"].unique().to_list() == [batch_id] and batch["weight"].sum() == 10
    state = lake.read("dbb_state")
    assert state["dbb_alpha"].to_list() == pytest.approx([0.9 + 1] * 5) and state["iteration"].unique().to_list() == [1]


def test_every_batch_row_leads_back_to_model_problem_bank_and_runs(tmp_path):
    from storage.lake import Lake

    lake = Lake.open(str(tmp_path / "lake"))
    verified_iteration(lake)
    run_stage(lake, 1)
    lineage = (
        open_catalog(lake)
        .sql("""
        select b.rollout_id, r.model_version, p.problem_id, p.bank_version, rb.stage as batch_stage,
               rr.stage as rollout_stage, rp.stage as problem_stage
        from batches b join rollouts r using (rollout_id) join problems p using (problem_id)
        join runs rb on rb.run_id = b.run_id join runs rr on rr.run_id = r.run_id join runs rp on rp.run_id = p.run_id
    """)
        .pl()
    )
    assert lineage.height == 10 and lineage.null_count().sum_horizontal()[0] == 0
    assert set(lineage["batch_stage"]) == {"advantages"} and set(lineage["bank_version"]) == {1}


def test_filtered_groups_stay_out_of_the_batch_and_dbb_carries_across_iterations(tmp_path):
    from storage.lake import Lake

    lake = Lake.open(str(tmp_path / "lake"))
    verified_iteration(lake, 1)
    run_stage(
        lake, 1, AdvantageConfig(estimator="dbb"), DynamicSamplingConfig(band=(0.6, 1.0))
    )  # every group at 0.5 is outside
    assert set(lake.read("groups")["filter_reason"]) == {"outside_band"}
    assert lake.read("batches").is_empty()
    verified_iteration(lake, 2)
    run_stage(lake, 2, AdvantageConfig(estimator="dbb"))
    state = lake.read("dbb_state").filter(pl.col("iteration") == 2)
    assert state["dbb_alpha"].to_list() == pytest.approx([0.9 * 1.9 + 1] * 5)  # two iterations of 1 success


def test_missing_rewards_are_a_clear_error(tmp_path):
    from storage.lake import Lake

    lake = Lake.open(str(tmp_path / "lake"))
    seed_iteration(lake, 1)
    with pytest.raises(ValueError, match="have no reward; run `rlvr verify --iteration 1` first"):
        scored_rollouts(lake, 1, None)


def test_informative_groups_past_the_batch_size_are_surplus_in_draw_order(tmp_path):
    from storage.lake import Lake

    lake = Lake.open(str(tmp_path / "lake"))
    verified_iteration(lake)
    run_stage(lake, 1, sampling=DynamicSamplingConfig(groups_per_batch=3))
    groups = lake.read("groups").sort("group_id")
    assert groups["kept"].to_list() == [True, True, True, False, False]
    assert groups["filter_reason"].to_list() == [None, None, None, "surplus", "surplus"]
    assert set(lake.read("batches")["group_id"]) == set(groups["group_id"][:3])


def test_the_dbb_state_a_step_starts_from_is_the_latest_earlier_one_even_across_a_gap(tmp_path):
    """Most steps start from the step just before's state (one slice read); where steps wrote none (a skipped or
    failed advantage stage), the latest earlier state is found, never a later one."""
    from storage.lake import Lake
    from tasks.advantages.stage import latest_dbb_iteration

    lake = Lake.open(str(tmp_path / "lake"))
    for iteration, alpha in ((1, 2.0), (3, 5.0)):
        with lake.run("test", "advantages", {}, iteration=iteration) as run:
            lake.replace(
                "dbb_state",
                pl.DataFrame({"iteration": [iteration], "problem_id": ["p"], "dbb_alpha": [alpha], "dbb_beta": [1.0]}),
                {"iteration": iteration},
                run,
            )
    assert [latest_dbb_iteration(lake, step) for step in (1, 2, 3, 4, 6)] == [None, 1, 1, 3, 3]
    assert latest_dbb_state(lake, 3)["dbb_alpha"].to_list() == [2.0]
    assert latest_dbb_state(lake, 4)["dbb_alpha"].to_list() == [5.0]
