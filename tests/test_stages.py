"""Re-running one stage of an iteration: skip when unchanged, replace exactly its output, downstream
chains all or nothing, re-scoring with another verifier; retries and the GPU concurrency tag."""

import contextvars
import json
import threading
import time

import polars as pl
import pyarrow.compute as pc
import pytest
from conftest import run_cli


@pytest.fixture(scope="module")
def looped(tmp_path_factory, prefect_api):
    """A lake after a 2-iteration loop (rewards from the `random` reward control)."""
    from test_loop import RUN, curated_with_eval

    from flows.loop import rl_loop

    lake_uri = str(tmp_path_factory.mktemp("stages") / "lake")
    curated_with_eval(lake_uri)
    rl_loop({**RUN, "loop": {"iterations": 2, "evaluate_every": 1}}, lake_uri=lake_uri)
    return lake_uri


def runs_of(lake, stage: str, iteration: int) -> pl.DataFrame:
    return lake.read("runs", filter=(pc.field("stage") == stage) & (pc.field("iteration") == iteration)).sort(
        "started_at"
    )


def rewards_of(lake, iteration: int) -> pl.DataFrame:
    return lake.read("rewards", filter=pc.field("iteration") == iteration).sort("rollout_id", "verifier")


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


def test_stage_chains_and_iteration_lists():
    from flows.cli.stages import parse_iterations
    from flows.stage_plans import stage_chain

    assert stage_chain("verify", False) == ["verify"]
    assert stage_chain("verify", True) == ["verify", "advantages", "train", "evaluate"]
    assert stage_chain("verify", True, "advantages") == ["verify", "advantages"]
    assert stage_chain("rollout", True) == ["rollout", "train", "evaluate"]
    with pytest.raises(ValueError, match="comes before"):
        stage_chain("train", True, "verify")
    assert parse_iterations(["3", "5-7,1"]) == [1, 3, 5, 6, 7]
    with pytest.raises(ValueError, match="backwards"):
        parse_iterations(["7-5"])


def test_a_config_overrides_every_section_a_stage_reads(tmp_path):
    """`rlvr stage --config` takes the sections a re-run hands its stages from the typed configs: a `reward:` section
    (which verify and advantages read) was dropped by the literal list the command kept, and the stage re-ran with
    the recorded reward. Sections no stage reads (loop, bank) stay the run's."""
    from flows.cli.stages import stage_overrides

    config = tmp_path / "stage.yaml"
    config.write_text(
        "reward:\n  kind: self_certainty\nselfverify:\n  enabled: true\nverify:\n  verifier: math\n"
        "loop:\n  iterations: 9\n"
    )
    assert stage_overrides(config) == {
        "verify": {"verifier": "math"},
        "reward": {"kind": "self_certainty"},
        "selfverify": {"enabled": True},
    }
    config.write_text("reward:\n  kinds: self_certainty\n")
    with pytest.raises(ValueError, match=r"stage.yaml:2: reward.kinds: Extra inputs are not permitted"):
        stage_overrides(config)


def test_transient_failures_are_retried_and_others_are_not(prefect_api):
    from prefect import flow

    from flows.policies import stage_task
    from policy.openai_backend import BackendUnavailable, RequestRefused

    attempts: list[str] = []

    def flaky(error: Exception | None, failures: int) -> int:
        attempts.append(type(error).__name__)
        if error is not None and len(attempts) <= failures:
            raise error
        return len(attempts)

    flaky_task = stage_task(flaky, "flaky", retry_delays=[0, 0])

    @flow
    def run(error: Exception | None, failures: int) -> int:
        return flaky_task(error, failures)

    assert run(BackendUnavailable("server restarting"), 2) == 3  # down twice, then up
    attempts.clear()
    assert run(TimeoutError("storage timeout"), 1) == 2
    for error in (RequestRefused("HTTP 400: unknown model"), ValueError("bad config"), FileNotFoundError("x")):
        attempts.clear()
        with pytest.raises(type(error)):
            run(error, 5)
        assert len(attempts) == 1, error


