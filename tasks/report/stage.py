"""The report stage: read a consistent snapshot of the lake, draw every plot, write the HTML and the PNGs.

The snapshot is a lake version (`storage.catalog.open_catalog(lake, as_of)`): a loop still running
beside the report cannot make one plot show an iteration another plot lacks. Plots whose frames are
empty are skipped with a note, and any PNG an earlier report left for them is removed, so the folder
always matches its `report.html`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from storage.arrow_reads import arrow_dataset
from storage.catalog import open_catalog
from storage.lake import Lake
from tasks.report import data
from tasks.report.html import Section, render, summary_rows
from tasks.report.plots import PLOTS, figure, overview, png

HTML_NAME = "report.html"
OVERVIEW_NAME = "overview"


@dataclass(frozen=True)
class Report:
    html: str
    sections: list[Section]
    overview: bytes


def require_rollouts(lake: Lake) -> None:
    """A report needs at least one iteration's rollouts."""
    table = lake.table("rollouts")
    if table is None or arrow_dataset(table).count_rows() == 0:
        raise ValueError(f"the lake at {lake.uri} has no rollouts: run `rlvr run` (or `rlvr iterate`) first")


def build_report(lake: Lake, as_of: int | None = None) -> Report:
    """Every plot, the overview figure and the HTML, from the lake as of lake version `as_of` (default: now)."""
    con = open_catalog(lake, as_of)
    frames = data.gather(con)
    sections = []
    for plot in PLOTS:
        frame = frames[plot.data]
        image = None if frame.is_empty() else png(figure(plot, frame))
        sections.append(Section(plot.name, plot.title, plot.caption, image, None if image else plot.missing))
    where = lake.uri if as_of is None else f"{lake.uri} at lake version {as_of}"
    facts = [("lake", where), *summary_rows(data.summary(con))]
    evaluations = frames["eval_solve_rate_by_level"]
    tables = (
        []
        if evaluations.is_empty()
        else [
            (
                f"Held-out solve rate per level, model version {evaluations['model_version'].max()}",
                evaluations.filter(pl.col("model_version") == pl.col("model_version").max()),
            )
        ]
    )
    html = render("RLVR report", facts, sections, tables)
    return Report(html=html, sections=sections, overview=png(overview(frames, f"RLVR report: {where}")))


def write_report(report: Report, out_dir: str | Path) -> dict:
    """Write `report.html`, one PNG per drawn plot and `overview.png` into `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots, skipped = {}, {}
    for section in report.sections:
        path = out / f"{section.name}.png"
        if section.png is None:
            path.unlink(missing_ok=True)
            skipped[section.name] = section.note
        else:
            path.write_bytes(section.png)
            plots[section.name] = str(path)
    (out / f"{OVERVIEW_NAME}.png").write_bytes(report.overview)
    (out / HTML_NAME).write_text(report.html, encoding="utf-8")
    return {
        "html": str(out / HTML_NAME),
        "overview": str(out / f"{OVERVIEW_NAME}.png"),
        "plots": plots,
        "skipped": skipped,
    }
