"""The curriculum: the level-mix rebalancing rule by hand, reasoning-gym difficulty steps, and both in the loop."""

import pytest

from tasks.curriculum.rebalance import rebalance


def weights_of(changes):
    return {c.level: round(c.new_weight, 6) for c in changes}


def test_saturated_levels_lose_share_and_zone_levels_gain_it():
    changes = rebalance({1: 0.20, 2: 0.45, 3: 0.30, 4: 0.05}, {1: 0.95, 2: 0.35, 3: 0.60, 4: 0.02})
    # scaled: 0.10, 0.675, 0.30, 0.025 → total 1.1
    assert weights_of(changes) == pytest.approx(
        {1: 0.10 / 1.1, 2: 0.675 / 1.1, 3: 0.30 / 1.1, 4: 0.025 / 1.1}, abs=1e-6
    )
    assert [c.reason for c in changes] == ["too_easy", "in_zone", "between", "too_hard"]
    assert sum(c.new_weight for c in changes) == pytest.approx(1.0)


def test_floor_keeps_every_level_and_unmeasured_levels_keep_their_weight():
    changes = rebalance({1: 0.5, 2: 0.5, 3: 0.001}, {1: 0.3, 3: 0.99}, floor=0.05)
    assert all(c.new_weight >= 0.04 for c in changes)  # floored before the final renormalisation
    assert {c.level: c.reason for c in changes} == {1: "in_zone", 2: "unmeasured", 3: "too_easy"}
    assert changes[0].new_weight > changes[1].new_weight


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="step must be in"):
        rebalance({1: 1.0}, {1: 0.3}, step=1.5)
    with pytest.raises(ValueError, match="positive sum"):
        rebalance({1: 0.0}, {1: 0.3})


def test_the_loop_rebalances_and_the_next_iteration_draws_by_the_new_mix(prefect_api, tmp_path):
    import json

    import polars as pl
    from helpers import RUN, curated_with_eval

    from flows.curation import curate_bank
    from flows.loop import rl_loop
    from storage.lake import Lake

    lake_uri = str(tmp_path / "lake")
    curated_with_eval(lake_uri)
    curate_bank({"sources": [{**ARITHMETIC, "level": 2}]}, lake_uri)
    rl_loop(
        {
            **RUN,
            "curriculum": {"enabled": True, "every": 1, "gym_min_groups": 1},
            "loop": {"iterations": 2, "evaluate_every": 0},
        },
        lake_uri=lake_uri,
    )
    lake = Lake.open(lake_uri)
    gym = lake.read("gym_curriculum").sort("iteration")  # the gym source is decided on each time too
    assert gym.select("iteration", "source").rows() == [(1, "gym:basic_arithmetic"), (2, "gym:basic_arithmetic")]
    assert gym["old_step"][0] == 0 and gym["old_step"][1] == gym["new_step"][0]
    history = lake.read("curriculum").sort("iteration", "level")
    assert history["iteration"].unique().sort().to_list() == [1, 2]
    first = history.filter(pl.col("iteration") == 1)
    assert first["new_weight"].sum() == pytest.approx(1.0)
    assert first["old_weight"].to_list() == pytest.approx([0.20, 0.45, 0.30, 0.05])  # the configured start
    runs = lake.read("runs").filter((pl.col("stage") == "rollout") & (pl.col("iteration") == 2))
    drawn_with = json.loads(runs["parameters"][0])["rollout"]["mix"]["level_weights"]
    assert {int(k): v for k, v in drawn_with.items()} == pytest.approx(dict(first.select("level", "new_weight").rows()))
    second = history.filter(pl.col("iteration") == 2)
    assert second["old_weight"].to_list() == pytest.approx(first["new_weight"].to_list())


# ---- reasoning-gym difficulty ---------------------------------------------------------------


def test_gym_difficulty_moves_one_step_clamps_at_both_ends_and_stays_in_between():
    from tasks.curriculum.gym_difficulty import move_step

    assert move_step(2, 4, 0.95) == (3, "too_easy")
    assert move_step(4, 4, 0.95) == (4, "too_easy_at_max")
    assert move_step(2, 4, 0.05) == (1, "too_hard")
    assert move_step(0, 4, 0.00) == (0, "too_hard_at_min")
    assert move_step(2, 4, 0.30) == (2, "in_zone")
    assert move_step(2, 4, 0.90) == (2, "between")  # the thresholds are strict, as for the level mix
    assert move_step(2, 4, 0.10) == (2, "between")
    assert move_step(2, 4, None) == (2, "unmeasured")


def test_basic_arithmetic_steps_come_from_reasoning_gyms_curriculum():
    from tasks.curriculum.gym_difficulty import max_step, start_step, step_params

    others = {
        "operators": ["+", "-", "*", "/"],
        "allow_parentheses": True,
        "allow_negation": True,
        "format_style": "simple",
        "whitespace": "single",
    }
    assert step_params("basic_arithmetic", 0) == {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 1,
        **others,
    }
    assert step_params("basic_arithmetic", 1) == {
        "min_terms": 2,
        "max_terms": 3,
        "min_digits": 1,
        "max_digits": 2,
        **others,
    }
    assert step_params("basic_arithmetic", 1, {"operators": ["+"], "max_terms": 6})["operators"] == ["+"]
    assert step_params("basic_arithmetic", 1, {"max_terms": 6})["max_terms"] == 3  # the curriculum's fields win
    assert max_step("basic_arithmetic") == 4
    with pytest.raises(ValueError, match="outside 0..4"):
        step_params("basic_arithmetic", 5)
    assert start_step("basic_arithmetic", {}) == 4  # the defaults are its hardest step
    assert start_step("chain_sum", {"min_terms": 2, "max_terms": 4}) == 2  # step 3 asks for 5 terms
    assert start_step("chain_sum", {"max_terms": 2, "max_digits": 9}) == 0


