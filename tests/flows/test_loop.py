"""The RL loop: iterations of rollout → verify → advantages → train → evaluate, metrics in the lake,
and resuming after a crash without repeating or losing an iteration (kill -9 at named points:
test_faults.py)."""

import json

import polars as pl
import pyarrow.compute as pc
import pytest
from helpers import BANK, CONFIG, RUN, curated_with_eval


@pytest.fixture
def flows(prefect_api):
    from flows.iteration import rl_iteration, train_policy
    from flows.loop import rl_loop

    return rl_loop, rl_iteration, train_policy


def test_loop_records_every_iteration_and_resumes_after_crashes(flows, tmp_path):
    from storage.lake import Lake

    rl_loop, rl_iteration, train_policy = flows
    lake_uri = str(tmp_path / "lake")
    curated_with_eval(lake_uri)
    rows = rl_loop(RUN, lake_uri=lake_uri)
    lake = Lake.open(lake_uri)
    assert [r["iteration"] for r in rows] == [1, 2] and [r["trained_version"] for r in rows] == [1, 2]
    assert [r["model_version"] for r in rows] == [0, 1]  # each iteration sampled by the previous step's model
    metrics = lake.read("iteration_metrics").sort("iteration")
    assert metrics["eval_solve_rate"].null_count() == 0 and metrics["loss"].null_count() == 0
    for iteration, certainty in zip(metrics["iteration"], metrics["mean_self_certainty"]):  # INTUITOR's, recorded
        stored = lake.read("rollouts", filter=pc.field("iteration") == iteration)["self_certainty"].mean()
        assert certainty == pytest.approx(stored) and certainty > 0
    evaluations = lake.read("evaluations")
    assert sorted(set(evaluations["model_version"])) == [1, 2]
    assert evaluations.group_by("model_version").agg(pl.col("problems").sum())["problems"].to_list() == [12, 12]
    assert set(evaluations["source"]) == {"gen-eval"}  # held-out problems only, scored by real verifiers

    # a crash after iteration 3 trained (no metrics row yet): the loop records it without training again
    rl_iteration(CONFIG, iteration=3, lake_uri=lake_uri)
    train_policy(3, RUN["train"], lake_uri)
    # a crash after iteration 4's rollouts, before training: the loop redoes iteration 4
    rl_iteration(CONFIG, iteration=4, lake_uri=lake_uri)
    resumed = rl_loop(RUN, iterations=4, lake_uri=lake_uri)
    assert [(r["iteration"], r["trained_version"]) for r in resumed] == [(3, 3), (4, 4)]
    assert lake.read("model_versions")["model_version"].sort().to_list() == [0, 1, 2, 3, 4]
    assert lake.read("iteration_metrics")["iteration"].sort().to_list() == [1, 2, 3, 4]
    rollouts = lake.read("rollouts")
    assert rollouts["rollout_id"].is_unique().all() and set(
        rollouts.filter(pl.col("iteration") == 4)["model_version"]
    ) == {3}


def test_rlvr_run_curates_then_loops_and_prints_the_metrics(cli, tmp_path):
    import yaml

    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"bank": BANK, **RUN}))
    lake_uri = str(tmp_path / "lake")
    result = cli("run", "--config", str(config), "--iterations", "1", "--lake", lake_uri)
    assert result.returncode == 0, result.stderr
    assert "RL loop (SQL: select * from iteration_metrics)" in result.stdout and "kept 80 of 80 rows" in result.stdout
    done = cli("run", "--config", str(config), "--iterations", "1", "--lake", lake_uri)
    assert done.returncode == 0 and "nothing to do: the lake already holds 1 iteration" in done.stdout
    again = cli("run", "--config", str(config), "--iterations", "2", "--format", "json", "--lake", lake_uri)
    assert again.returncode == 0 and "skipping curation" in again.stderr  # notes to stderr, rows to stdout
    printed = [json.loads(line) for line in again.stdout.splitlines()]
    assert {row["table"] for row in printed} == {"loop"} and [row["iteration"] for row in printed][-1] == 2
    rows = cli(
        "sql",
        "select iteration, trained_version from iteration_metrics order by 1",
        "--format",
        "csv",
        "--lake",
        lake_uri,
    )
    assert rows.stdout.split() == ["iteration,trained_version", "1,1", "2,2"]


