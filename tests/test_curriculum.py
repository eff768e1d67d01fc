"""The curriculum's rebalancing rule, by hand."""

import pytest

from tasks.curriculum.rebalance import rebalance


def weights_of(changes):
    return {c.level: round(c.new_weight, 6) for c in changes}


def test_saturated_levels_lose_share_and_zone_levels_gain_it():
    changes = rebalance({1: 0.20, 2: 0.45, 3: 0.30, 4: 0.05}, {1: 0.95, 2: 0.35, 3: 0.60, 4: 0.02})
    # scaled: 0.10, 0.675, 0.30, 0.025 → total 1.1
    assert weights_of(changes) == pytest.approx({1: 0.10 / 1.1, 2: 0.675 / 1.1, 3: 0.30 / 1.1, 4: 0.025 / 1.1},
                                                abs=1e-6)
    assert [c.reason for c in changes] == ["too_easy", "in_zone", "between", "too_hard"]
    assert sum(c.new_weight for c in changes) == pytest.approx(1.0)


def test_floor_keeps_every_level_and_unmeasured_levels_keep_their_weight():
    changes = rebalance({1: 0.5, 2: 0.5, 3: 0.001}, {1: 0.3, 3: 0.99}, floor=0.05)
    assert all(c.new_weight >= 0.04 for c in changes)            # floored before the final renormalisation
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

    from flows.loop import rl_loop
    from storage.lake import Lake
    from test_loop import RUN, curated_with_eval

    lake_uri = str(tmp_path / "lake")
    curated_with_eval(lake_uri)
    rl_loop({**RUN, "curriculum": {"enabled": True, "every": 1}, "loop": {"iterations": 2, "evaluate_every": 0}},
            lake_uri=lake_uri)
    lake = Lake.open(lake_uri)
    history = lake.read("curriculum").sort("iteration", "level")
    assert history["iteration"].unique().sort().to_list() == [1, 2]
    first = history.filter(pl.col("iteration") == 1)
    assert first["new_weight"].sum() == pytest.approx(1.0)
    assert first["old_weight"].to_list() == pytest.approx([0.20, 0.45, 0.30, 0.05])   # the configured start
    runs = lake.read("runs").filter((pl.col("stage") == "rollout") & (pl.col("iteration") == 2))
    drawn_with = json.loads(runs["parameters"][0])["rollout"]["mix"]["level_weights"]
    assert {int(k): v for k, v in drawn_with.items()} == pytest.approx(
        dict(first.select("level", "new_weight").rows()))
    second = history.filter(pl.col("iteration") == 2)
    assert second["old_weight"].to_list() == pytest.approx(first["new_weight"].to_list())
