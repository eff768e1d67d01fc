"""Rendering results for people: rich tables on the terminal, CSV or JSON for programs."""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from datetime import date, datetime
from enum import Enum
from typing import Any

import polars as pl
import pyarrow as pa
from rich.console import Console
from rich.table import Table

# Piped output is not cut to Rich's fallback of 80 columns (a table would lose its last columns): 200 unless
# COLUMNS says otherwise.
PIPED_WIDTH = 200
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else PIPED_WIDTH)
errors = Console(stderr=True)


class TableFormat(str, Enum):
    """How a command prints its tables: for people, or CSV / JSON lines for programs."""

    table = "table"
    csv = "csv"
    json = "json"


_output = {"format": TableFormat.table, "tables": 0}


def use_format(fmt: TableFormat | str = TableFormat.table) -> None:
    """Set how this command prints tables. With csv or json stdout carries only the tables' rows, and what
    is said for people (titles, notes, progress) goes to stderr, so `rlvr … --format csv > out.csv` holds data."""
    _output["format"], _output["tables"] = TableFormat(fmt), 0
    console.stderr = _output["format"] is not TableFormat.table


def show_table(
    frame: pl.DataFrame | pa.Table,
    title: str | None = None,
    part: str | None = None,
    max_width: int = 80,
    show_lines: bool = False,
) -> None:
    """Print a table in this command's format. `part` names it where a command prints several: in JSON each
    row then carries `"table": part`, in CSV the table is headed by a `# part` line (tables apart by a blank line)."""
    arrow = frame.to_arrow() if isinstance(frame, pl.DataFrame) else frame
    fmt = _output["format"]
    if fmt is TableFormat.table:
        console.print(frame_table(arrow, title, max_width, show_lines))
        return
    if title:
        console.print(f"[dim]{title}[/dim]")  # to stderr: see use_format
    if fmt is TableFormat.csv:
        if _output["tables"]:
            sys.stdout.write("\n")
        if part:
            sys.stdout.write(f"# {part}\n")
    _output["tables"] += 1
    _write_rows(arrow, fmt, part)


def frame_table(
    frame: pl.DataFrame | pa.Table, title: str | None = None, max_width: int = 80, show_lines: bool = False
) -> Table:
    """A rich table of a frame; long cells are cut to `max_width` characters."""
    arrow = frame.to_arrow() if isinstance(frame, pl.DataFrame) else frame
    table = Table(title=title, title_justify="left", show_lines=show_lines)
    for field in arrow.schema:
        if pa.types.is_integer(field.type) or pa.types.is_floating(field.type):
            table.add_column(field.name, justify="right", min_width=min(len(field.name), 7))
        else:
            table.add_column(field.name, overflow="fold", min_width=min(len(field.name), 12))
    for row in arrow.to_pylist():
        table.add_row(*(_cell(value, max_width) for value in row.values()))
    return table


def _cell(value: Any, max_width: int) -> str:
    if value is None:
        return "[dim]null[/dim]"
    text = (
        value
        if isinstance(value, str)
        else json.dumps(value, default=str)
        if isinstance(value, (list, dict))
        else str(value)
    )
    text = text.replace("[", r"\[")
    return text if len(text) <= max_width else text[: max_width - 1] + "…"


def write_result(arrow: pa.Table) -> None:
    """A query result in this command's format; for people, with its row count."""
    show_table(arrow)
    if _output["format"] is TableFormat.table:
        console.print(f"[dim]{arrow.num_rows} row(s)[/dim]")


def _write_rows(arrow: pa.Table, fmt: TableFormat, part: str | None = None) -> None:
    """CSV with a header line, or JSON lines (one object per row, led by `"table": part` where given)."""
    if fmt is TableFormat.csv:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(arrow.column_names)
        for row in arrow.to_pylist():
            writer.writerow([_plain(v) for v in row.values()])
        sys.stdout.write(buffer.getvalue())
    else:
        lead = {"table": part} if part else {}
        for row in arrow.to_pylist():
            sys.stdout.write(json.dumps({**lead, **row}, default=_json_default, ensure_ascii=False) + "\n")


def _plain(value: Any) -> Any:
    return json.dumps(value, default=str) if isinstance(value, (list, dict)) else value


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return str(value)


def _print_proposal(origin: dict[str, Any], found: dict[str, Any] | None) -> None:
    console.print(f"  proposed as   {origin['uri']} ({origin['parameters'].get('task_type')})")
    if found is None:
        console.print("  proposal      not in the proposals table (its iteration was re-run since)")
        return
    proposal, rollout, version = found["proposal"], found["rollout"], found["model_version"]
    console.print(
        f"  proposer      model version {proposal['model_version']}"
        + (f" ({version['kind']}, from version {version['parent_version']})" if version else "")
        + f", iteration {proposal['iteration']}, rollout {proposal['rollout_id']} "
        f"(run {rollout['run_id'] if rollout else '?'})"
    )
    if proposal["document_id"]:
        console.print(f"  document      {proposal['document_id']}, span {_cell(proposal['span'], 120)}")
    rate = "not solved yet" if proposal["solve_rate"] is None else f"solve rate {proposal['solve_rate']:.0%}"
    console.print(f"  verdict       {proposal['verdict']}, {rate}, proposer reward {proposal['reward']}")
    if rollout:
        console.print(f"  proposed      {_cell(rollout['response'], 200)}")