def test_the_warm_up_runs_once_and_the_loop_starts_from_it(flows, tmp_path, monkeypatch):
    import flows.loop as loop
    from storage.lake import Lake

    rl_loop, _, _ = flows
    lake_uri = str(tmp_path / "lake")
    curated_with_eval(lake_uri)
    warm = {
        **RUN,
        "warmup": {"enabled": True, "band": [0.0, 1.0], "evaluate_every": 10, "eval_problems": 10, "max_new_tokens": 8},
    }
    asked, published = [], []  # the loop asks for the latest version once, as it starts
    latest, publish = loop.current_model_version, loop.publish_version
    monkeypatch.setattr(loop, "current_model_version", lambda *a: asked.append(1) or latest(*a))
    monkeypatch.setattr(loop, "publish_version", lambda *a, **k: published.append(a[3]) or publish(*a, **k))
    rows = rl_loop(warm, iterations=1, lake_uri=lake_uri)
    assert len(asked) == 1 and published == [1, 1, 2]  # the warm-up (iteration 0), what samples iteration 1, its step
    lake = Lake.open(lake_uri)
    versions = lake.read("model_versions").sort("model_version")
    assert versions.select("model_version", "kind", "parent_version").rows() == [
        (0, "base", None),
        (1, "warmup", 0),
        (2, "rl", 1),
    ]
    assert rows[0]["model_version"] == 1  # the first iteration samples from the warm-up version
    start = lake.read("iteration_metrics").filter(pl.col("iteration") == 0)
    assert start["trained_version"].to_list() == [1] and start["eval_solve_rate"].null_count() == 0
    from flows.cli.runs import loop_table, warmup_row

    table = loop_table(rows, warmup_row(lake))  # what `rlvr run` prints: the warm-up first
    assert table["iteration"].to_list() == [0, 1] and table["version"].to_list() == [1, 1]
    assert table["eval"][0] == round(start["eval_solve_rate"][0], 3)
    rl_loop(warm, iterations=2, lake_uri=lake_uri)  # a second run: no second warm-up
    kinds = lake.read("model_versions")["kind"].to_list()
    assert kinds.count("warmup") == 1 and kinds.count("rl") == 2
    from bench.learning import learning_report

    report = learning_report(lake)  # the learning benchmark reads only stored metrics
    assert report["warmup_solve_rate"] == start["eval_solve_rate"][0] and report["iterations"] == 2
    assert [row[0] for row in report["curve"]] == [0, 1, 2] and report["eval_problems"] == 12
    assert report["gain_points"] == pytest.approx(100 * (report["final_solve_rate"] - report["warmup_solve_rate"]))
    assert report["stage_seconds"]["warmup"] > 0 and report["stage_seconds"]["train"] > 0
    runs = lake.read("runs").filter(pl.col("iteration") > 0)
    span = (runs["ended_at"].max() - runs["started_at"].min()).total_seconds()
    assert report["rl_seconds"] == pytest.approx(span)
    assert 0 <= report["outside_share"] < 1  # the stages' own time, within the iterations' span


def test_each_iteration_publishes_prefect_artifacts(flows, tmp_path, prefect_api):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from storage.lake import Lake

    rl_loop, _, _ = flows
    lake_uri = str(tmp_path / "lake")
    curated_with_eval(lake_uri)
    rl_loop({**RUN, "loop": {"iterations": 2, "evaluate_every": 2}}, lake_uri=lake_uri)
    keys = [
        "rl-iteration-solve-rates",
        "rl-iteration-summary",
        "rl-loop-progress",
        "rl-iteration-filters",
        "rl-iteration-staleness",
    ]
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=keys)))
    loop_run = Lake.open(lake_uri).read("runs", filter=pc.field("stage") == "record")["prefect_flow_run_id"][-1]
    by_key = {}
    for artifact in artifacts:  # made on a thread beside the loop, each in the loop's flow run
        if str(artifact.flow_run_id) == loop_run:
            by_key.setdefault(artifact.key, []).append(artifact)
    assert set(by_key) == set(keys)
    assert len(by_key["rl-iteration-summary"]) == 2 and len(by_key["rl-iteration-solve-rates"]) >= 2
    summaries = [a.data for a in by_key["rl-iteration-summary"]]
    assert any("# Iteration 2" in text and "held-out sampled solve rate:" in text for text in summaries)
    assert max(float(a.data) for a in by_key["rl-loop-progress"]) == 100.0
    filters = json.loads(by_key["rl-iteration-filters"][-1].data)
    assert sum(row["groups"] for row in filters) > 0 and abs(sum(row["share"] for row in filters) - 1) < 0.01
    staleness = json.loads(by_key["rl-iteration-staleness"][-1].data)
    assert {row["freshness"] for row in staleness} == {"fresh"} and all(row["rollouts"] > 0 for row in staleness)
