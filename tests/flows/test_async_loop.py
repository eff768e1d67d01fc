"""The overlapped loop (`loop.mode: async`): the next iteration is sampled while one trains, never more
than `loop.max_staleness` versions behind the version that trains on it, with the off-policy batch
importance-weighted, every stage's run row and lineage kept, and a second run resuming."""

import polars as pl
import pytest
from helpers import RUN, curated_with_eval

ASYNC = {**RUN, "loop": {"iterations": 4, "mode": "async", "max_staleness": 1}}


def test_sampling_overlaps_training_within_the_staleness_bound(prefect_api, tmp_path):
    from flows.loop import rl_loop
    from storage.catalog import open_catalog
    from storage.lake import Lake

    lake_uri = str(tmp_path / "lake")
    curated_with_eval(lake_uri)
    first = rl_loop(ASYNC, iterations=2, lake_uri=lake_uri)
    rows = first + rl_loop(ASYNC, lake_uri=lake_uri)  # a second run resumes at iteration 3
    lake = Lake.open(lake_uri)
    assert [(r["iteration"], r["trained_version"]) for r in rows] == [(1, 1), (2, 2), (3, 3), (4, 4)]
    sampled = [r["model_version"] for r in rows]
    lag = [trained - 1 - version for trained, version in zip([r["trained_version"] for r in rows], sampled)]
    assert sampled[:2] == [0, 0] and lag[1] == 1  # iteration 2 was drawn while 1 trained
    assert all(0 <= behind <= 1 for behind in lag)  # never past the bound

    advantages = lake.read("advantages").join(
        lake.read("rollouts").select("rollout_id", "model_version"), on="rollout_id"
    )
    second = advantages.filter(pl.col("iteration") == 2)
    assert set(second["staleness"]) == {1} and set(second["freshness"]) == {"acceptable"}
    assert second["importance_weight"].n_unique() > 1  # truncated π_current / π_behaviour, per rollout
    assert (advantages["staleness"] == [lag[i - 1] for i in advantages["iteration"]]).all()
    stats = open_catalog(lake).sql("select iteration, mean_staleness from staleness_stats").pl()
    assert stats.filter(pl.col("iteration") == 2)["mean_staleness"].to_list() == [1.0]
    assert rows[1]["mean_staleness"] == 1.0

    runs = lake.read("runs").filter(pl.col("iteration") > 0)
    assert set(runs["status"]) == {"completed"}
    trained_first = runs.filter((pl.col("iteration") == 1) & (pl.col("stage") == "train"))["ended_at"][0]
    drawn_second = runs.filter((pl.col("iteration") == 2) & (pl.col("stage") == "rollout"))["started_at"][0]
    assert drawn_second < trained_first  # the two overlapped in time
    lineage = lake.read("model_versions").filter(pl.col("kind") == "rl").sort("model_version")
    assert lineage["parent_version"].to_list() == [0, 1, 2, 3]  # one main line, no branch


def test_a_bound_the_advantages_would_drop_is_refused():
    from flows.run_config import RunConfig

    with pytest.raises(ValueError, match="loop.max_staleness 4 exceeds advantages.max_stale_versions 3"):
        RunConfig.model_validate({"loop": {"mode": "async", "max_staleness": 4}})
    assert RunConfig.model_validate({"loop": {"max_staleness": 4}}).loop.mode == "sync"  # sync never lags


@pytest.mark.slow
def test_an_overlapped_run_killed_mid_iteration_resumes_without_losing_or_repeating_one(prefect_api, tmp_path):
    """kill -9 while iteration 2's version is registered by a run that never completed (iteration 3 may be
    sampling beside it), then, resumed at iteration 2, while iteration 3's rollouts are committed; then
    finish: the lake checks of `rlvr bench faults` hold and every iteration trained once, on the main line."""
    import signal

    import yaml

    from bench.faults import CONFIG, Bench, lake_checks
    from storage.lake import Lake

    bench = Bench(tmp_path / "work", prefect_api=prefect_api)
    config = yaml.safe_load(CONFIG.read_text())
    config["loop"] = {**config["loop"], "iterations": 3, "mode": "async", "max_staleness": 1}
    path = tmp_path / "async.yaml"
    path.write_text(yaml.safe_dump(config))
    lake_uri = bench.lake("local", "async-killed")
    for point in ("committed:train:model_versions@2", "committed:rollout:rollouts@2"):
        killed = bench.rlvr("run", "--config", str(path), "--lake", lake_uri, fault=point)
        assert killed.returncode == -signal.SIGKILL, (point, killed.stderr[-2000:])
        assert not bench.leftovers(), point
    finished = bench.rlvr("run", "--config", str(path), "--lake", lake_uri)
    assert finished.returncode == 0, finished.stderr[-2000:]
    checks = lake_checks(bench, lake_uri, 3)
    assert all(checks.values()), checks
    lake = Lake.open(lake_uri)
    metrics = lake.read("iteration_metrics").sort("iteration")
    assert metrics["iteration"].to_list() == [0, 1, 2, 3] and metrics["trained_version"].to_list() == [1, 2, 3, 4]
    rl = lake.read("model_versions").filter(pl.col("kind") == "rl").sort("model_version")
    assert rl["parent_version"].to_list() == [1, 2, 3]
    assert lake.read("runs").filter(pl.col("status") == "abandoned").height >= 2
