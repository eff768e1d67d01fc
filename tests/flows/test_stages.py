"""Re-running one stage of an iteration: skip when unchanged, replace exactly its output, downstream
chains all or nothing, re-scoring with another verifier; retries and the GPU concurrency tag."""

import json

import polars as pl
import pyarrow.compute as pc
import pytest
from conftest import run_cli
from helpers import rewards_of


@pytest.fixture(scope="module")
def looped(tmp_path_factory, prefect_api):
    """A lake after a 2-iteration loop (rewards from the `random` reward control)."""
    from helpers import RUN, curated_with_eval

    from flows.loop import rl_loop

    lake_uri = str(tmp_path_factory.mktemp("stages") / "lake")
    curated_with_eval(lake_uri)
    rl_loop({**RUN, "loop": {"iterations": 2, "evaluate_every": 1}}, lake_uri=lake_uri)
    return lake_uri


def runs_of(lake, stage: str, iteration: int) -> pl.DataFrame:
    return lake.read("runs", filter=(pc.field("stage") == stage) & (pc.field("iteration") == iteration)).sort(
        "started_at"
    )


def test_a_downstream_rerun_of_an_untouched_loop_iteration_skips_every_stage(looped):
    from flows.stages import rerun_stage
    from storage.lake import Lake

    lake = Lake.open(looped)
    versions = lake.read("model_versions").height
    summaries = rerun_stage("verify", 2, downstream=True, lake_uri=looped)
    assert [(s["stage"], s.get("skipped")) for s in summaries] == [
        ("verify", True),
        ("advantages", True),
        ("train", True),
        ("evaluate", True),
    ]
    assert lake.read("model_versions").height == versions  # nothing trained


def test_an_unchanged_stage_is_skipped_and_forced_it_replaces_its_output(looped):
    from flows.stages import rerun_stage
    from storage.lake import Lake

    lake = Lake.open(looped)
    before = rewards_of(lake, 1)
    version_before = lake.table("rewards").version()
    [summary] = rerun_stage("verify", 1, lake_uri=looped)
    assert summary["skipped"] and summary["same_as"] == before["run_id"][0]
    assert lake.table("rewards").version() == version_before  # nothing written
    assert runs_of(lake, "verify", 1)["status"].to_list() == ["completed", "skipped"]

    [forced] = rerun_stage("verify", 1, force=True, lake_uri=looped)
    after = rewards_of(lake, 1)
    assert not forced.get("skipped") and after.height == before.height
    assert set(after["run_id"]) == {forced["run_id"]} != set(before["run_id"])
    assert after["reward"].to_list() == before["reward"].to_list()  # the random control is seeded per rollout
    runs = runs_of(lake, "verify", 1)
    assert runs["status"].to_list() == ["completed", "skipped", "completed"]  # old and new run both shown
    assert rewards_of(lake, 2)["run_id"].n_unique() == 1  # iteration 2 untouched


def test_a_code_change_or_a_new_upstream_run_is_not_skipped(looped, monkeypatch):
    from flows.stages import rerun_stage
    from storage import fingerprints

    monkeypatch.setattr(fingerprints, "source_digest", lambda: "edited")
    [summary] = rerun_stage("advantages", 2, lake_uri=looped)
    assert not summary.get("skipped")
    monkeypatch.undo()
    [summary] = rerun_stage("advantages", 2, lake_uri=looped)  # the edit is gone again: nothing in place
    assert not summary.get("skipped")
    [again] = rerun_stage("advantages", 2, lake_uri=looped)
    assert again["skipped"] and again["same_as"] == summary["run_id"]


def test_rescoring_with_the_true_verifier_recomputes_the_groups_downstream(looped):
    from flows.stages import rescore
    from storage.lake import Lake

    lake = Lake.open(looped)
    random_rewards = rewards_of(lake, 2).filter(pl.col("verifier") == "random")
    summaries = rescore([2], {"verify": {"verifier": None}}, lake_uri=looped)
    assert [s["stage"] for s in summaries] == ["verify", "advantages"] and not any(s.get("skipped") for s in summaries)
    rewards = rewards_of(lake, 2)
    assert set(rewards["verifier"]) == {"random", "math"}  # both verifiers' scores stay side by side
    assert rewards.filter(pl.col("verifier") == "random")["run_id"].to_list() == random_rewards["run_id"].to_list()
    math = rewards.filter(pl.col("verifier") == "math").select("rollout_id", "reward")
    groups = lake.read("groups", filter=pc.field("iteration") == 2)
    assert set(groups["run_id"]) == {summaries[1]["run_id"]}
    rollouts = lake.read("rollouts", filter=pc.field("iteration") == 2, columns=["rollout_id", "group_id"])
    expected = rollouts.join(math, on="rollout_id").group_by("group_id").agg(mean=pl.col("reward").mean())
    joined = groups.join(expected, on="group_id")
    assert joined.height == groups.height and (joined["mean_reward"] - joined["mean"]).abs().max() < 1e-9
    assert rescore([2], {"verify": {"verifier": None}}, lake_uri=looped)[0]["skipped"]  # the same again: skipped


