"""The two trackers `rlvr track` logs to, and its pass: read the lake, log what a tracker lacks, record it
(tracking.py says what, from frames, and why it is safe to repeat).

MLflow is spoken to over its documented REST API (`/api/2.0/mlflow/...`, artifacts through the server's
`mlflow-artifacts` proxy) with httpx, which the platform already has: no MLflow client in this process, so
nothing of MLflow's own pins meets the platform's. TensorBoard event files are written by
`torch.utils.tensorboard`, which needs the `tensorboard` package (the `tracking` extra).
"""

from __future__ import annotations

from datetime import UTC, datetime
from io import BytesIO
from pathlib import Path
from urllib.parse import quote, urlparse

import httpx
import polars as pl

from storage.lake import Lake
from tasks.interop.tracking import (
    LakeRun,
    MlflowConfig,
    Step,
    TensorBoardConfig,
    TrackingConfig,
    TrackingError,
    lake_run_of,
    logged_through,
    steps_after,
)
from tasks.report.stage import OVERVIEW_NAME, build_report

BATCH = 1000  # MLflow's limit of metrics in one runs/log-batch request


class MlflowTracker:
    """A run in an MLflow experiment, found by its `rlvr.lake` and `rlvr.run_id` tags or created with them."""

    kind = "mlflow"

    def __init__(self, config: MlflowConfig):
        self.uri = config.tracking_uri.rstrip("/")
        self.experiment = config.experiment
        self.http = httpx.Client(base_url=self.uri, timeout=config.timeout_s)
        self.experiment_id: str | None = None

    def call(self, method: str, path: str, missing_ok: bool = False, **kwargs) -> dict | None:
        """One REST call; None for a resource that does not exist when `missing_ok`, else a TrackingError."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            raise TrackingError(f"MLflow at {self.uri}: {path}: {error}") from None
        if response.is_success:
            return response.json() if response.content else {}
        try:
            answer = response.json()
        except ValueError:
            answer = {"message": response.text[:300]}
        if missing_ok and answer.get("error_code") == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise TrackingError(f"MLflow at {self.uri}: {path}: HTTP {response.status_code}: {answer.get('message')}")

    def api(self, method: str, name: str, **kwargs) -> dict | None:
        return self.call(method, f"/api/2.0/mlflow/{name}", **kwargs)

    def open(self, lake_run: LakeRun) -> str:
        found = self.api("GET", "experiments/get-by-name", missing_ok=True, params={"experiment_name": self.experiment})
        if found is None:
            self.api("POST", "experiments/create", json={"name": self.experiment})
            found = self.api("GET", "experiments/get-by-name", params={"experiment_name": self.experiment})
        self.experiment_id = found["experiment"]["experiment_id"]
        tags = lake_run.tags()
        query = " and ".join(f"tags.`{key}` = '{tags[key]}'" for key in ("rlvr.lake", "rlvr.run_id"))
        runs = self.api(
            "POST", "runs/search", json={"experiment_ids": [self.experiment_id], "filter": query, "max_results": 1}
        ).get("runs", [])
        if runs:
            return runs[0]["info"]["run_id"]
        created = self.api(
            "POST",
            "runs/create",
            json={
                "experiment_id": self.experiment_id,
                "run_name": f"rlvr {lake_run.run_id}",
                "start_time": int(lake_run.started_at.timestamp() * 1000),
                "tags": [{"key": key, "value": value} for key, value in tags.items()],
            },
        )
        return created["run"]["info"]["run_id"]

    def logged_through(self, recorded: pl.DataFrame, run_id: str) -> int | None:
        return logged_through(recorded, self.kind, self.uri, run_id)

    def link(self, run_id: str) -> str:
        return f"{self.uri}/#/experiments/{self.experiment_id}/runs/{run_id}"

    def log(self, run_id: str, steps: list[Step], lake_run: LakeRun) -> None:
        points = [
            {"key": key, "value": value, "timestamp": step.timestamp_ms, "step": step.iteration}
            for step in steps
            for key, value in sorted(step.values.items())
        ]
        for start in range(0, len(points), BATCH):
            self.api("POST", "runs/log-batch", json={"run_id": run_id, "metrics": points[start : start + BATCH]})

    def log_plots(self, run_id: str, plots: dict[str, bytes], last: Step) -> int:
        """Upload each plot as `report/<name>.png` (an upload replaces the file); 0 when the server does not proxy
        artifacts (its runs' artifact URI is not an `mlflow-artifacts:` one)."""
        info = self.api("GET", "runs/get", params={"run_id": run_id})["run"]["info"]
        where = urlparse(info["artifact_uri"])
        if where.scheme != "mlflow-artifacts":
            return 0
        for name, png in plots.items():
            path = quote(f"{where.path.strip('/')}/report/{name}.png")
            self.call(
                "PUT", f"/api/2.0/mlflow-artifacts/artifacts/{path}", content=png, headers={"Content-Type": "image/png"}
            )
        return len(plots)

    def finish(self, run_id: str, last: Step) -> None:
        """FINISHED, ending at the last logged iteration's time; a later pass logs into it all the same."""
        self.api("POST", "runs/update", json={"run_id": run_id, "status": "FINISHED", "end_time": last.timestamp_ms})

    def close(self) -> None:
        self.http.close()


class TensorBoardTracker:
    """A run folder `<log_dir>/<lake run id>` of event files, one more file per pass."""

    kind = "tensorboard"
    experiment = None

    def __init__(self, config: TensorBoardConfig):
        self.root = Path(config.log_dir).resolve()
        self.uri = str(self.root)

    def open(self, lake_run: LakeRun) -> str:
        return lake_run.run_id

    def logged_through(self, recorded: pl.DataFrame, run_id: str) -> int | None:
        """What the lake records, while the run's folder is there (a removed folder is written again)."""
        return logged_through(recorded, self.kind, self.uri, run_id) if (self.root / run_id).is_dir() else None

    def link(self, run_id: str) -> str:
        return str(self.root / run_id)

    def log(self, run_id: str, steps: list[Step], lake_run: LakeRun) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise TrackingError(
                "TensorBoard event files need the tensorboard package: pip install -e '.[tracking]'"
            ) from None
        # purge_step: TensorBoard hides what an interrupted pass wrote from this step on (it is written again here)
        with SummaryWriter(self.link(run_id), purge_step=steps[0].iteration) as writer:
            writer.add_text(
                "rlvr",
                " ".join(f"{key}={value}" for key, value in lake_run.tags().items()),
                steps[0].iteration,
                walltime=steps[0].timestamp_ms / 1000,
            )  # the run it stands for
            for step in steps:
                for key, value in sorted(step.values.items()):
                    writer.add_scalar(key, value, step.iteration, walltime=step.timestamp_ms / 1000)

    def log_plots(self, run_id: str, plots: dict[str, bytes], last: Step) -> int:
        """Each plot as an image `report/<name>` at the pass's last step."""
        import numpy as np
        from PIL import Image
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(self.link(run_id)) as writer:
            for name, png in plots.items():
                pixels = np.asarray(Image.open(BytesIO(png)).convert("RGB"))  # [H, W, 3]
                writer.add_image(
                    f"report/{name}", pixels, last.iteration, walltime=last.timestamp_ms / 1000, dataformats="HWC"
                )
        return len(plots)

    def finish(self, run_id: str, last: Step) -> None:
        pass  # an event file is complete when its writer closes

    def close(self) -> None:
        pass


def trackers(config: TrackingConfig) -> list[MlflowTracker | TensorBoardTracker]:
    """The enabled trackers, MLflow first."""
    enabled = [(config.mlflow, MlflowTracker), (config.tensorboard, TensorBoardTracker)]
    return [make(section) for section, make in enabled if section.enabled]


# ---- a pass ----------------------------------------------------------------------------------------------------


def report_plots(lake: Lake) -> dict[str, bytes]:
    """The report's plots as PNGs by name (its overview too), drawn from the lake as it is."""

    report = build_report(lake)
    plots = {section.name: section.png for section in report.sections if section.png is not None}
    return {**plots, OVERVIEW_NAME: report.overview}


def track(lake: Lake, config: TrackingConfig) -> list[dict]:
    """One pass: log every iteration each enabled tracker does not have yet, then record what was logged in
    `tracked_runs` (one row per tracker that logged anything). Returns a row per tracker, logged or not."""
    if not config.enabled:
        raise ValueError("tracking is off: enable tracking.mlflow or tracking.tensorboard in the config")
    metrics = lake.read("iteration_metrics")
    runs = lake.read(
        "runs", columns=["run_id", "stage", "iteration", "prefect_flow_run_id", "started_at", "ended_at", "status"]
    )
    lake_run = lake_run_of(lake.uri, runs)
    if metrics.is_empty() or lake_run is None:
        return []
    recorded = lake.read("tracked_runs")
    drawn: dict[str, bytes] = {}
    results = []
    for tracker in trackers(config):
        try:
            tracker_run_id = tracker.open(lake_run)
            steps = steps_after(metrics, runs, tracker.logged_through(recorded, tracker_run_id))
            row = {
                "tracker": tracker.kind,
                "tracker_uri": tracker.uri,
                "tracker_run_id": tracker_run_id,
                "experiment": tracker.experiment,
                "link": tracker.link(tracker_run_id),
                "lake_uri": lake.uri,
                "lake_run_id": lake_run.run_id,
                "first_iteration": steps[0].iteration if steps else None,
                "last_iteration": steps[-1].iteration if steps else None,
                "plots": None,
            }
            if steps:
                tracker.log(tracker_run_id, steps, lake_run)
                if config.plots:
                    drawn = drawn or report_plots(lake)  # drawn once a pass, for every tracker
                    row["plots"] = tracker.log_plots(tracker_run_id, drawn, steps[-1])
                tracker.finish(tracker_run_id, steps[-1])
        finally:
            tracker.close()
        results.append(row)
    logged = [row for row in results if row["last_iteration"] is not None]
    if logged:  # recorded only once every tracker has its steps
        with lake.run("track", "track", config.model_dump(mode="json")) as run:
            now = datetime.now(UTC)
            lake.append(
                "tracked_runs",
                pl.DataFrame([{**row, "created_at": now} for row in logged], schema_overrides={"plots": pl.Int64}),
                run,
            )
        for row in logged:
            row["run_id"] = run.run_id
    return results