def test_a_step_reasoning_gym_refuses_is_not_taken():
    from tasks.curriculum.gym_difficulty import next_difficulty, step_params

    start = step_params("modulo_grid", 0)
    assert next_difficulty("modulo_grid", 0, start, 0.95) == (0, "step_rejected", start)  # its step 1 has max_target 0
    assert next_difficulty("modulo_grid", 2, step_params("modulo_grid", 2), 0.95)[:2] == (3, "too_easy")


ARITHMETIC = {
    "kind": "gym",
    "dataset": "basic_arithmetic",
    "count": 12,
    "seed": 3,
    "level": 1,
    "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
}


def write_groups(lake, iteration, problem_ids, solve_rate):
    import polars as pl

    rows = pl.DataFrame(
        {
            "iteration": iteration,
            "group_id": [f"i{iteration}-g{k}" for k in range(len(problem_ids))],
            "problem_id": problem_ids,
            "n_samples": 8,
            "solve_rate": solve_rate,
            "kept": False,
            "filter_reason": "all_correct" if solve_rate == 1.0 else None,
        }
    )
    with lake.run("test", "groups", {}, iteration=iteration) as run:
        lake.replace("groups", rows, {"iteration": iteration}, run)


def test_a_solved_gym_source_moves_a_step_harder_with_new_problems_that_verify(prefect_api, tmp_path):
    import json

    import polars as pl
    import pyarrow.compute as pc

    from flows.curation import curate_bank
    from storage.lake import Lake
    from tasks.curation.stage import bank_problems
    from tasks.curriculum.gym_difficulty import step_params
    from tasks.curriculum.stage import CurriculumConfig, at_current_difficulty, gym_sources, moved_gym_difficulty
    from tasks.verification.registry import build_verifier

    lake_uri = str(tmp_path / "lake")
    curate_bank({"sources": [ARITHMETIC, {"kind": "generator", "generator": "level1", "count": 10}]}, lake_uri)
    lake = Lake.open(lake_uri)
    first = bank_problems(lake)
    gym_ids = first.filter(pl.col("source") == "gym:basic_arithmetic")["problem_id"].to_list()
    other_ids = first.filter(pl.col("source") != "gym:basic_arithmetic")["problem_id"].to_list()
    write_groups(lake, 1, gym_ids + other_ids, [1.0] * len(gym_ids) + [0.0] * len(other_ids))
    config = CurriculumConfig(enabled=True, every=1, gym_count=10)

    def stage(iteration):
        with lake.run("test", "gym-curriculum", {}, iteration=iteration) as run:
            rows = moved_gym_difficulty(lake, iteration, config, lambda curation: curate_bank(curation, lake_uri))
            lake.replace("gym_curriculum", rows, {"iteration": iteration}, run)
        return lake.read("gym_curriculum", filter=pc.field("iteration") == iteration).row(0, named=True)

    move = stage(1)
    assert (move["source"], move["old_step"], move["new_step"], move["reason"]) == (
        "gym:basic_arithmetic",
        0,
        1,
        "too_easy",
    )
    assert move["solve_rate"] == 1.0 and move["groups"] == len(gym_ids) and move["bank_version"] == 2
    harder = step_params("basic_arithmetic", 1, ARITHMETIC["params"])
    assert json.loads(move["new_params"]) == harder and harder["max_terms"] == 3
    added = lake.read("problems", filter=pc.field("bank_version") == 2)
    assert added.height == move["problems"] > 0 and added["level"].unique().to_list() == [1]
    assert all(json.loads(p)["config"] == harder for p in added["params"])
    assert added["seed"].unique().to_list() == [move["seed"]]
    gym = build_verifier("gym")
    for problem in added.head(3).iter_rows(named=True):
        assert gym.verify(problem, f"<answer>{problem['answer']}</answer>").correct
        assert not gym.verify(problem, f"<answer>{problem['answer']}1</answer>").correct
    drawable = at_current_difficulty(lake, bank_problems(lake))  # the source's step-0 problems leave the draw
    assert set(drawable["problem_id"]) == set(other_ids) | set(added["problem_id"])

    write_groups(lake, 2, gym_ids, [0.0] * len(gym_ids))  # step-0 groups say nothing about step 1
    stay = stage(2)
    assert (stay["old_step"], stay["new_step"], stay["reason"], stay["groups"]) == (1, 1, "unmeasured", 0)
    assert stay["bank_version"] is None and lake.read("problems")["bank_version"].max() == 2
    assert [s.step for s in gym_sources(lake, 1)] == [0]  # a re-run of iteration 1 decides from step 0 again
    assert [s.step for s in gym_sources(lake, 3)] == [1]
