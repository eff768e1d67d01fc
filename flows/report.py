"""The report flow: an HTML report with plots of a lake's RL run, and the same plots as PNG files
(`tasks/report/stage.py` does the work). Deployable on a schedule like the other flows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from storage.lake import Lake
from tasks.report.stage import build_report, require_rollouts, write_report

build_task = task(build_report, name="build-report", cache_policy=NO_CACHE)
write_task = task(write_report, name="write-report", cache_policy=NO_CACHE)


@flow(name="report", log_prints=True)
def report(out_dir: str, lake_uri: str | None = None) -> dict[str, Any]:
    """Write `out_dir/report.html` and `out_dir/<plot>.png` from the lake as it is when the flow starts."""
    lake = Lake.open(lake_uri)
    require_rollouts(lake)
    as_of = lake.runs_version()  # the snapshot: this run's own row comes after it
    out = str(Path(out_dir).resolve())
    with lake.run("report", "report", {"out_dir": out, "as_of": as_of}, prefect_flow_run_id=flow_run.id) as run:
        written = write_task(build_task(lake, as_of), out)
    publish_report(written, lake.uri, as_of)
    print(f"report of {lake.uri} (lake version {as_of}): {written['html']}")
    return {**written, "run_id": run.run_id, "lake_version": as_of}


def publish_report(written: dict[str, Any], lake_uri: str, as_of: int | None) -> None:
    """A markdown artifact that links the report and its PNGs, and names the plots that were skipped."""
    lines = [
        f"# RLVR report of {lake_uri}",
        f"- lake version {as_of}",
        f"- [report.html]({Path(written['html']).as_uri()})",
        f"- [overview.png]({Path(written['overview']).as_uri()})",
    ]
    lines += [f"- [{name}.png]({Path(path).as_uri()})" for name, path in written["plots"].items()]
    lines += [f"- skipped {name}: {note}" for name, note in written["skipped"].items()]
    create_markdown_artifact(key="rlvr-report", markdown="\n".join(lines), description=f"report of {lake_uri}")
