"""`rlvr export`: the bank or a kept batch as the dataset of a trainer teams already use (TRL, verl, OpenRLHF);
`rlvr track`: the loop's metrics and plots logged to MLflow and TensorBoard."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape

from flows.cli.common import FormatOption, LakeOption, fail
from flows.display import TableFormat, console, errors, show_table, use_format

if TYPE_CHECKING:
    from storage.lake import Lake
    from tasks.interop.tracking import TrackingConfig

app = typer.Typer()


class Trainer(str, Enum):
    verl = "verl"
    trl = "trl"
    openrlhf = "openrlhf"


@app.command("export")
def export(
    to: Annotated[Trainer, typer.Option(help="verl: a parquet file; trl: a `datasets` folder (load_from_disk); "
                                        "openrlhf: a jsonl file (--data.input_key input --data.label_key label)")],
    out: Annotated[Path, typer.Option(help="where to write it (never overwritten)")],
    batch: Annotated[Optional[int], typer.Option(help="the kept batch of this iteration instead of the bank")] = None,
    n: Annotated[Optional[int], typer.Option("--n", min=1, help="draw this many problems by the mix (default: the "
                                             "whole split)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the draw")] = 0,
    levels: Annotated[str, typer.Option(help="level weights 1,2,3,4 in percent (with --n)")] = "20,45,30,5",
    domain_weights: Annotated[Optional[str], typer.Option(help="e.g. math=0.7,code=0.2,logic=0.1 (with --n)")] = None,
    split: Annotated[str, typer.Option(help="train or eval")] = "train",
    bank_version: Annotated[Optional[int], typer.Option(help="the bank as of this version")] = None,
    chat: Annotated[bool, typer.Option(help="trl: the prompt as chat messages (else its text)")] = True,
    lake: LakeOption = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """Write the bank (or a draw from it, or an iteration's kept batch) as a trainer's dataset; every row carries
    its problem_id, bank version, level and verifier back to the lake."""
    use_format(format)
    from storage.lake import Lake
    from tasks.curation.config import MixConfig
    from tasks.curation.inputs import parse_weights
    from tasks.interop.export import bank_selection, batch_problems, write_export

    try:
        opened = Lake.open(lake)
        if batch is not None:
            problems = batch_problems(opened, batch)
        else:
            mix = MixConfig(level_weights={i + 1: float(w) for i, w in enumerate(levels.split(","))},
                            domain_weights=parse_weights(domain_weights), split=split, bank_version=bank_version,
                            seed=seed)
            problems = bank_selection(opened, mix, n)
        written = write_export(problems, to.value, out, chat)
    except ValueError as error:
        fail(str(error).splitlines()[0] if "validation error" not in str(error) else str(error), 2)
    show_table(problems.group_by("domain", "level").len("rows").sort("domain", "level"),
               title=f"{problems.height} problems exported for {to.value}", part="exported")
    console.print(f"wrote {written}")


@app.command("track")
def track(
    config: Annotated[Path, typer.Option(help="YAML with a `tracking:` section (mlflow, tensorboard, plots)")]
        = Path("configs/tracking.yaml"),
    follow: Annotated[bool, typer.Option("--follow", help="keep going: a pass every --interval seconds until "
                                         "interrupted (Ctrl-C), beside a loop that is running")] = False,
    interval: Annotated[float, typer.Option(min=0.1, help="seconds between passes with --follow")] = 30.0,
    lake: LakeOption = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """Log the loop's iteration metrics, stage times and the report's plots to MLflow and TensorBoard (step =
    iteration), each iteration once; what went where is recorded in `tracked_runs` (`rlvr lineage tracking`)."""
    use_format(format)
    import time

    from storage.lake import Lake
    from tasks.config import load_yaml_config
    from tasks.interop.tracking import TrackingConfig

    try:
        settings = load_yaml_config(config, TrackingConfig, section="tracking")
        if not settings.enabled:
            fail(f"{config}: tracking is off (enable tracking.mlflow or tracking.tensorboard)", 2)
        opened = Lake.open(lake)
    except (ValueError, OSError) as error:
        fail(str(error), 2)
    try:
        while True:
            _track_once(opened, settings, follow, interval)
            if not follow:
                return
            time.sleep(interval)
    except KeyboardInterrupt:                         # how --follow ends; a pass cut short is logged again next time
        return


def _track_once(opened: "Lake", settings: "TrackingConfig", follow: bool, interval: float) -> None:
    """One pass, shown; with --follow a tracker that refuses is a warning, and the next pass tries again."""
    from tasks.interop.trackers import track as track_pass
    from tasks.interop.tracking import TrackingError

    try:
        _show_pass(track_pass(opened, settings))
    except TrackingError as error:
        if not follow:
            fail(str(error))
        errors.print(f"[yellow]warning:[/yellow] {escape(str(error))} (trying again in {interval:g} s)",
                     highlight=False, soft_wrap=True)


def _show_pass(results: list[dict]) -> None:
    import polars as pl

    if not results:
        console.print("nothing to track yet: the lake holds no iteration (`rlvr run` writes them)")
        return
    table = pl.DataFrame([{"tracker": row["tracker"], "run": row["tracker_run_id"], "logged": "up to date"
                           if row["first_iteration"] is None else f"iterations {row['first_iteration']}-"
                           f"{row['last_iteration']}", "plots": row["plots"], "where": row["link"]}
                          for row in results])
    show_table(table, title=f"tracked: lake run {results[0]['lake_run_id']}", max_width=200, part="tracked")
