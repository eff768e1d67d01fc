"""The README's main command on the embedded default, and the benchmark's own code path."""

import json

from bench.dedup_scaling import run_benchmark


def test_run_without_iterations_curates_the_bank_and_prints_statistics(cli, tmp_path):
    lake = str(tmp_path / "lake")
    result = cli("run", "--config", "configs/mixed.yaml", "--lake", lake)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "skipping curation" not in result.stdout
    assert "bank version 1" in result.stdout and "by level" in result.stdout
    counts = cli(
        "sql", "select split, count(*) as n from problems group by 1 order by 1", "--format", "json", "--lake", lake
    )
    rows = {r["split"]: r["n"] for r in map(json.loads, counts.stdout.splitlines())}
    assert rows["eval"] == 500 and rows["train"] > 3000


def test_the_learning_config_is_the_demo_with_more_iterations():
    from flows.cli.common import run_config

    demo, learn = (run_config(f"configs/{name}.yaml") for name in ("demo", "demo-learn"))
    assert demo.warmup.enabled and demo.loop.iterations == 10 and learn.loop.iterations == 50
    assert learn.model_copy(update={"loop": demo.loop}) == demo


def test_benchmark_reports_each_size():
    results = run_benchmark([300, 600], repeats=1)
    assert [r["size"] for r in results] == [300, 600]
    assert all(r["seconds"] > 0 for r in results)


def test_a_second_run_skips_the_curation_it_already_did(cli, tmp_path):
    lake = str(tmp_path / "lake")
    assert cli("run", "--config", "configs/mixed.yaml", "--lake", lake).returncode == 0
    again = cli("run", "--config", "configs/mixed.yaml", "--lake", lake)
    assert again.returncode == 0 and "skipping curation" in again.stdout
    versions = cli("sql", "select count(distinct bank_version) as n from problems", "--format", "csv", "--lake", lake)
    assert versions.stdout == "n\n1\n"


def test_reports_fit_an_80_column_terminal(cli, tmp_path):
    result = cli("curate", "--source", "gen:level1:10", "--lake", str(tmp_path / "lake"), env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    assert "│ gen:level1" in result.stdout


def test_verification_benchmarks_measure_both_sides():
    from bench.sandbox_rate import run_benchmark as sandbox_benchmark
    from bench.verify_throughput import build_items, symbolic_golds
    from bench.verify_throughput import run_benchmark as verify_benchmark

    items = build_items(20)
    assert len(items) == 40 and {label for _, _, label in items} == {True, False}
    measured = verify_benchmark(limit=20, workers=1, repeats=1)
    assert (
        measured["numeric"]["items"] == 40
        and measured["numeric"]["accuracy"] >= 0.9
        and measured["numeric"]["rate"] > 0
    )
    golds = len(symbolic_golds(20))  # 20 of MATH-500's in ../shared, else the 9 built in (a fresh clone)
    assert measured["symbolic"]["items"] == 16 * golds and measured["symbolic"]["accuracy"] >= 0.9
    rates = sandbox_benchmark(workers=1)
    assert rates["passed"] == rates["baseline_passed"] == rates["runs"]


def test_advantage_benchmark_sides_agree():
    from bench.advantages_scale import ours, per_group_python, run_benchmark, synthetic_rollouts

    frame = synthetic_rollouts(500, 8)
    assert ours(frame) == per_group_python(frame)  # the same rollouts survive the filter
    results = run_benchmark(groups=200, group_size=4)
    assert results["ours"]["rows"] == results["per_group_python"]["rows"]
