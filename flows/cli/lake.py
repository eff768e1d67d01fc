"""`rlvr sql`, `rlvr lineage …`, `rlvr doctor` and `rlvr lake maintain`: reading the lake (never importing Prefect),
checking it and keeping it in shape."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from flows.cli.common import FormatOption, LakeOption, fail
from flows.display import TableFormat, console, errors, print_lineage, show_table, use_format, write_result

app = typer.Typer()


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="SQL over the lake's tables (problems, runs, ...)")],
    format: FormatOption = TableFormat.table,
    as_of: Annotated[Optional[str], typer.Option("--as-of", help="lake version (integer) or ISO timestamp")] = None,
    lake: LakeOption = None,
) -> None:
    """Run SQL over every lake table with DuckDB: queries only, over the lake's committed rows."""
    import duckdb

    from storage.catalog import open_lake_catalog
    from storage.lake import Lake, LakeError

    use_format(format)
    with_interop_tables()
    try:
        catalog = open_lake_catalog(Lake.open(lake), as_of, query)
        for why in catalog.damaged.values():
            errors.print(f"[yellow]warning:[/yellow] {escape(why)}", highlight=False, soft_wrap=True)
        result = catalog.sql(query)
        arrow = result.to_arrow_table() if result is not None else None
    except duckdb.Error as error:
        fail(str(error))
    except (LakeError, ValueError) as error:
        fail(str(error))
    if arrow is not None:
        write_result(arrow)


lake_app = typer.Typer(help="The lake's upkeep.", no_args_is_help=True)


