"""`rlvr report`: an HTML report with plots, and the same plots as PNG files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from flows.cli.common import LakeOption, fail, prefect_defaults
from flows.display import console

app = typer.Typer()


@app.command()
def report(
    out: Annotated[Path, typer.Option("--out", help="folder for report.html and the PNGs (created if needed)")] = Path(
        "report"
    ),
    lake: LakeOption = None,
) -> None:
    """An HTML report (solve rate per level over model versions, reward and length distributions, learning-zone
    share, filter rates) and the same plots as PNG files."""
    from storage.lake import Lake
    from tasks.report.stage import require_rollouts

    try:
        require_rollouts(Lake.open(lake))  # before Prefect starts: an empty lake is one line, not a failed run
    except ValueError as error:
        fail(str(error))
    prefect_defaults()
    from flows.report import report as report_flow

    try:
        result = report_flow(str(out), lake)
    except ValueError as error:
        fail(str(error))
    console.print(
        f"wrote {escape(result['html'])} (lake version {result['lake_version']}, run {result['run_id']})",
        highlight=False,
        soft_wrap=True,
    )
    for path in [result["overview"], *result["plots"].values()]:
        console.print(f"  {escape(path)}", highlight=False, soft_wrap=True)
    for name, note in result["skipped"].items():
        console.print(f"  [dim]skipped {name}: {escape(note)}[/dim]", highlight=False, soft_wrap=True)
