"""One writer per loop, enforced by the lake: leases written with put-if-absent, refused or queued while
their holder lives, taken over (and logged) when it dies, on local disk and on S3 alike."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import polars as pl
import pytest

from storage import leases, objects, presence
from storage.lake import LakeError, LeaseHeld, LeaseLost
from storage.leases import LOOP

HOLDER = textwrap.dedent("""
    import sys, time
    from storage.lake import Lake
    lake = Lake.open(sys.argv[1])
    with lake.lease("loop"):
        with lake.run("rl-iteration", "rollout", {}, iteration=1) as run:
            print(run.run_id, flush=True)
            time.sleep(600)
""")


def hold_in_another_process(lake_uri: str) -> tuple[subprocess.Popen, str]:
    """A process that holds the loop lease and has a run in progress; (process, its run id)."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, lake_uri],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    return process, process.stdout.readline().strip()


def test_a_second_writer_is_refused_at_once_naming_the_holder(lake, lake_uri):
    process, run_id = hold_in_another_process(lake_uri)
    try:
        started = time.monotonic()
        with pytest.raises(LeaseHeld) as refused:
            with lake.lease(LOOP):
                pass
        assert time.monotonic() - started < 5
        message = str(refused.value)
        assert f"pid {process.pid}" in message and run_id in message and "since" in message
        assert "--wait" in message and "\n" not in message
    finally:
        process.kill()
        process.wait()


def test_a_dead_holder_is_taken_over_its_runs_abandoned_and_the_takeover_logged(lake, lake_uri):
    process, run_id = hold_in_another_process(lake_uri)
    process.send_signal(signal.SIGKILL)
    process.wait()
    with lake.lease(LOOP) as grant:  # same machine: its pid is gone, so no timeout to wait
        assert grant.taken_from["pid"] == process.pid
    runs = lake.read("runs")
    killed = runs.filter(pl.col("run_id") == run_id).row(0, named=True)
    assert killed["status"] == "abandoned" and f"pid {process.pid}" in killed["error"]
    takeover = runs.filter(pl.col("stage") == "takeover").row(0, named=True)
    parameters = json.loads(takeover["parameters"])
    assert takeover["status"] == "completed" and parameters["abandoned_runs"] == [run_id]
    assert parameters["lease"] == "loop" and f"pid {process.pid}" in parameters["from"]
    assert presence.process_records(lake.location) == []  # the dead process's record is gone; this one left too


def test_a_holder_on_another_machine_counts_until_its_heartbeat_is_old(lake, monkeypatch):
    monkeypatch.setenv("RLVR_LEASE_TIMEOUT", "30")
    other = {
        "process_id": "far-7-1",
        "host": "far-away",
        "boot_id": "x",
        "pid": 7,
        "started": "1",
        "command": "rlvr run",
        "runs": [],
        "heartbeat_at": time.time(),
    }
    objects.put(lake.location, ("processes", "far-7-1.json"), other)
    assert objects.put_if_absent(lake.location, ("leases", LOOP, "0000000001.json"), {**other, "since": time.time()})
    with pytest.raises(LeaseHeld, match="held by far-away pid 7"):
        with lake.lease(LOOP):
            pass
    objects.put(lake.location, ("processes", "far-7-1.json"), {**other, "heartbeat_at": time.time() - 31})
    with lake.lease(LOOP) as grant:
        assert grant.epoch == 2 and grant.taken_from["host"] == "far-away"


def test_wait_queues_behind_the_holder(lake, lake_uri):
    process, _ = hold_in_another_process(lake_uri)
    threading.Timer(2.0, process.kill).start()
    started = time.monotonic()
    with lake.lease(LOOP, wait=True) as grant:
        assert time.monotonic() - started >= 1.5 and grant.taken_from["pid"] == process.pid
    process.wait()


def test_reentrant_within_a_thread_exclusive_between_threads(lake):
    with lake.lease(LOOP):
        with lake.lease(LOOP) as inner:
            assert inner.count == 2
        errors = []

        def other_thread():
            try:
                with lake.lease(LOOP):
                    pass
            except LeaseHeld as error:
                errors.append(str(error))

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert errors and "another thread of this process" in errors[0]
    with lake.lease(LOOP):  # released: free again
        pass


