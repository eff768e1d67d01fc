"""The report as one self-contained HTML file: PNGs embedded as base64 data URIs, small summary tables,
inline CSS, no scripts and nothing fetched, so it can be mailed or attached as it is."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from decimal import Decimal
from html import escape

import polars as pl

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25rem 0.75rem; text-align: left; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; }
.caption { color: #555; }
.skipped { color: #8a6d3b; background: #fcf8e3; padding: 0.5rem 0.75rem; }
"""


@dataclass(frozen=True)
class Section:
    """One plot of the report: its PNG, or the note saying why it was skipped."""

    name: str
    title: str
    caption: str
    png: bytes | None
    note: str | None = None


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _percent(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def summary_rows(summary: dict) -> list[tuple[str, str]]:
    """Labelled, formatted facts of `data.summary`; facts the lake cannot give yet are left out."""
    rows = []
    if "problems" in summary:
        rows.append(
            (
                "problem bank",
                f"version {summary['bank_version']}: {summary['problems']:,} problems "
                f"({summary['eval_problems']:,} held out)",
            )
        )
    if summary.get("iterations"):
        rows.append(
            (
                "iterations",
                f"{summary['iterations']} (last: {summary['last_iteration']}), {summary['rollouts']:,} rollouts",
            )
        )
    if summary.get("latest_model_version") is not None:
        rows.append(("latest model version", f"{summary['latest_model_version']} ({summary['latest_model_kind']})"))
    for key, label in (("first_eval", "first held-out solve rate"), ("last_eval", "latest held-out solve rate")):
        if key in summary:
            evaluation = summary[key]
            rows.append(
                (
                    label,
                    f"{_percent(evaluation['solve_rate'])} (model version {evaluation['model_version']}, "
                    f"{int(evaluation['problems']):,} problems)",
                )
            )
    if summary.get("last_mean_reward") is not None:
        rows.append(("mean reward, last iteration", f"{summary['last_mean_reward']:.3f}"))
    if summary.get("last_zone_share") is not None:
        rows.append(("learning-zone share, last iteration", _percent(summary["last_zone_share"])))
    return rows


def _facts_table(rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{escape(label)}</th><td>{escape(value)}</td></tr>" for label, value in rows)
    return f"<table>{body}</table>"


def frame_table(frame: pl.DataFrame) -> str:
    """A small frame as an HTML table; floats in [0, 1] columns named *rate* or *share* as percentages."""
    head = "".join(f"<th>{escape(name)}</th>" for name in frame.columns)
    rows = []
    for row in frame.iter_rows(named=True):
        cells = []
        for name, value in row.items():
            if value is None or isinstance(value, (bool, str)):
                cells.append(f"<td>{escape('' if value is None else str(value))}</td>")
            elif isinstance(value, float) and ("rate" in name or "share" in name):
                cells.append(f'<td class="number">{_percent(value)}</td>')
            elif isinstance(value, (int, Decimal)) and value == int(value):  # DuckDB sums are decimals
                cells.append(f'<td class="number">{int(value):,}</td>')
            elif isinstance(value, (float, Decimal)):
                cells.append(f'<td class="number">{float(value):.4g}</td>')
            else:
                cells.append(f"<td>{escape(str(value))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _section(section: Section) -> str:
    parts = [
        f'<section id="{escape(section.name)}">',
        f"<h2>{escape(section.title)}</h2>",
        f'<p class="caption">{escape(section.caption)}</p>',
    ]
    if section.png is None:
        parts.append(f'<p class="skipped">Skipped: {escape(section.note or "no data")}.</p>')
    else:
        parts.append(f'<img src="{data_uri(section.png)}" alt="{escape(section.title)}">')
        parts.append(f'<p class="caption">Also written as <code>{escape(section.name)}.png</code>.</p>')
    parts.append("</section>")
    return "\n".join(parts)


def render(
    heading: str, facts: list[tuple[str, str]], sections: list[Section], tables: list[tuple[str, pl.DataFrame]] = ()
) -> str:
    """The whole HTML document."""
    contents = "".join(
        f'<li><a href="#{escape(s.name)}">{escape(s.title)}</a>{" (skipped)" if s.png is None else ""}</li>'
        for s in sections
    )
    extra = "".join(f"<h3>{escape(title)}</h3>{frame_table(frame)}" for title, frame in tables if not frame.is_empty())
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            f"<title>{escape(heading)}</title>",
            f"<style>{STYLE}</style>",
            "</head>",
            "<body>",
            f"<h1>{escape(heading)}</h1>",
            _facts_table(facts),
            extra,
            f"<ul>{contents}</ul>",
            *(_section(s) for s in sections),
            "</body>",
            "</html>",
            "",
        ]
    )
