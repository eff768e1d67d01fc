"""Experiment tracking: the loop's iteration metrics, stage times and the report's plots, logged to MLflow and to
TensorBoard event files by a follower of the lake (`rlvr track`), never by the loop itself.

The loop already writes all of it to the lake: one `iteration_metrics` row per iteration, and a `runs` row per stage
run with its start and end. A follower reads those rows and logs each iteration once, as step = iteration, so the
loop's code, its timings and its failure modes stay as they are, and a lake written before this module existed is
tracked the same way. What is logged where is recorded in the lake's `tracked_runs` table, one row per logging pass.

The lake's run: a lake holds one training trajectory (iterations 0, 1, 2, ... resumed across `rlvr run`
invocations), so the tracked run stands for the lake itself, named by its URI and by the `run_id` of the first
stage run that belongs to an iteration (the earliest `runs` row with an iteration). That id never changes as the
loop resumes, and a lake made anew at the same place has another one, so it gets a tracker run of its own. The
MLflow run is tagged `rlvr.lake` (the URI), `rlvr.run_id` (that id) and `rlvr.prefect_flow_run_id` (the Prefect
flow run of that first stage run); the TensorBoard run is the folder `<log_dir>/<run id>`.

Idempotent, and a crash loses nothing: a pass logs the iterations after the last one the lake records as logged
to that tracker run, and records them in `tracked_runs` only once the tracker has them (log, then record). A
crash between the two re-logs the same iterations next time, which is harmless: to MLflow every point is the same
(key, step, value, timestamp), the timestamp being the iteration row's `created_at`, and MLflow's store keeps one
of identical points; a TensorBoard pass opens its writer with `purge_step` = its first iteration, so TensorBoard
hides whatever an interrupted pass wrote from that step on.

What is kept and dropped: the plots are the report's (`tasks/report`), drawn anew over the whole run on each pass
that logs new iterations, as MLflow artifacts under `report/` (replaced) and TensorBoard images at the pass's last
step; stage times count the stage runs completed when the iteration is logged (a curriculum step that finishes
after the iteration's row is not counted).

This module is the pure part: the config, the `tracked_runs` table, and what each pass logs, from frames. The
trackers and the pass itself, which read the lake and speak to MLflow and TensorBoard, are in trackers.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime

import polars as pl
import pyarrow as pa
from pydantic import Field

from storage.config import Strict
from storage.schemas import TableSpec, column, register

# ---- config ----------------------------------------------------------------------------------------------------


class MlflowConfig(Strict):
    """Where an MLflow tracking server runs, and the experiment the lake's run is logged under."""

    enabled: bool = Field(False, description="log to an MLflow tracking server")
    tracking_uri: str = Field(
        "http://127.0.0.1:5000",
        description="the server's address (`mlflow server`); plots "
        "are uploaded only where it proxies artifacts (--serve-artifacts, its default)",
    )
    experiment: str = Field("rlvr", description="experiment name, created when the server has none of that name")
    timeout_s: float = Field(30.0, gt=0, description="seconds one request to the server may take")


class TensorBoardConfig(Strict):
    """Where TensorBoard event files are written (read with `tensorboard --logdir`)."""

    enabled: bool = Field(False, description="write TensorBoard event files (needs the tracking extra)")
    log_dir: str = Field(
        "runs/tensorboard", description="folder of the runs: each lake's run is a sub-folder named by its run id"
    )


class TrackingConfig(Strict):
    """The `tracking:` section: which trackers `rlvr track` logs to. Off unless a tracker is enabled."""

    mlflow: MlflowConfig = Field(default_factory=MlflowConfig, description="the MLflow tracking server")
    tensorboard: TensorBoardConfig = Field(default_factory=TensorBoardConfig, description="TensorBoard event files")
    plots: bool = Field(True, description="log the report's plots too (a few seconds a pass that logs anything)")

    @property
    def enabled(self) -> bool:
        return self.mlflow.enabled or self.tensorboard.enabled


class TrackingError(RuntimeError):
    """A tracker refused or could not be reached; the message says which and why."""


# ---- the lake's record -----------------------------------------------------------------------------------------


