"""Lineage queries: where a row came from, walked back through the tables by their ids."""

from __future__ import annotations

import json
from typing import Any

import pyarrow.compute as pc

from storage.lake import Lake


def problem_lineage(lake: Lake, problem_id: str) -> dict[str, Any] | None:
    """Origin, bank version and run of a problem; also says if it was dropped from the bank."""
    by_id = pc.field("problem_id") == problem_id
    problems = lake.read("problems", filter=by_id)
    dropped = lake.read("dropped_problems", filter=by_id)
    if problems.is_empty() and dropped.is_empty():
        return None
    lineage: dict[str, Any] = {"problem_id": problem_id}
    if not problems.is_empty():
        row = problems.row(0, named=True)
        lineage["problem"] = {key: row[key] for key in ("source", "split", "domain", "level", "verifier",
                                                         "bank_version", "prompt", "answer")}
        lineage["origin"] = _origin(row)
        lineage["run"] = run_record(lake, row["run_id"])
    lineage["dropped"] = [
        {key: row[key] for key in ("bank_version", "reason", "duplicate_of", "similarity", "source",
                                   "source_uri", "source_line", "run_id")}
        for row in dropped.iter_rows(named=True)
    ]
    return lineage


def run_record(lake: Lake, run_id: str) -> dict[str, Any] | None:
    runs = lake.read("runs", filter=pc.field("run_id") == run_id)
    if runs.is_empty():
        return None
    row = runs.row(0, named=True)
    row["parameters"] = json.loads(row["parameters"])
    return row


def _origin(row: dict[str, Any]) -> dict[str, Any]:
    if row["source_line"] is not None:
        return {"kind": "file", "layout": row["source_kind"], "file": row["source_uri"], "line": row["source_line"]}
    return {"kind": "generator", "generator": row["source_uri"], "family": row["source_kind"],
            "seed": row["seed"], "parameters": json.loads(row["params"] or "{}")}
