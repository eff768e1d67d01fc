"""Lineage queries: where a row came from, walked back through the tables by their ids."""

from __future__ import annotations

import json
from typing import Any

import polars as pl
import pyarrow as pa
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
        if row["source_kind"] == "selfplay" and row["source_uri"].startswith("proposal:"):
            lineage["proposal"] = proposal_lineage(lake, row["source_uri"].split(":", 1)[1])
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


def proposal_lineage(lake: Lake, proposal_id: str) -> dict[str, Any] | None:
    """A self-play task's origin: the proposal, the proposer rollout that wrote it and the version that sampled
    it, with the document and span it cites (a grounded task)."""
    proposals = lake.read("proposals", filter=pc.field("proposal_id") == proposal_id)
    if proposals.is_empty():
        return None
    row = proposals.row(0, named=True)
    rollouts = lake.read("rollouts", filter=pc.field("rollout_id") == row["rollout_id"],
                         columns=["rollout_id", "model_version", "prompt", "response", "run_id"])
    versions = lake.read("model_versions", filter=pc.field("model_version") == row["model_version"],
                         columns=["model_version", "kind", "parent_version", "iteration", "run_id"])
    return {"proposal": {key: row[key] for key in ("proposal_id", "iteration", "role", "task_type", "model_version",
                                                   "rollout_id", "document_id", "span", "verdict", "solve_rate",
                                                   "reward", "run_id")},
            "rollout": rollouts.row(0, named=True) if rollouts.height else None,
            "model_version": versions.row(0, named=True) if versions.height else None}


def _origin(row: dict[str, Any]) -> dict[str, Any]:
    if row["source_kind"] == "selfplay":
        return {"kind": "self-play", "uri": row["source_uri"], "parameters": json.loads(row["params"] or "{}")}
    if row["source_line"] is not None:
        return {"kind": "file", "layout": row["source_kind"], "file": row["source_uri"], "line": row["source_line"]}
    return {"kind": "generator", "generator": row["source_uri"], "family": row["source_kind"],
            "seed": row["seed"], "parameters": json.loads(row["params"] or "{}")}


def model_version_lineage(lake: Lake, version: int) -> list[dict[str, Any]]:
    """The chain from `version` back to its base: per version, its training run and what its batches held
    (rollouts, the versions that sampled them, the problems and bank versions, the stage runs). The batches,
    rollouts and problems of the whole chain are read once each, pruned to the chain's iterations: a walk back
    over a long run costs three reads, not three a version."""
    versions = {row["model_version"]: row for row in lake.read("model_versions").iter_rows(named=True)}
    if version not in versions:
        raise ValueError(f"model version {version} is not registered in {lake.uri}")
    rows, missing = [], None
    current: int | None = version
    while current is not None and current in versions:
        rows.append(versions[current])
        current = versions[current]["parent_version"]
        if current is not None and current not in versions:
            missing = current
    batches, rollouts, problems = _chain_batches(lake, rows)
    chain: list[dict[str, Any]] = []
    for row in rows:
        entry = {key: row[key] for key in ("model_version", "parent_version", "kind", "iteration", "checkpoint_uri",
                                           "batch_ids", "run_id", "created_at")}
        entry["metrics"] = json.loads(row["metrics"] or "{}")
        batch = batches.filter(pl.col("batch_id").is_in(row["batch_ids"])) if row["batch_ids"] else None
        if batch is not None and batch.is_empty():
            entry["replaced_batches"] = list(row["batch_ids"])   # the iteration's advantages were re-run since
        elif batch is not None:
            sampled = rollouts.filter(pl.col("rollout_id").is_in(batch["rollout_id"].implode()))
            banked = problems.filter(pl.col("problem_id").is_in(sampled["problem_id"].unique().implode()))
            entry |= {"rollouts": batch.height, "problems": sampled["problem_id"].n_unique(),
                      "sampled_by": sorted(set(sampled["model_version"].to_list())),
                      "bank_versions": sorted(set(banked["bank_version"].to_list())),
                      "runs": sorted(set(batch["run_id"].to_list()) | set(sampled["run_id"].to_list()))}
        chain.append(entry)
    if missing is not None:
        chain.append({"model_version": missing, "missing": True})
    return chain


def _chain_batches(lake: Lake, rows: list[dict[str, Any]]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The batches the chain's versions consumed, their rollouts and those rollouts' problems, one read each
    (batches and rollouts pruned to the iterations the batches came from)."""
    def among(column: str, values, type_: pa.DataType) -> pc.Expression:
        return pc.field(column).isin(pa.array(sorted(set(values)), type_))     # typed: the set may be empty

    batch_ids = [batch_id for row in rows for batch_id in row["batch_ids"] or []]
    trained_at = [row["iteration"] for row in rows if row["iteration"] is not None]
    batches = lake.read("batches", filter=among("iteration", trained_at, pa.int64()) & among("batch_id", batch_ids,
                                                                                             pa.string()))
    missed = set(batch_ids) - set(batches["batch_id"].to_list())
    if missed:                                       # a batch of another iteration than its version's, or replaced
        batches = pl.concat([batches, lake.read("batches", filter=among("batch_id", missed, pa.string()))])
    rollouts = lake.read("rollouts", filter=among("iteration", batches["iteration"].to_list(), pa.int64())
                         & among("rollout_id", batches["rollout_id"].to_list(), pa.string()),
                         columns=["rollout_id", "problem_id", "model_version", "run_id"])
    problems = lake.read("problems", filter=among("problem_id", rollouts["problem_id"].to_list(), pa.string()),
                         columns=["problem_id", "bank_version"])
    return batches, rollouts, problems