TRACKED_RUNS = register(
    TableSpec(
        name="tracked_runs",
        partition_by=(),
        description="Each pass of `rlvr track`: the tracker run (MLflow or TensorBoard) the lake's run is logged to, "
        "and the iterations that pass logged there (step = iteration).",
        schema=pa.schema(
            [
                column("tracker", pa.string(), False, "mlflow or tensorboard"),
                column("tracker_uri", pa.string(), False, "the MLflow server's address or the TensorBoard log folder"),
                column("tracker_run_id", pa.string(), False, "the MLflow run id, or the TensorBoard run's folder name"),
                column("experiment", pa.string(), True, "the MLflow experiment's name"),
                column(
                    "link", pa.string(), True, "where to look: the run's page in the MLflow UI, or its event folder"
                ),
                column("lake_uri", pa.string(), False, "the lake whose run it is"),
                column(
                    "lake_run_id",
                    pa.string(),
                    False,
                    "the lake's run: its first stage run that belongs to an iteration",
                ),
                column("first_iteration", pa.int64(), False, "first iteration (step) this pass logged"),
                column("last_iteration", pa.int64(), False, "last iteration (step) this pass logged"),
                column("plots", pa.int64(), True, "report plots logged with it (0 when none could be)"),
                column("run_id", pa.string(), False, "the `rlvr track` run that wrote the row"),
                column("created_at", pa.timestamp("us", tz="UTC"), False),
            ]
        ),
    )
)

# ---- pure: what to log -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LakeRun:
    """The run a tracker run stands for (see the module docstring)."""

    lake_uri: str
    run_id: str
    prefect_flow_run_id: str | None
    started_at: datetime

    def tags(self) -> dict[str, str]:
        tags = {"rlvr.lake": self.lake_uri, "rlvr.run_id": self.run_id}
        if self.prefect_flow_run_id:
            tags["rlvr.prefect_flow_run_id"] = self.prefect_flow_run_id
        return tags


@dataclass(frozen=True)
class Step:
    """One iteration's values, logged at step = iteration with the iteration row's time."""

    iteration: int
    timestamp_ms: int
    values: dict[str, float]


METRICS = (
    "model_version",
    "trained_version",
    "rounds",
    "groups",
    "groups_kept",
    "filtered_share",
    "learning_zone_share",
    "mean_reward",
    "mean_staleness",
    "loss",
    "clip_fraction",
    "entropy",
    "eval_solve_rate",
)


def lake_run_of(lake_uri: str, runs: pl.DataFrame) -> LakeRun | None:
    """The lake's run: its earliest stage run with an iteration (None before the loop's first stage run)."""
    stages = runs.filter(pl.col("iteration").is_not_null()).sort("started_at", "run_id")
    if stages.is_empty():
        return None
    first = stages.row(0, named=True)
    return LakeRun(lake_uri, first["run_id"], first["prefect_flow_run_id"], first["started_at"])


def stage_seconds(runs: pl.DataFrame) -> dict[int, dict[str, float]]:
    """Per iteration: seconds of each stage (its completed runs added up) and the iteration's wall time, from the
    first stage's start to the last one's end."""
    done = runs.filter(
        pl.col("iteration").is_not_null() & (pl.col("status") == "completed") & pl.col("ended_at").is_not_null()
    )
    if done.is_empty():
        return {}
    done = done.with_columns(seconds=(pl.col("ended_at") - pl.col("started_at")).dt.total_microseconds() / 1e6)
    times: dict[int, dict[str, float]] = {}
    for row in done.group_by("iteration", "stage").agg(pl.col("seconds").sum()).iter_rows(named=True):
        times.setdefault(row["iteration"], {})[f"stage_seconds/{row['stage']}"] = row["seconds"]
    walls = done.group_by("iteration").agg(
        wall=(pl.col("ended_at").max() - pl.col("started_at").min()).dt.total_microseconds() / 1e6
    )
    for row in walls.iter_rows(named=True):
        times[row["iteration"]]["iteration_seconds"] = row["wall"]
    return times


def steps_after(metrics: pl.DataFrame, runs: pl.DataFrame, after: int | None) -> list[Step]:
    """The steps to log: each `iteration_metrics` row after iteration `after` (None: all), with its numeric
    metrics, its training groups' solve rate per level and its stage times; nulls and non-finite values left out."""
    rows = metrics if after is None else metrics.filter(pl.col("iteration") > after)
    times = stage_seconds(runs)
    steps = []
    for row in rows.sort("iteration").iter_rows(named=True):
        values = {name: float(row[name]) for name in METRICS if row.get(name) is not None}
        for level, rate in json.loads(row.get("solve_rate_by_level") or "{}").items():
            if rate is not None:
                values[f"solve_rate_by_level/{level}"] = float(rate)
        values.update(times.get(row["iteration"], {}))
        finite = {key: value for key, value in values.items() if math.isfinite(value)}
        stamp = int(row["created_at"].timestamp() * 1000)
        steps.append(Step(row["iteration"], stamp, finite))
    return steps


def logged_through(recorded: pl.DataFrame, tracker: str, tracker_uri: str, tracker_run_id: str) -> int | None:
    """The last iteration the lake records as logged to that tracker run (None: none yet)."""
    mine = recorded.filter(
        (pl.col("tracker") == tracker)
        & (pl.col("tracker_uri") == tracker_uri)
        & (pl.col("tracker_run_id") == tracker_run_id)
    )
    return None if mine.is_empty() else mine["last_iteration"].max()