@lake_app.command("maintain")
def lake_maintain(
    config: Annotated[
        Optional[Path], typer.Option(help="YAML with a `maintenance:` section (MaintenanceConfig)")
    ] = None,
    retention_hours: Annotated[
        Optional[float],
        typer.Option(min=0, help="keep time travel this far back; older versions' files are vacuumed [default: 168]"),
    ] = None,
    table: Annotated[Optional[list[str]], typer.Option(help="only this table (repeatable)")] = None,
    lake: LakeOption = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """Compact each table's small files, checkpoint its log and vacuum files past the retention; safe beside a
    running loop (a compaction lands only where no other writer committed meanwhile)."""
    use_format(format)
    import polars as pl

    from storage.config import load_yaml_config
    from storage.lake import Lake, LakeError, LeaseHeld
    from storage.maintenance import MaintenanceConfig, maintain

    with_interop_tables()
    try:
        settings = load_yaml_config(config, MaintenanceConfig, section="maintenance") if config else MaintenanceConfig()
        updates = {"retention_hours": retention_hours, "tables": table or None}
        settings = settings.model_copy(update={key: value for key, value in updates.items() if value is not None})
        results = maintain(Lake.open(lake), settings)
    except (ValueError, LakeError, LeaseHeld) as error:
        fail(str(error), 2)
    show_table(
        pl.DataFrame(
            [
                {
                    "table": r.table,
                    "files": f"{r.files_before} → {r.files_after}",
                    "compaction": r.compacted,
                    "checkpoint": r.checkpoint,
                    "vacuumed": r.vacuumed_files,
                    "log_files": r.log_files,
                    "notes": "; ".join(r.notes),
                }
                for r in results
            ]
        ),
        title=f"maintained {len(results)} tables (retention {settings.retention_hours:g} h)",
        part="maintained",
    )


lineage_app = typer.Typer(help="Where a row came from.", no_args_is_help=True)


@lineage_app.command("problem")
def lineage_problem(problem_id: str, lake: LakeOption = None) -> None:
    """Where a problem came from: file and line or generator and seed, bank version, run."""
    from storage.lake import Lake
    from storage.lineage import problem_lineage

    lineage = problem_lineage(Lake.open(lake), problem_id)
    if lineage is None:
        fail(f"no problem {problem_id} in the bank or among dropped problems")
    print_lineage(lineage)


@lineage_app.command("model-version")
def lineage_model_version(version: int, lake: LakeOption = None) -> None:
    """Walk back from a model version: its parents, the batches each consumed, their rollouts, problems and runs."""
    from storage.lake import Lake
    from storage.lineage import model_version_lineage

    try:
        chain = model_version_lineage(Lake.open(lake), version)
    except ValueError as error:
        fail(str(error))
    console.print(f"[bold]lineage of model version {version}[/bold]")
    for entry in chain:
        if entry.get("missing"):
            console.print(f"version {entry['model_version']}: not in the registry")
            continue
        parent = "no parent" if entry["parent_version"] is None else f"parent {entry['parent_version']}"
        trained = f", iteration {entry['iteration']}" if entry["iteration"] is not None else ""
        console.print(f"version {entry['model_version']} ({entry['kind']}, {parent}{trained}), run {entry['run_id']}")
        console.print(f"  checkpoint    {entry['checkpoint_uri']}")
        for batch_id in entry.get("replaced_batches", []):
            console.print(
                f"  batch         {batch_id}: no longer in `batches` (the iteration's advantages were "
                "re-run since; `rlvr sql --as-of` shows it as it was)"
            )
        for batch_id in [] if entry.get("replaced_batches") else entry["batch_ids"] or []:
            console.print(
                f"  batch         {batch_id}: {entry.get('rollouts', 0)} rollouts of "
                f"{entry.get('problems', 0)} problems, sampled by version(s) "
                f"{', '.join(map(str, entry.get('sampled_by', [])))}, bank version(s) "
                f"{', '.join(map(str, entry.get('bank_versions', [])))}"
            )
        if entry.get("runs"):
            console.print(f"  stage runs    {', '.join(entry['runs'])}")


@lineage_app.command("tracking")
def lineage_tracking(lake: LakeOption = None, format: FormatOption = TableFormat.table) -> None:
    """The tracker runs (MLflow, TensorBoard) the lake's run is logged to by `rlvr track`, and how far."""
    use_format(format)
    import polars as pl

    from storage.lake import Lake

    with_interop_tables()
    recorded = Lake.open(lake).read("tracked_runs")
    if recorded.is_empty():
        fail("no tracker run recorded: `rlvr track --config configs/tracking.yaml` logs the lake's run to one")
    keys = ["tracker", "tracker_run_id", "experiment", "lake_run_id", "tracker_uri", "link"]
    runs = recorded.group_by(keys).agg(
        pl.col("first_iteration").min(),
        pl.col("last_iteration").max(),
        pl.len().alias("passes"),
        pl.col("created_at").max().dt.strftime("%Y-%m-%d %H:%M:%S").alias("last_pass"),
    )
    show_table(
        runs.sort("tracker", "last_pass").select(
            *keys[:4], "first_iteration", "last_iteration", "passes", "last_pass", "link"
        ),
        title="tracker runs of the lake's run (step = iteration)",
        max_width=300,
    )


def with_interop_tables() -> None:
    """Tables registered beside the loop (`tasks/interop`: `tracked_runs`), so reading the lake sees them too."""
    import tasks.interop.tracking  # noqa: F401  (registers its table)


@app.command()
def doctor(
    lake: LakeOption = None,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="mark dead runs abandoned, delete rows of runs that never "
            "completed and unnamed checkpoint folders, take over dead leases, vacuum "
            "unreferenced files; never deletes committed data",
        ),
    ] = False,
    format: FormatOption = TableFormat.table,
) -> None:
    """Check every table's log and files, runs, checkpoints and leases; say what each finding means."""
    use_format(format)
    import polars as pl

    from storage.doctor import diagnose, healthy
    from storage.lake import Lake

    with_interop_tables()
    opened = Lake.open(lake)
    findings = diagnose(opened, repair)
    table = pl.DataFrame(
        [
            {
                "severity": f.severity,
                "subject": f.subject,
                "finding": f.what,
                "meaning": f.meaning,
                "repair": ("done: " if f.repaired else "") + (f.repair or "needs a human")
                if f.severity != "info" or f.repair
                else "",
            }
            for f in findings
        ]
    )
    show_table(table, title=f"rlvr doctor: {escape(opened.uri)}", max_width=600, show_lines=True)
    if healthy(findings):
        console.print(
            "the lake is healthy" + (" (after the repairs above)" if any(f.repaired for f in findings) else "")
        )
        return
    fail("the lake needs attention (see above)" + ("" if repair else "; `rlvr doctor --repair` fixes what it can"))