def test_a_failed_downstream_stage_puts_the_chain_back(looped):
    """Verify and advantages replace their slices, then train fails: every slice is put back as it was."""
    from flows.stages import rerun_stage
    from storage.lake import Lake

    lake = Lake.open(looped)
    slices = ("rewards", "groups", "advantages", "batches", "dbb_state")
    before = {table: lake.read(table, filter=pc.field("iteration") == 1) for table in slices}
    with pytest.raises(ValueError, match="micro_batch_size"):
        rerun_stage(
            "verify",
            1,
            {"verify": {"verifier": "flipped"}, "train": {"micro_batch_size": 0}},
            downstream=True,
            force=True,
            lake_uri=looped,
        )
    for table in slices:
        after = lake.read(table, filter=pc.field("iteration") == 1)
        key = [c for c in ("rollout_id", "group_id", "batch_id", "verifier") if c in after.columns]
        assert after.sort(key).equals(before[table].sort(key)), table  # same rows and run ids as before
    restore = lake.read("runs", filter=(pc.field("stage") == "restore") & (pc.field("iteration") == 1))
    assert restore["status"].to_list() == ["completed"]
    assert set(json.loads(restore["parameters"][0])["tables"]) == set(slices)
    assert runs_of(lake, "verify", 1)["status"][-1] == "rolled_back"
    assert runs_of(lake, "advantages", 1)["status"][-1] == "rolled_back"
    [again] = rerun_stage("verify", 1, lake_uri=looped)  # the rolled-back config is no one's: skipped as before
    assert again["skipped"]


def test_retraining_an_old_iteration_branches_from_its_own_parent(looped):
    from flows.stages import rerun_stage
    from storage.lake import Lake
    from storage.registry import latest_version

    lake = Lake.open(looped)
    [skipped] = rerun_stage("train", 1, lake_uri=looped)
    assert skipped["skipped"]
    first = lake.read("model_versions", filter=pc.field("iteration") == 1).row(0, named=True)
    latest = latest_version(lake)
    train, evaluation = rerun_stage("train", 1, downstream=True, force=True, lake_uri=looped)
    branch = lake.read("model_versions", filter=pc.field("model_version") == train["model_version"]).row(0, named=True)
    assert branch["model_version"] == latest + 1 and branch["parent_version"] == first["parent_version"]
    assert branch["kind"] == "rl-branch" and latest_version(lake) == latest  # the main line goes on from `latest`
    from storage.catalog import open_catalog
    from tasks.report import data

    catalog = open_catalog(lake)  # the report's curve is the main line
    assert data.summary(catalog)["latest_model_version"] == latest
    assert branch["model_version"] not in data.gather(catalog)["eval_solve_rate_by_level"]["model_version"].to_list()
    assert branch["iteration"] == 1 and branch["batch_ids"] == first["batch_ids"]
    assert evaluation["model_version"] == branch["model_version"]
    assert lake.read("evaluations", filter=pc.field("model_version") == branch["model_version"]).height > 0


def test_rerunning_an_old_rollout_samples_with_its_own_version_and_stays_fresh(looped):
    from flows.stages import rerun_stage
    from storage.lake import Lake

    lake = Lake.open(looped)
    old = lake.read("rollouts", filter=pc.field("iteration") == 1)
    [summary] = rerun_stage("rollout", 1, force=True, lake_uri=looped)
    new = lake.read("rollouts", filter=pc.field("iteration") == 1)
    assert set(new["model_version"]) == set(old["model_version"]) and not set(new["run_id"]) & set(old["run_id"])
    advantages = lake.read("advantages", filter=pc.field("iteration") == 1)
    assert (advantages["staleness"] == 0).all() and summary["batch_rollouts"] > 0  # measured from its sampler
    assert set(rewards_of(lake, 1)["verifier"]) == {"random"}  # scored as it was sampled