def test_racing_processes_never_both_win(lake_uri, tmp_path):
    """Eight processes take the lease as fast as they can; the epoch files say who won each turn: never two."""
    script = textwrap.dedent("""
        import sys
        from storage.lake import Lake, LeaseHeld
        lake, wins = Lake.open(sys.argv[1]), 0
        for _ in range(6):
            try:
                with lake.lease("loop"):
                    wins += 1
            except LeaseHeld:
                pass
        print(wins)
    """)
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, lake_uri],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        for _ in range(8)
    ]
    wins = sum(int(p.communicate(timeout=300)[0].strip() or 0) for p in processes)
    from storage.lake import Lake

    location = Lake.open(lake_uri).location
    epochs = [name for name in objects.names(location, ("leases", LOOP)) if name.endswith(".json")]
    newest = max(int(name.split(".")[0]) for name in epochs)
    assert wins >= 1 and newest == wins  # every win is exactly one epoch: no epoch was won twice


def test_a_writer_whose_lease_was_taken_over_writes_nothing(lake):
    from storage.runs import Run

    with lake.lease(LOOP) as grant:
        objects.put_if_absent(lake.location, ("leases", LOOP, f"{grant.epoch + 1:010d}.json"), {"pid": 1})
        grant.lost = True  # what the heartbeat finds at its next beat
        with pytest.raises(LeaseLost, match="lost the loop lease"):
            lake.append("verifier_noise", pl.DataFrame(), Run("t", "t", {}))
    assert not lake.exists("verifier_noise")


def test_the_heartbeat_notices_a_takeover(lake, monkeypatch):
    monkeypatch.setenv("RLVR_LEASE_TIMEOUT", "3")  # a beat every 0.5 s
    with lake.lease(LOOP) as grant:
        objects.put_if_absent(lake.location, ("leases", LOOP, f"{grant.epoch + 1:010d}.json"), {"pid": 1})
        deadline = time.monotonic() + 10
        while not grant.lost and time.monotonic() < deadline:
            time.sleep(0.1)
        assert grant.lost and not leases.held_here(lake.location, LOOP)


def test_a_run_marked_abandoned_cannot_complete(lake):
    with pytest.raises(LakeError, match="marked abandoned while it worked"):
        with lake.run("test", "test", {}) as run:
            row = lake.read("runs").row(0, named=True)
            lake._write_run_row({**row, "status": "abandoned"})
    assert lake.read("runs", columns=["status"])["status"].to_list() == ["abandoned"]
    assert run.run_id not in lake.read("runs").filter(pl.col("status") == "completed")["run_id"].to_list()


def test_a_worker_joins_the_holders_epoch_and_stops_writing_when_the_holder_dies(lake, lake_uri, monkeypatch):
    """`leases.joining`: the overlapped loop's roles on workers work under the epoch of the run that started them."""
    monkeypatch.setenv("RLVR_LEASE_TIMEOUT", "3")  # a beat every 0.5 s
    process, _ = hold_in_another_process(lake_uri)
    try:
        epoch = leases.holder(lake.location, LOOP).epoch
        with pytest.raises(
            LeaseHeld, match=f"works under epoch {epoch + 1} of the lake's loop lease, which is at epoch {epoch}"
        ):
            with leases.joining(lake.location, LOOP, epoch + 1):
                pass
        with leases.joining(lake.location, LOOP, epoch) as grant:
            with lake.lease(LOOP):  # the flows it runs re-enter the joined lease
                leases.check(lake.location)  # what every lake write asks first: allowed
            process.kill()
            process.wait()
            deadline = time.monotonic() + 10
            while not grant.lost and time.monotonic() < deadline:
                time.sleep(0.1)
            assert grant.lost
            with pytest.raises(LeaseLost, match="lost the loop lease"):
                leases.check(lake.location)  # its writes are refused from now on
        assert leases.holder(lake.location, LOOP).epoch == epoch  # joining never takes or releases an epoch
    finally:
        process.kill()
        process.wait()


