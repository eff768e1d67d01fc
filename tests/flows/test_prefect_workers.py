"""Prefect as a team runs it: a Prefect server on PostgreSQL (`infra/local/postgres.sh`), a process work
pool with two workers, and an overlapped loop (`loop.roles: deployments`) whose sampler and trainer run as
concurrent flow runs, one on each worker; afterwards the lake passes `rlvr bench faults`' checks."""

import glob
import os
import re
import shutil
import signal
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

import polars as pl
import pytest
import yaml
from conftest import BIN, ROOT, free_port, wait_for

PG_BIN = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
pytestmark = [
    pytest.mark.skipif(not PG_BIN, reason="PostgreSQL is not installed (Debian's postgresql: .ci/run installs it)"),
    pytest.mark.slow,
]  # a Postgres cluster, a Prefect server on it and two workers
POSTGRES = ROOT / "infra" / "local" / "postgres.sh"


@pytest.fixture(scope="module")
def postgres_prefect():
    """PostgreSQL in a folder of its own, and a Prefect server whose database it is."""
    folder = tempfile.mkdtemp(prefix="rlvr-test-pg-")  # under /tmp: the `postgres` user must reach it
    home = Path(tempfile.mkdtemp(prefix="rlvr-test-prefect-pg-"))
    server = None
    try:
        started = subprocess.run(
            [str(POSTGRES), "start", folder, str(free_port())], capture_output=True, text=True, timeout=120
        )
        assert started.returncode == 0, started.stderr
        database = started.stdout.strip().splitlines()[-1]
        port = free_port()
        env = {
            **os.environ,
            "PREFECT_HOME": str(home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_UI_ENABLED": "false",
            "PREFECT_API_DATABASE_CONNECTION_URL": database,
        }
        env.pop("PREFECT_API_URL", None)
        server = subprocess.Popen(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        api = f"http://127.0.0.1:{port}/api"
        wait_for(api + "/health", server, 120, "prefect server on postgres")
        yield api, database, home
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        subprocess.run([str(POSTGRES), "stop", folder], capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


def psql(database: str, query: str) -> str:
    port = re.search(r":(\d+)/", database).group(1)
    command = [f"{PG_BIN[-1]}/psql", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-Atc", query, "prefect"]
    if os.geteuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=30).stdout.strip()


@pytest.fixture(scope="module")
def deployed(postgres_prefect):
    """The `rlvr` process work pool and the two roles' deployments from the committed prefect.yaml."""
    api, database, home = postgres_prefect
    env = {
        **os.environ,
        "PREFECT_API_URL": api,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "RLVR_HOME": str(ROOT),
        "RLVR_TORCH_THREADS": "1",  # two workers share this machine's cores
        "PREFECT_LOGGING_LEVEL": "INFO",
    }  # the workers log what they submit
    for command in (
        ["work-pool", "create", "rlvr", "--type", "process"],
        ["deploy", "--name", "rollout-producer/async", "--name", "policy-trainer/async"],
    ):
        done = subprocess.run(
            [str(BIN / "prefect"), "--no-prompt", *command],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return env, database


@contextmanager
def two_workers(env: dict, **extra: str):
    """Two process workers of the pool, one flow run at a time each."""
    workers = [
        subprocess.Popen(
            [str(BIN / "prefect"), "worker", "start", "--pool", "rlvr", "--limit", "1", "--name", f"test-worker-{n}"],
            cwd=ROOT,
            env={**env, **extra},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for n in (1, 2)
    ]
    try:
        yield
    finally:
        for worker in workers:
            os.killpg(worker.pid, signal.SIGINT)
        for worker in workers:
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)


def on_workers_config(tmp_path: Path, **loop) -> Path:
    from bench.faults import CONFIG

    config = yaml.safe_load(CONFIG.read_text())
    config["loop"] = {
        **config["loop"],
        "iterations": 3,
        "mode": "async",
        "max_staleness": 1,
        "roles": "deployments",
        "worker_timeout": 300,
        **loop,
    }
    path = tmp_path / "async-workers.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_sampler_and_the_trainer_run_as_flow_runs_on_two_workers(postgres_prefect, deployed, tmp_path):
    from bench.faults import Bench, lake_checks
    from storage import objects
    from storage.lake import Lake

    env, database = deployed
    bench = Bench(tmp_path / "work", prefect_api=postgres_prefect[0])
    lake_uri = bench.lake("local", "on-workers")
    with two_workers(env):
        finished = bench.rlvr("run", "--config", str(on_workers_config(tmp_path)), "--lake", lake_uri)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]

    lake = Lake.open(lake_uri)
    runs = lake.read("runs").filter(pl.col("iteration") > 0)
    sampler_runs = set(runs.filter(pl.col("stage") == "rollout")["prefect_flow_run_id"])
    trainer_runs = set(runs.filter(pl.col("stage") == "train")["prefect_flow_run_id"])
    assert len(sampler_runs) == 1 and len(trainer_runs) == 1 and sampler_runs != trainer_runs
    sampler, trainer = sampler_runs.pop(), trainer_runs.pop()
    # one role on each worker: the flow runs' own logs (rows in Postgres) say which worker submitted each
    submitted = dict(
        row.split("|", 1)
        for row in psql(
            database, "select flow_run_id, message from log where message like 'Worker %submitting flow run%'"
        ).splitlines()
    )
    assert {submitted[sampler].split("'")[1], submitted[trainer].split("'")[1]} == {"test-worker-1", "test-worker-2"}

    trained_first = runs.filter((pl.col("iteration") == 1) & (pl.col("stage") == "train"))["ended_at"][0]
    drawn_second = runs.filter((pl.col("iteration") == 2) & (pl.col("stage") == "rollout"))["started_at"][0]
    assert drawn_second < trained_first  # the two flow runs overlapped in time
    metrics = lake.read("iteration_metrics").filter(pl.col("iteration") > 0).sort("iteration")
    assert metrics["trained_version"].to_list() == [2, 3, 4]  # version 1 is the warm-up
    lag = [trained - 1 - sampled for trained, sampled in zip(metrics["trained_version"], metrics["model_version"])]
    assert all(0 <= behind <= 1 for behind in lag) and lag[1] == 1

    checks = lake_checks(bench, lake_uri, 3)
    assert all(checks.values()), checks
    assert objects.names(lake.location, ("handoff",)) == []  # the hand-off objects are gone
    states = psql(database, f"select state_type from flow_run where id in ('{sampler}', '{trainer}')")
    assert states.split() == ["COMPLETED", "COMPLETED"], states  # Prefect's own rows are in Postgres


def test_a_trainer_killed_on_its_worker_fails_the_loop_and_a_second_run_finishes(postgres_prefect, deployed, tmp_path):
    """kill -9 of the trainer's process as it commits iteration 2's version: its flow run crashes, the loop
    cancels the sampler and fails naming the trainer; run again, the lake holds every iteration once."""
    from bench.faults import Bench, lake_checks

    env, database = deployed
    bench = Bench(tmp_path / "work", prefect_api=postgres_prefect[0])
    lake_uri, config = bench.lake("local", "trainer-killed"), str(on_workers_config(tmp_path))
    with two_workers(env, RLVR_FAULT="committed:train:model_versions@2"):
        failed = bench.rlvr("run", "--config", config, "--lake", lake_uri)
    assert failed.returncode != 0
    assert "the overlapped loop's trainer (policy-trainer/async" in failed.stderr, failed.stderr[-2000:]
    assert "ended Crashed" in failed.stderr, failed.stderr[-2000:]
    sampler = psql(
        database,
        "select state_type from flow_run where flow_id = (select id from flow where name = "
        "'rollout-producer') order by created desc limit 1",
    )
    assert sampler in ("CANCELLED", "CANCELLING", "COMPLETED"), sampler  # cancelled, unless it had finished
    with two_workers(env):
        finished = bench.rlvr("run", "--config", config, "--lake", lake_uri)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    checks = lake_checks(bench, lake_uri, 3)
    assert all(checks.values()), checks


def test_a_role_no_worker_starts_fails_the_loop_with_the_command_to_start_one(postgres_prefect, deployed, tmp_path):
    from bench.faults import Bench

    bench = Bench(tmp_path / "work", prefect_api=postgres_prefect[0])
    lake_uri = bench.lake("local", "no-worker")
    failed = bench.rlvr("run", "--config", str(on_workers_config(tmp_path, worker_timeout=3)), "--lake", lake_uri)
    assert failed.returncode != 0
    assert "no worker started the sampler's flow run (rollout-producer/async) in 3 s" in failed.stderr, failed.stderr[
        -2000:
    ]
    assert "prefect worker start --pool rlvr" in failed.stderr
    runs = psql(
        deployed[1],
        "select state_type from flow_run where flow_id in (select id from flow where name in "
        "('rollout-producer', 'policy-trainer')) and state_type not in ('COMPLETED', 'CRASHED', 'CANCELLED')",
    )
    assert set(runs.split()) <= {"CANCELLING"}, runs  # nothing left scheduled for a later worker