def test_gpu_tagged_stages_share_one_concurrency_limit(prefect_api):
    """With `prefect concurrency-limit create gpu 1`, two flows' GPU tasks carry the `gpu` tag and never overlap.
    Without it they run untagged (a tagged task run asks the server for slots) and overlap: each holds the
    GPU longer than the second flow takes to start."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.runtime import task_run

    from flows import policies
    from flows.iteration import sample_task, train_task
    from flows.policies import GPU_TAG, GpuTask, stage_task

    assert isinstance(sample_task, GpuTask) and isinstance(train_task, GpuTask)
    assert sample_task.task_key != train_task.task_key  # keyed by each stage function's code, not the wrapper
    run_tags: list[list[str]] = []

    def spans_of_two_flows() -> list[tuple[float, float]]:
        spans: list[tuple[float, float]] = []

        def hold_the_gpu() -> None:
            start = time.monotonic()
            run_tags.append(list(task_run.tags))
            time.sleep(4)
            spans.append((start, time.monotonic()))

        gpu_task = stage_task(hold_the_gpu, "hold-the-gpu", gpu=True)

        @flow
        def uses_the_gpu() -> None:
            gpu_task()

        # each thread runs in a copy of this context, which holds the session server's API URL (a bare
        # thread would start with an empty context and a temporary server of its own, without the limit)
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(uses_the_gpu,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert len(spans) == 2
        return sorted(spans)

    policies._gpu_limit_seen.clear()
    (_, first_end), (second_start, _) = spans_of_two_flows()
    assert second_start < first_end  # no limit: they overlap
    assert run_tags == [[], []]
    with get_client(sync_client=True) as client:
        client.create_concurrency_limit(tag=GPU_TAG, concurrency_limit=1)
        policies._gpu_limit_seen.clear()  # looked up again at once, not after 30 s
        try:
            (_, first_end), (second_start, _) = spans_of_two_flows()
        finally:
            client.delete_concurrency_limit_by_tag(GPU_TAG)
            policies._gpu_limit_seen.clear()
    assert second_start >= first_end - 0.05
    assert run_tags[2:] == [[GPU_TAG], [GPU_TAG]]


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


def test_the_loop_scores_its_rounds_on_a_dask_cluster(cli, tmp_path):
    """`rlvr run` with `verify.task_runner: dask`: each round's rollouts are scored in chunks on one local
    cluster for the iteration (two worker processes with their own verifier processes), and the rewards equal
    those of the same iteration scored in the loop's own process."""
    import yaml
    from test_loop import BANK, RUN, curated_with_eval

    from flows.loop import rl_loop
    from storage.lake import Lake

    looped = str(tmp_path / "local")  # the same iteration, scored in the loop's own process
    curated_with_eval(looped)
    rl_loop(RUN, iterations=1, lake_uri=looped)
    config = tmp_path / "dask.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "bank": BANK,
                **RUN,
                "verify": {**RUN["verify"], "workers": 1, "chunk_size": 5, "task_runner": "dask", "dask_workers": 2},
            }
        )
    )
    lake_uri = str(tmp_path / "lake")
    result = cli("run", "--config", str(config), "--iterations", "1", "--lake", lake_uri)
    assert result.returncode == 0, result.stderr[-3000:]
    fanned, local = Lake.open(lake_uri), Lake.open(looped)
    assert (
        rewards_of(fanned, 1)
        .select("rollout_id", "reward", "correct")
        .equals(rewards_of(local, 1).select("rollout_id", "reward", "correct"))
    )
    rounds = fanned.read("rollouts", filter=pc.field("iteration") == 1).group_by("round").len().sort("round")
    for count in rounds["len"]:
        assert f"scored {count} rollouts in {-(-count // 5)} chunk(s) on 2 Dask worker(s)" in result.stdout


def test_artifacts_are_made_beside_the_caller_in_order_and_a_failed_one_stops_nothing(caplog):
    """The loop hands its artifacts to a Publisher and moves on: the calls run on another thread, in the order
    given; one that fails is logged and the rest still run; leaving the block waits for every queued call."""
    import threading

    from flows.artifacts import publishing

    made, release = [], threading.Event()

    def make(key: str, wait: bool = False) -> None:
        if wait:
            assert release.wait(30)
        made.append((key, threading.current_thread().name))

    def broken(key: str) -> None:
        raise ConnectionError("the API is restarting")

    with publishing() as publish:
        publish(make, key="first", wait=True)  # blocks the publisher's thread, not the caller
        publish(broken, key="second")
        publish(make, key="third")
        assert made == []  # the caller is already past all three
        release.set()
    assert [key for key, _ in made] == ["first", "third"]
    assert {thread for _, thread in made} == {"rlvr-artifacts"}
    assert "artifact second not published: the API is restarting" in caplog.text


def test_a_failing_progress_report_never_fails_the_stage(prefect_api, monkeypatch):
    from prefect import flow

    from flows import artifacts
    from flows.policies import stage_task
    from storage.progress import track

    def unreachable(*args, **kwargs):
        raise ConnectionError("the API is restarting")

    monkeypatch.setattr(artifacts, "create_progress_artifact", unreachable)
    monkeypatch.setattr(artifacts, "PROGRESS_AFTER_SECONDS", 0.0)
    counted = stage_task(lambda n: sum(1 for _ in track(range(n), "counting")), "count", retry_delays=[])

    @flow
    def run() -> int:
        return counted(50)

    assert run() == 50


def test_only_loops_that_last_get_progress_artifacts_and_updates_are_spaced(prefect_api, monkeypatch):
    """Each artifact update is an API call (~10 ms): a loop over in seconds publishes none, a longer one
    publishes its artifact once it has run a while, at most once per interval, and always its end."""
    from prefect import flow

    from flows import artifacts
    from flows.policies import stage_task
    from storage.progress import track

    sent = []
    monkeypatch.setattr(
        artifacts, "create_progress_artifact", lambda percent, **kw: sent.append(("create", percent)) or 1
    )
    monkeypatch.setattr(
        artifacts, "update_progress_artifact", lambda _, percent, **kw: sent.append(("update", percent))
    )
    monkeypatch.setattr(artifacts, "PROGRESS_AFTER_SECONDS", 0.3)
    monkeypatch.setattr(artifacts, "PROGRESS_EVERY_SECONDS", 0.25)
    quick = stage_task(lambda n: sum(1 for _ in track(range(n), "quick")), "quick", retry_delays=[])
    slow = stage_task(
        lambda n: sum(1 for _ in track(range(n), "slow") if time.sleep(0.05) is None), "slow", retry_delays=[]
    )

    @flow
    def run() -> tuple[int, int]:
        return quick(1000), slow(40)  # 40 × 50 ms: 2 s, reported every 5 %

    assert run() == (1000, 40)
    assert sent[0][0] == "create" and sent[-1] == ("update", 100.0)
    assert 3 <= len(sent) <= 2 + 2.0 / 0.25  # not the 20 reports the loop made