def print_lineage(lineage: dict[str, Any]) -> None:
    problem = lineage.get("problem")
    console.print(f"[bold]problem {lineage['problem_id']}[/bold]")
    if problem:
        console.print(
            f"  source        {problem['source']} ({problem['split']}, {problem['domain']}, "
            f"level {problem['level']}, verifier {problem['verifier']})"
        )
        origin = lineage["origin"]
        if origin["kind"] == "file":
            console.print(f"  from file     {origin['file']} line {origin['line']} (layout {origin['layout']})")
        elif origin["kind"] == "self-play":
            _print_proposal(origin, lineage.get("proposal"))
        else:
            console.print(f"  generated by  {origin['generator']} ({origin['family']}) seed {origin['seed']}")
            console.print(f"  parameters    {json.dumps(origin['parameters'], sort_keys=True)}")
        console.print(f"  bank version  {problem['bank_version']}")
        run = lineage["run"]
        if run:
            console.print(
                f"  run           {run['run_id']} ({run['flow']}/{run['stage']}, {run['status']}, "
                f"code {run['code_version']}, started {run['started_at']:%Y-%m-%d %H:%M:%S} UTC)"
            )
        console.print(f"  prompt        {_cell(problem['prompt'], 200)}")
        console.print(f"  answer        {_cell(problem['answer'], 200)}")
    elif lineage.get("proposal"):  # a self-play task the bank's gate refused: its proposal
        proposal = lineage["proposal"]["proposal"]
        origin = {"uri": f"proposal:{proposal['proposal_id']}", "parameters": {"task_type": proposal["task_type"]}}
        _print_proposal(origin, lineage["proposal"])
    for line in _drop_lines(lineage["problem_id"], lineage["dropped"]):
        console.print(line)
    for line in _history_lines(lineage.get("history")):
        console.print(line)


def _history_lines(history: dict | None) -> list[str]:
    """What the lake knows of how hard the problem is: `problem_history`'s rows of it, summed."""
    if history is None:
        return ["  history       never drawn"]
    first, last = history["first_iteration"], history["last_iteration"]
    low, high = history["model_versions"]
    lines = [
        f"  history       {history['groups']} group(s) in {history['iterations']} iteration(s) ({first}-{last}), "
        f"versions {low}-{high}: {history['successes']} of {history['trials']} solved, {history['kept']} kept"
    ]
    if history["predicted_solve_rate"] is not None:
        lines.append(
            f"  predicted     solve rate {history['predicted_solve_rate']:.2f} (DBB α {history['dbb_alpha']:.2f}, "
            f"β {history['dbb_beta']:.2f} after iteration {last})"
        )
    for group in history["recent"]:
        outcome = "kept" if group["kept"] else (group["filter_reason"] or "dropped")
        lines.append(
            f"  iteration {group['iteration']:<4}version {group['model_version']}: {group['successes']} of "
            f"{group['n_samples']} solved ({outcome})"
        )
    return lines


def _drop_lines(problem_id: str, dropped: list[dict]) -> list[str]:
    """Its drops, alike ones counted once. A copy of the same text has the same content-hash id, so an exact
    duplicate dropped in favour of this very problem is a copy of it, said as such, not the problem dropped."""

    def where(drop: dict) -> str:
        return f"{drop['source_uri']} line {drop['source_line']}" if drop["source_line"] else drop["source_uri"]

    copies: dict[int, dict[str, int]] = {}
    lines: dict[str, int] = {}  # a generated problem drawn twice is dropped twice, alike
    for drop in dropped:
        if drop["reason"] == "exact_duplicate" and drop["duplicate_of"] == problem_id:
            sources = copies.setdefault(drop["bank_version"], {})
            name = f"{drop['source']}: {where(drop)}"
            sources[name] = sources.get(name, 0) + 1
            continue
        line = (
            f"  dropped       from bank version {drop['bank_version']} as {drop['reason']} of "
            f"{drop['duplicate_of']} ({where(drop)}, run {drop['run_id']})"
        )
        lines[line] = lines.get(line, 0) + 1
    shown = [line + (f" ×{count}" if count > 1 else "") for line, count in lines.items()]
    for version, sources in sorted(copies.items()):
        total = sum(sources.values())
        listed = ", ".join(name + (f" ×{count}" if count > 1 else "") for name, count in sources.items())
        shown.append(
            f"  copies        {total} other cop{'y' if total == 1 else 'ies'} of this problem left out of "
            f"bank version {version} as exact duplicates of it ({listed})"
        )
    return shown
