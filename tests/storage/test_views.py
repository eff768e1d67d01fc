"""The predefined analytics views of the SQL catalog, over a lake that ran the loop."""

import polars as pl
import pytest

from storage.views import VIEWS


@pytest.fixture(scope="module")
def looped_lake(tmp_path_factory, prefect_api):
    from helpers import RUN, curated_with_eval

    from flows.loop import rl_loop
    from flows.verification import verify_iteration
    from storage.lake import Lake

    lake_uri = str(tmp_path_factory.mktemp("views") / "lake")
    curated_with_eval(lake_uri)
    rl_loop({**RUN, "loop": {"iterations": 2, "evaluate_every": 1}}, lake_uri=lake_uri)
    verify_iteration(1, {"workers": 0, "verifier": "flipped"}, lake_uri)  # a second verifier on iteration 1
    return Lake.open(lake_uri)


def view(lake, name: str) -> pl.DataFrame:
    from storage.catalog import open_catalog

    return open_catalog(lake).sql(f"select * from {name}").pl()


def test_every_view_answers(looped_lake):
    for spec in VIEWS:
        if "proposals" in spec.needs or spec.name in (
            "self_verification",
            "code_solve_rate_by_code_level",
            "failing_tests",
            "tool_use",
        ):
            # tests/tasks/proposals/test_selfplay.py, test_self_verify.py, test_workspaces.py, test_episodes.py
            continue
        assert not view(looped_lake, spec.name).is_empty(), spec.name


def test_filter_and_zone_shares(looped_lake):
    stats = view(looped_lake, "filter_stats")
    assert stats.group_by("iteration").agg(pl.col("share").sum())["share"].to_list() == pytest.approx([1.0, 1.0])
    kept = stats.filter(pl.col("outcome") == "kept")["groups"].to_list()
    assert kept == [3, 3]  # groups_per_batch of the test config
    zone = view(looped_lake, "learning_zone_share")
    assert zone["iteration"].to_list() == [1, 2] and zone["zone_share"].is_between(0, 1).all()


def test_disagreements_between_two_verifiers_on_the_same_rollouts(looped_lake):
    rows = view(looped_lake, "verifier_disagreements")
    rollouts = looped_lake.read("rollouts").filter(pl.col("iteration") == 1).height
    assert rows.select("iteration", "verifier_a", "verifier_b").rows() == [(1, "flipped", "random")]
    assert rows["rollouts"][0] == rollouts and 0 <= rows["disagreement_rate"][0] <= 1


def test_reward_hacking_signals_compare_evaluated_iterations(looped_lake):
    signals = view(looped_lake, "reward_hacking_signals")
    assert signals["iteration"].to_list() == [1, 2]
    assert signals["eval_solve_rate"].null_count() == 0 and signals["reward_change"][0] is None
    second = signals.row(1, named=True)
    assert second["reward_up_eval_down"] == (second["reward_change"] > 0 and second["eval_change"] < 0)
    staleness = view(looped_lake, "staleness_stats")
    assert set(staleness["freshness"]) == {"fresh"} and (staleness["mean_importance_weight"] == 1.0).all()