def test_rlvr_stage_prints_what_ran_and_what_was_skipped(looped, tmp_path, prefect_api):
    config = tmp_path / "rescore.yaml"
    config.write_text("verify:\n  verifier: flipped\n")
    server = {"PREFECT_API_URL": prefect_api}
    first = run_cli(
        "stage",
        "verify",
        "--iteration",
        "1-2",
        "--config",
        str(config),
        "--downstream",
        "--through",
        "advantages",
        "--lake",
        looped,
        env=server,
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("ran") >= 4 and "skipped" not in first.stdout
    home = tmp_path / "prefect-home"  # no API URL: a command that ran a flow would start a server
    second = run_cli(
        "stage",
        "verify",
        "--iteration",
        "1,2",
        "--config",
        str(config),
        "--downstream",
        "--through",
        "advantages",
        "--lake",
        looped,
        env={"PREFECT_API_URL": "", "PREFECT_HOME": str(home)},
    )
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("skipped") == 4, second.stdout
    assert not (home / "rlvr-temporary-server.log").exists()  # every stage skipped: no orchestration at all

    bad = run_cli("stage", "score", "--iteration", "1", "--lake", looped)
    assert bad.returncode == 2 and "unknown stage 'score'" in bad.stderr and "Traceback" not in bad.stderr
    config.write_text("verify:\n  verifire: flipped\n")
    typo = run_cli("stage", "verify", "--iteration", "1", "--config", str(config), "--lake", looped)
    assert typo.returncode == 2 and "verify.verifire" in typo.stderr


def test_long_stage_work_publishes_progress_artifacts(looped, prefect_api, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows import artifacts as progress
    from flows.verification import verify_iteration
    from storage.lake import Lake

    monkeypatch.setattr(progress, "PROGRESS_AFTER_SECONDS", 0.0)  # this small iteration counts as long work

    result = verify_iteration(1, {"workers": 0, "verifier": "constant"}, looped)
    lake = Lake.open(looped)
    rollouts = lake.read("rollouts", filter=pc.field("iteration") == 1).height
    flow_run = lake.read("runs").filter(pl.col("run_id") == result["run_id"])["prefect_flow_run_id"][0]
    with get_client(sync_client=True) as client:  # this run's own artifact: other tests publish the same key
        artifacts = [
            artifact
            for artifact in client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["score-rollouts-verifying"]))
            )
            if str(artifact.flow_run_id) == flow_run
        ]
    assert artifacts and float(artifacts[-1].data) == 100.0
    assert f"verifying: {rollouts:,} of {rollouts:,}" in artifacts[-1].description


def test_verification_fans_out_over_a_dask_cluster_and_agrees_with_one_task(looped, prefect_api, monkeypatch):
    """Chunks of an iteration scored as separate task runs on a real local Dask cluster (worker processes,
    each with its own verifier process) give exactly the rewards of one task in this process."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterName

    from flows.verification import verify_iteration
    from storage.lake import Lake

    monkeypatch.setenv("PREFECT_API_URL", prefect_api)  # the Dask workers are processes of their own
    lake = Lake.open(looped)
    verify_iteration(2, {"workers": 0, "verifier": "random"}, looped)
    one_task = rewards_of(lake, 2).filter(pl.col("verifier") == "random").select("rollout_id", "reward", "correct")
    summary = verify_iteration(
        2, {"workers": 1, "verifier": "random", "chunk_size": 7, "task_runner": "dask", "dask_workers": 2}, looped
    )
    chunked = rewards_of(lake, 2).filter(pl.col("verifier") == "random")
    assert set(chunked["run_id"]) == {summary["run_id"]}
    assert chunked.select("rollout_id", "reward", "correct").equals(one_task)
    flow_run_id = lake.read("runs", filter=pc.field("run_id") == summary["run_id"])["prefect_flow_run_id"][0]
    with get_client(sync_client=True) as client:
        scored = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="score-rollouts")),
        )
    assert len(scored) == -(-one_task.height // 7) and all(run.state.is_completed() for run in scored)
    from flows.stage_plans import recorded_config

    assert "task_runner" not in recorded_config(lake, 2)["verify"]  # re-runs do not replay the cluster
