"""The stages as Prefect tasks: the chains and iteration lists a stage command runs, configs per section, retries
of transient failures, the GPU concurrency limit, progress artifacts, and the loop's rounds scored on Dask."""

from __future__ import annotations

import contextvars
import threading
import time

import pyarrow.compute as pc
import pytest
from helpers import rewards_of


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


def test_the_loop_scores_its_rounds_on_a_dask_cluster(cli, tmp_path):
    """`rlvr run` with `verify.task_runner: dask`: each round's rollouts are scored in chunks on one local
    cluster for the iteration (two worker processes with their own verifier processes), and the rewards equal
    those of the same iteration scored in the loop's own process."""
    import yaml
    from helpers import BANK, RUN, curated_with_eval

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