def test_a_role_waiting_on_the_other_stops_when_it_failed_or_died(lake):
    """flows/handoff.py: neither role of the overlapped loop waits forever."""
    from flows.handoff import Handoff, Plan, RoleFailed

    plan = Plan(handoff="h1", first=1, total=2, start=0, already_trained=None, lease_epoch=1)
    sampler, trainer = Handoff(lake, plan, "sampler"), Handoff(lake, plan, "trainer")
    sampler.join()
    trainer.join()
    sampler.sampled(1)
    trainer.wait_sampled(1)  # handed over: returns at once
    assert sampler.wait_published(0) == 0  # the run's first version needs no hand-over
    trainer.published(1)
    assert sampler.wait_published(1) == 1
    trainer.failed(ValueError("out of memory"))
    with pytest.raises(
        RoleFailed,
        match=r"the trainer stopped \(ValueError: out of memory\); the sampler waited "
        "for version 2",
    ):
        sampler.wait_published(2)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    record = {**presence.this_process().as_record(), "pid": dead.pid, "started": "1"}
    objects.put(lake.location, ("handoff", "h1", "sampler.json"), record)
    with pytest.raises(
        RoleFailed, match="the sampler's process .* died; the trainer waited for iteration 2's rollouts"
    ):
        trainer.wait_sampled(2)
    sampler.close()
    assert objects.names(lake.location, ("handoff",)) == []


def test_what_follows_a_training_step_runs_beside_the_next_in_order_and_its_failure_stops_both_roles(lake):
    """flows/async_roles.Beside: publishing and recording run in a thread of their own, one version after another,
    under the trainer's lease; a failed publish is handed over (the sampler stops rather than waits for the
    version) and raised in the trainer, and nothing after it runs."""
    from flows.async_roles import Beside
    from flows.handoff import Handoff, Plan, RoleFailed

    plan = Plan(handoff="h2", first=1, total=3, start=0, already_trained=None, lease_epoch=1)
    sampler, trainer = Handoff(lake, plan, "sampler"), Handoff(lake, plan, "trainer")
    done, release_first = [], threading.Event()

    def after_training(version: int) -> None:
        if version == 1:
            release_first.wait(10)  # the trainer goes on while version 1 is still publishing
        leases.check(lake.location)  # what a lake write asks first: the lease is this thread's too
        if version == 2:
            raise ConnectionError("no endpoint confirmed version 2")
        done.append((version, threading.current_thread().name))

    with lake.lease(LOOP):
        later = Beside(lake, after_training, trainer)
        for version in (1, 2, 3):
            later.submit(version)
        assert done == []  # submitting never waits for the work
        release_first.set()
        with pytest.raises(ConnectionError, match="no endpoint confirmed version 2"):
            later.finish()
    assert [version for version, _ in done] == [1]  # in order; version 3 was never published after the failure
    assert done[0][1].startswith("rlvr-after-training")
    with pytest.raises(RoleFailed, match=r"the trainer stopped \(ConnectionError: no endpoint confirmed version 2\)"):
        sampler.wait_published(2)
    with pytest.raises(LeaseHeld, match="does not hold the lake's loop lease"):
        Beside(lake, after_training, trainer)  # a helper thread needs a lease holder to help
    sampler.close()


def test_a_timeout_in_the_environment_must_be_seconds(monkeypatch):
    """The lease timeout and the temporary Prefect server's start-up bound read the same way (storage/environment.py)."""
    from flows.orchestration import OrchestrationUnavailable, _start_timeout
    from storage.presence import lease_timeout

    monkeypatch.setenv("RLVR_LEASE_TIMEOUT", "12.5")
    monkeypatch.setenv("RLVR_PREFECT_START_TIMEOUT", "")
    assert lease_timeout() == 12.5 and _start_timeout() == 90.0
    monkeypatch.setenv("RLVR_LEASE_TIMEOUT", "a minute")
    with pytest.raises(ValueError, match="RLVR_LEASE_TIMEOUT='a minute': give a number of seconds"):
        lease_timeout()
    monkeypatch.setenv("RLVR_PREFECT_START_TIMEOUT", "soon")
    with pytest.raises(OrchestrationUnavailable, match="RLVR_PREFECT_START_TIMEOUT='soon': give a number of seconds"):
        _start_timeout()
