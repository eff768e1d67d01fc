"""The lake under kills and concurrent writers, through the real command line (bench/faults.py's cases,
smaller): two `rlvr run` at once, a run killed with SIGKILL at three points in turn and then finished,
three curations of overlapping sources at once on S3. Afterwards `rlvr doctor` is clean, each iteration
has one trained version, no problem repeats, nothing is left running, and the metrics equal an unkilled
run's. The full matrix (13 points of `rlvr run`, 4 of `rlvr curate`, local and S3): `rlvr bench faults`."""

import signal

import polars as pl
import pytest

from bench.faults import CONFIG, Bench, _problem_ids, lake_checks, metrics

SOURCES = ["--source", "gen:level3:600", "--source", "gen:level2:300"]
OVERLAPPING = ["--source", "gen:level3:900", "--source", "gen:level2:100"]


@pytest.fixture(scope="module")
def bench(prefect_api, tmp_path_factory):
    return Bench(tmp_path_factory.mktemp("faults"), prefect_api=prefect_api)


@pytest.fixture(scope="module")
def unkilled(bench):
    """Two `rlvr run` of one config at once: the first runs, a third without --wait is refused at once naming
    it, the second (--wait) queues and then finds nothing left to do. Returns the lake's metrics."""
    lake_uri = bench.lake("local", "two-runs")
    first = bench.start("run", "--config", str(CONFIG), "--lake", lake_uri, hold_at="lease-taken:loop")
    assert bench.held(first), first.stderr.read()[-2000:] if first.poll() is not None else "never held"
    refused = bench.rlvr("run", "--config", str(CONFIG), "--lake", lake_uri)  # while the first holds the lease
    assert refused.returncode == 1 and "lease is held by" in refused.stderr, refused.stderr
    assert f"pid {first.pid}" in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
    second = bench.start("run", "--config", str(CONFIG), "--lake", lake_uri, "--wait")
    queued = ""
    while "waiting" not in queued and (line := second.stderr.readline()):  # the second queues behind the first
        queued += line
    assert "waiting: the lake's loop lease is held by" in queued, queued
    bench.release(first)
    assert first.wait(600) == 0, first.stderr.read()[-2000:]
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0 and "nothing to do" in out, err
    assert all(lake_checks(bench, lake_uri, 2).values())
    return metrics(lake_uri)


def test_two_runs_at_once_train_each_iteration_once(unkilled):
    assert unkilled["iteration"].to_list() == [0, 1, 2]
    assert unkilled["trained_version"].to_list() == [1, 2, 3]  # the warm-up, then one version per iteration


@pytest.mark.slow
def test_a_run_killed_again_and_again_ends_as_if_never_killed(bench, unkilled):
    lake_uri = bench.lake("local", "killed")
    for point in (
        "checkpoint-saved:warmup",  # a claimed checkpoint folder, no registry row
        "committed:train:model_versions",  # a registered version whose run never completed
        "committed:rollout:rollouts@2",
    ):  # an iteration's rollouts of an unfinished run
        killed = bench.rlvr("run", "--config", str(CONFIG), "--lake", lake_uri, fault=point)
        assert killed.returncode == -signal.SIGKILL, (point, killed.stderr[-2000:])
        assert not bench.leftovers(), point
    finished = bench.rlvr("run", "--config", str(CONFIG), "--lake", lake_uri)
    assert finished.returncode == 0, finished.stderr[-2000:]
    checks = lake_checks(bench, lake_uri, 2)
    assert all(checks.values()), checks
    assert metrics(lake_uri).equals(unkilled)
    from storage.lake import Lake

    runs = Lake.open(lake_uri).read("runs")
    assert runs.filter(pl.col("status") == "abandoned").height >= 3  # each kill's run, found and marked
    folders = sorted(
        p.rsplit("/", 1)[1]
        for p in Lake.open(lake_uri).location.filesystem.ls(Lake.open(lake_uri).location.path("models"))
    )
    assert folders == ["v00000", "v00001", "v00002", "v00003"]  # orphan folders reclaimed, none left


def test_concurrent_curations_of_overlapping_sources_on_s3(bench, s3_env, tmp_path):
    import os

    from flows.curation import curate_bank
    from storage.lake import Lake
    from tasks.curation.inputs import curation_config_from

    lake_uri = bench.lake("s3", "curations")
    bench.env.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")})
    processes = [bench.start("curate", *(SOURCES if i % 2 else OVERLAPPING), "--lake", lake_uri) for i in range(3)]
    for process in processes:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-2000:]
    versions = Lake.open(lake_uri).read("runs").filter(pl.col("stage") == "curate")["bank_version"].sort().to_list()
    assert versions == [1, 2, 3]  # each its own bank version
    reference = str(tmp_path / "reference")  # the same sources, one after another
    for sources in (SOURCES, OVERLAPPING):
        curate_bank(curation_config_from(None, sources[1::2], [], None).model_dump(mode="json"), reference)
    assert _problem_ids(lake_uri) == _problem_ids(reference)  # each problem exactly once
    assert all(lake_checks(bench, lake_uri, None).values())
