"""`rlvr track`: a lake written by the real loop (two iterations of the tiny policy, then a third), logged to a real
`mlflow server` on loopback and to TensorBoard event files, each read back with its own reader (MLflow's REST API,
TensorBoard's EventAccumulator): metrics at step = iteration, stage times, the report's plots, the lake's run as
tags; a second pass logs nothing, a crash between logging and recording loses and doubles nothing, and
`rlvr lineage tracking` shows the tracker runs. The MLflow server runs from its own virtual environment
(`make mlflow-server`, or RLVR_MLFLOW naming an `mlflow` executable); its tests skip, saying so, without it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import httpx
import polars as pl
import pytest
from conftest import BIN, ROOT, free_port, run_cli, stop_group, wait_for

from tasks.interop.tracking import TrackingConfig, lake_run_of, stage_seconds, steps_after

MLFLOW = Path(os.environ.get("RLVR_MLFLOW") or ROOT / ".venv-mlflow" / "bin" / "mlflow")
CLI_ENV = {"PYTHONPATH": str(ROOT)}  # this checkout's code in the `rlvr` subprocesses, whatever is installed


# ---- the pure part -----------------------------------------------------------------------------------------------


def stamp(second: float) -> datetime:
    return datetime.fromtimestamp(1_800_000_000 + second, UTC)


RUNS = pl.DataFrame(
    [
        {
            "run_id": "r-curate",
            "stage": "curate",
            "iteration": None,
            "prefect_flow_run_id": None,
            "started_at": stamp(0),
            "ended_at": stamp(1),
            "status": "completed",
        },
        {
            "run_id": "r-roll",
            "stage": "rollout",
            "iteration": 1,
            "prefect_flow_run_id": "f1",
            "started_at": stamp(2),
            "ended_at": stamp(4.5),
            "status": "completed",
        },
        {
            "run_id": "r-train-failed",
            "stage": "train",
            "iteration": 1,
            "prefect_flow_run_id": "f1",
            "started_at": stamp(5),
            "ended_at": stamp(6),
            "status": "failed",
        },
        {
            "run_id": "r-train",
            "stage": "train",
            "iteration": 1,
            "prefect_flow_run_id": "f2",
            "started_at": stamp(7),
            "ended_at": stamp(8),
            "status": "completed",
        },
        {
            "run_id": "r-train-2",
            "stage": "train",
            "iteration": 1,
            "prefect_flow_run_id": "f2",
            "started_at": stamp(8),
            "ended_at": stamp(8.5),
            "status": "completed",
        },
        {
            "run_id": "r-running",
            "stage": "rollout",
            "iteration": 2,
            "prefect_flow_run_id": "f2",
            "started_at": stamp(9),
            "ended_at": None,
            "status": "running",
        },
    ]
)
METRICS = pl.DataFrame(
    [
        {
            "iteration": 2,
            "model_version": 1,
            "loss": None,
            "mean_reward": float("nan"),
            "solve_rate_by_level": None,
            "created_at": stamp(20),
        },
        {
            "iteration": 1,
            "model_version": 0,
            "loss": 0.25,
            "mean_reward": 0.5,
            "solve_rate_by_level": '{"1": 0.75, "3": null}',
            "created_at": stamp(10),
        },
    ]
)


def test_the_lakes_run_is_its_first_stage_run_of_an_iteration():
    result = lake_run_of("/lake", RUNS)
    assert (result.run_id, result.prefect_flow_run_id) == ("r-roll", "f1")
    assert result.tags() == {"rlvr.lake": "/lake", "rlvr.run_id": "r-roll", "rlvr.prefect_flow_run_id": "f1"}
    assert lake_run_of("/lake", RUNS.filter(pl.col("iteration").is_null())) is None


def test_stage_times_add_up_completed_runs_and_span_the_iteration():
    # rollout 2.5 s; train 1 s + 0.5 s (the failed attempt and the run still going are not counted); wall 2 s → 8.5 s
    expected = {1: {"stage_seconds/rollout": 2.5, "stage_seconds/train": 1.5, "iteration_seconds": 6.5}}
    assert stage_seconds(RUNS) == expected


def test_steps_are_iterations_in_order_with_nulls_and_nan_left_out():
    steps = steps_after(METRICS, RUNS, None)
    assert [s.iteration for s in steps] == [1, 2]
    assert steps[0].values == {
        "model_version": 0.0,
        "loss": 0.25,
        "mean_reward": 0.5,
        "solve_rate_by_level/1": 0.75,
        "stage_seconds/rollout": 2.5,
        "stage_seconds/train": 1.5,
        "iteration_seconds": 6.5,
    }
    assert steps[1].values == {"model_version": 1.0}
    assert steps[0].timestamp_ms == 1_800_000_010_000  # the row's created_at: the same on every pass
    assert [s.iteration for s in steps_after(METRICS, RUNS, 1)] == [2]
    assert steps_after(METRICS, RUNS, 2) == []


def test_tracking_is_off_by_default_and_in_the_shipped_config():
    from storage.config import load_yaml_config

    assert not TrackingConfig().enabled
    shipped = load_yaml_config(ROOT / "configs" / "tracking.yaml", TrackingConfig, section="tracking")
    assert not shipped.enabled and shipped.mlflow.experiment == "rlvr"
    with pytest.raises(ValueError, match="experimnt"):
        TrackingConfig.model_validate({"mlflow": {"experimnt": "x"}})


def test_rlvr_track_refuses_a_config_with_tracking_off(tmp_path):
    result = run_cli(
        "track", "--config", str(ROOT / "configs" / "tracking.yaml"), "--lake", str(tmp_path / "lake"), env=CLI_ENV
    )
    assert result.returncode == 2 and "tracking is off" in result.stderr


# ---- against a real lake, a real MLflow server and real event files ----------------------------------------------


@pytest.fixture(scope="module")
def mlflow_started():
    """`mlflow server` on a free loopback port, SQLite-backed, proxying artifacts, started (it takes ~10 s to answer,
    the lake is built meanwhile); killed, its whole process group, when the module's tests are done."""
    if not MLFLOW.exists():
        pytest.skip(f"no MLflow server at {MLFLOW}: `make mlflow-server` installs one (or set RLVR_MLFLOW)")
    home = Path(tempfile.mkdtemp(prefix="rlvr-test-mlflow-"))
    port = free_port()
    process = subprocess.Popen(
        [
            str(MLFLOW),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{home / 'mlflow.db'}",
            "--artifacts-destination",
            str(home / "artifacts"),
        ],
        cwd=home,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield f"http://127.0.0.1:{port}", process
    finally:
        stop_group(process, timeout=5)  # its job runner's consumers too; it holds nothing we keep
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def mlflow_server(mlflow_started, loop_lake):
    """The server's address, once it answers."""
    url, process = mlflow_started
    wait_for(url + "/health", process, 120, "mlflow server")
    return url


@pytest.fixture(scope="module")
def loop_lake(tmp_path_factory, prefect_api):
    """Two iterations of the real loop (tiny policy, random verifier), as in test_loop.py."""
    from helpers import RUN, curated_with_eval

    from flows.loop import rl_loop

    lake_uri = str(tmp_path_factory.mktemp("tracking") / "lake")
    curated_with_eval(lake_uri)
    rl_loop(RUN, lake_uri=lake_uri)
    return lake_uri


def tracking_config(path: Path, mlflow_url: str, experiment: str, log_dir: Path) -> Path:
    import yaml

    path.write_text(
        yaml.safe_dump(
            {
                "tracking": {
                    "mlflow": {"enabled": True, "tracking_uri": mlflow_url, "experiment": experiment},
                    "tensorboard": {"enabled": True, "log_dir": str(log_dir)},
                }
            }
        )
    )
    return path


def mlflow_get(url: str, name: str, **params) -> dict:
    response = httpx.get(f"{url}/api/2.0/mlflow/{name}", params=params, timeout=30)
    response.raise_for_status()
    return response.json()


def mlflow_runs(url: str, experiment: str) -> list[dict]:
    experiment_id = mlflow_get(url, "experiments/get-by-name", experiment_name=experiment)["experiment"][
        "experiment_id"
    ]
    response = httpx.post(f"{url}/api/2.0/mlflow/runs/search", json={"experiment_ids": [experiment_id]}, timeout=30)
    return response.json().get("runs", [])


def history(url: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return [
        (m["step"], m["value"])
        for m in mlflow_get(url, "metrics/get-history", run_id=run_id, metric_key=key).get("metrics", [])
    ]


def scalars(log_dir: Path, key: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(key)]


def same_points(logged: list[tuple[int, float]], expected: list[tuple[int, float]]) -> bool:
    """Steps equal and values equal to float32's precision (event files hold float32)."""
    return [step for step, _ in logged] == [step for step, _ in expected] and [
        value for _, value in logged
    ] == pytest.approx([value for _, value in expected], rel=1e-6)


def image_tags(log_dir: Path) -> list[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return events.Tags()["images"]


def lake_facts(lake_uri: str) -> tuple[list[tuple[int, float]], str]:
    """The lake's own (iteration, loss) and the run id it is tracked as."""
    from storage.lake import Lake

    lake = Lake.open(lake_uri)
    metrics = lake.read("iteration_metrics").sort("iteration")
    return list(zip(metrics["iteration"], metrics["loss"])), lake_run_of(lake.uri, lake.read("runs")).run_id


def test_metrics_stage_times_and_plots_reach_mlflow_and_tensorboard_once(mlflow_server, loop_lake, tmp_path):
    from helpers import RUN

    from flows.loop import rl_loop
    from storage.config import load_yaml_config
    from storage.lake import Lake
    from tasks.interop.trackers import track

    log_dir = tmp_path / "tb"
    config = tracking_config(tmp_path / "tracking.yaml", mlflow_server, "once", log_dir)
    result = run_cli("track", "--config", str(config), "--lake", loop_lake, "--format", "json", env=CLI_ENV)
    assert result.returncode == 0, result.stderr
    shown = {row["tracker"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert shown["mlflow"]["logged"] == shown["tensorboard"]["logged"] == "iterations 1-2"
    losses, lake_run_id = lake_facts(loop_lake)

    [run] = mlflow_runs(mlflow_server, "once")
    run_id = run["info"]["run_id"]
    tags = {tag["key"]: tag["value"] for tag in run["data"]["tags"]}
    assert tags["rlvr.lake"] == loop_lake and tags["rlvr.run_id"] == lake_run_id
    assert history(mlflow_server, run_id, "loss") == losses
    assert [step for step, _ in history(mlflow_server, run_id, "stage_seconds/train")] == [1, 2]
    assert all(seconds > 0 for _, seconds in history(mlflow_server, run_id, "iteration_seconds"))
    artifacts = mlflow_get(mlflow_server, "artifacts/list", run_id=run_id, path="report")["files"]
    names = {Path(f["path"]).name for f in artifacts}
    assert {"overview.png", "train_solve_rate_by_level.png"} <= names and all(f["file_size"] > 1000 for f in artifacts)

    tb_run = log_dir / lake_run_id
    assert same_points(scalars(tb_run, "loss"), losses)
    assert [step for step, _ in scalars(tb_run, "stage_seconds/rollout")] == [1, 2]
    assert "report/overview" in image_tags(tb_run)

    settings = load_yaml_config(config, TrackingConfig, section="tracking")
    again = track(Lake.open(loop_lake), settings)  # in-process from here: the same pass
    assert [(row["first_iteration"], row["last_iteration"]) for row in again] == [(None, None)] * 2

    rl_loop(RUN, iterations=3, lake_uri=loop_lake)  # the loop goes on: only iteration 3 is new
    third = track(Lake.open(loop_lake), settings)
    assert [(row["first_iteration"], row["last_iteration"]) for row in third] == [(3, 3)] * 2
    losses, _ = lake_facts(loop_lake)
    assert len(mlflow_runs(mlflow_server, "once")) == 1
    assert history(mlflow_server, run_id, "loss") == losses and [s for s, _ in losses] == [1, 2, 3]
    assert same_points(scalars(tb_run, "loss"), losses)

    lineage = run_cli("lineage", "tracking", "--lake", loop_lake, "--format", "json", env=CLI_ENV)
    assert lineage.returncode == 0, lineage.stderr
    mine = {
        row["tracker"]: row
        for row in map(json.loads, lineage.stdout.splitlines())
        if row["tracker_run_id"] in (run_id, lake_run_id)
    }
    assert mine["mlflow"]["tracker_run_id"] == run_id and mine["mlflow"]["experiment"] == "once"
    assert (mine["mlflow"]["first_iteration"], mine["mlflow"]["last_iteration"], mine["mlflow"]["passes"]) == (1, 3, 2)
    assert mine["mlflow"]["link"].endswith(f"/runs/{run_id}") and mine["tensorboard"]["link"] == str(tb_run)
    assert all(row["lake_run_id"] == lake_run_id for row in mine.values())


def test_a_crash_between_logging_and_recording_loses_and_doubles_nothing(
    mlflow_server, loop_lake, tmp_path, monkeypatch
):
    from storage.config import load_yaml_config
    from storage.lake import Lake
    from tasks.interop.trackers import track

    log_dir = tmp_path / "tb"
    config = load_yaml_config(
        tracking_config(tmp_path / "tracking.yaml", mlflow_server, "crash", log_dir), TrackingConfig, section="tracking"
    ).model_copy(update={"plots": False})
    lake = Lake.open(loop_lake)
    append = Lake.append

    def crash_on_record(self, name, rows, run):
        if name == "tracked_runs":
            raise RuntimeError("killed after logging, before recording")
        return append(self, name, rows, run)

    monkeypatch.setattr(Lake, "append", crash_on_record)
    with pytest.raises(RuntimeError, match="killed"):
        track(lake, config)
    monkeypatch.setattr(Lake, "append", append)
    results = track(lake, config)  # logs every iteration again: nothing was recorded
    losses, lake_run_id = lake_facts(loop_lake)
    assert {(row["first_iteration"], row["last_iteration"]) for row in results} == {(losses[0][0], losses[-1][0])}
    [run] = mlflow_runs(mlflow_server, "crash")
    assert history(mlflow_server, run["info"]["run_id"], "loss") == losses  # each step once
    assert same_points(scalars(log_dir / lake_run_id, "loss"), losses)  # purge_step hid the first pass's
    assert len(list((log_dir / lake_run_id).glob("events.*"))) == 2


def test_follow_logs_as_the_loop_writes_and_stops_on_ctrl_c(loop_lake, tmp_path):
    """`--follow` beside the lake: a pass, then another every --interval, until SIGINT (Ctrl-C) ends it cleanly.

    Ctrl-C is sent once the first pass is shown, not once its row is in the lake: a pass records its run before
    it prints, and an interrupt between the two (a loaded host) leaves nothing printed to check."""
    import threading

    import yaml

    from storage.lake import Lake

    log_dir = tmp_path / "tb"
    config = tmp_path / "tracking.yaml"
    config.write_text(
        yaml.safe_dump({"tracking": {"tensorboard": {"enabled": True, "log_dir": str(log_dir)}, "plots": False}})
    )
    stderr_path = tmp_path / "follow.err"
    with stderr_path.open("w") as stderr:
        follower = subprocess.Popen(
            [str(BIN / "rlvr"), "track", "--config", str(config), "--follow", "--interval", "0.5", "--lake", loop_lake],
            env={**os.environ, **CLI_ENV, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    lines: list[str] = []
    shown = threading.Event()

    def read_stdout():
        for line in follower.stdout:
            lines.append(line)
            if "iterations 1-" in line:
                shown.set()
        shown.set()  # the output ended (the follower died): stop waiting

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    try:
        shown.wait(timeout=90)
        follower.send_signal(signal.SIGINT)
        follower.wait(timeout=30)
        reader.join(timeout=10)
    finally:
        if follower.poll() is None:
            follower.kill()
    out, err = "".join(lines), stderr_path.read_text()
    assert follower.returncode == 0 and "Traceback" not in err, err[-2000:]
    assert "iterations 1-" in out, out[-2000:]
    mine = Lake.open(loop_lake).read("tracked_runs").filter(pl.col("tracker_uri") == str(log_dir))
    assert mine.height == 1  # the later passes found nothing new
