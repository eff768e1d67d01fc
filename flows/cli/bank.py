"""`rlvr curate` and `rlvr bank …`: curating bank versions, inspecting and sampling the bank."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from flows.cli.common import FormatOption, LakeOption, fail, fail_on_bad_request, mix_from_options, prefect_defaults
from flows.display import TableFormat, console, show_table, use_format

app = typer.Typer()


bank_app = typer.Typer(help="Inspect and sample the problem bank.", no_args_is_help=True)


@app.command()
def curate(
    config: Annotated[
        Optional[Path], typer.Option(help="curation config (YAML; the `bank:` section if present)")
    ] = None,
    source: Annotated[list[str], typer.Option("--source", help="KIND:PATH_OR_NAME[:COUNT], repeatable")] = [],
    eval_source: Annotated[
        list[str], typer.Option("--eval-source", help="like --source, as a held-out evaluation set")
    ] = [],
    bank_version: Annotated[Optional[int], typer.Option(help="re-curate this bank version, replacing it")] = None,
    force: Annotated[bool, typer.Option(help="re-curate a version even when later versions depend on it")] = False,
    lake: LakeOption = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """Curate a new bank version from files and procedural sources."""
    use_format(format)
    from tasks.curation.inputs import curation_config_from

    try:
        curation = curation_config_from(config, source, eval_source, bank_version)
    except ValueError as error:
        fail(str(error), 2)
    curate_and_print(curation, lake, force)


def curate_and_print(curation, lake: str | None, force: bool = False) -> None:
    """Check the inputs, then run the curation flow and print what it did (`rlvr curate`, and `rlvr run` before its loop)."""
    from tasks.curation.readers import SourceReadError
    from tasks.curation.stage import preflight

    try:
        preflight(curation)
    except (SourceReadError, ValueError) as error:
        fail(str(error))
    prefect_defaults()
    from flows.curation import curate_bank

    try:
        result = curate_bank(curation.model_dump(mode="json"), lake, force)
    except (SourceReadError, ValueError) as error:
        fail(str(error))
    _print_curation(result)


def _print_curation(result: dict) -> None:
    import polars as pl

    show_table(
        pl.DataFrame(result["sources"]),
        title=f"bank version {result['bank_version']} (run {result['run_id']})",
        part="curation",
    )  # `rlvr run` may print the loop's table after it
    totals = pl.DataFrame(result["sources"]).select(pl.exclude("source").sum()).row(0, named=True)
    console.print(
        f"kept {totals['kept']:,} of {totals['loaded']:,} rows: {totals['quarantined']:,} quarantined, "
        f"{totals['exact_dup']:,} exact and {totals['near_dup']:,} near duplicates, "
        f"{totals['contaminated']:,} contaminated. Lake version {result['lake_version']}."
    )


@bank_app.command("stats")
def bank_stats_command(
    bank_version: Annotated[Optional[int], typer.Option(help="the bank as of this version; default latest")] = None,
    lake: LakeOption = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """Counts by source, domain, level and split, and quarantine and drop reasons."""
    use_format(format)
    from storage.lake import Lake

    print_bank_stats(Lake.open(lake), bank_version)


def print_bank_stats(lake, bank_version: int | None) -> None:
    """The bank's counts as tables; an empty bank is an error that says to curate."""
    from tasks.curation.stage import bank_stats

    stats = bank_stats(lake, bank_version)
    if all(frame.is_empty() for frame in stats.values()):
        fail(f"the bank at {lake.uri} is empty: run `rlvr curate` first")
    for title, frame in stats.items():
        show_table(frame, title=title, part=title)


@bank_app.command("sample")
def bank_sample(
    n: Annotated[int, typer.Option("--n", min=1, help="how many problems")] = 100,
    seed: Annotated[int, typer.Option(help="seed of the draw")] = 0,
    levels: Annotated[str, typer.Option(help="level weights 1,2,3,4 in percent")] = "20,45,30,5",
    domain_weights: Annotated[Optional[str], typer.Option(help="e.g. math=0.7,code=0.2,logic=0.1")] = None,
    split: Annotated[str, typer.Option(help="train or eval")] = "train",
    bank_version: Annotated[Optional[int], typer.Option(help="the bank as of this version")] = None,
    out: Annotated[Optional[Path], typer.Option(help="write the draw to a .jsonl or .parquet file")] = None,
    lake: LakeOption = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """Draw a seeded training mix by level and domain."""
    use_format(format)
    from storage.lake import Lake
    from tasks.curation.stage import draw_training_mix

    try:
        drawn = draw_training_mix(
            Lake.open(lake), n, mix_from_options(levels, domain_weights, split, bank_version, seed)
        )
    except ValueError as error:
        fail_on_bad_request(error)
    summary = drawn.group_by("level", "domain").len("drawn").sort("level", "domain")
    show_table(summary, title=f"{drawn.height} problems drawn (seed {seed})", part="drawn")
    if out is not None:
        writers = {".parquet": drawn.write_parquet, ".jsonl": drawn.write_ndjson, ".csv": drawn.write_csv}
        if out.suffix not in writers:
            fail(f"--out {out}: use a .jsonl, .parquet or .csv file", 2)
        writers[out.suffix](out)
        console.print(f"wrote {out}")
    else:
        show_table(
            drawn.select("problem_id", "level", "domain", "source", "prompt").head(10),
            title=f"first {min(10, drawn.height)}",
            part="first",
        )
