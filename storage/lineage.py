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
    (rollouts, the versions that sampled them, the problems and bank versions, the stage runs)."""
    versions = {row["model_version"]: row for row in lake.read("model_versions").iter_rows(named=True)}
    if version not in versions:
        raise ValueError(f"model version {version} is not registered in {lake.uri}")
    chain: list[dict[str, Any]] = []
    current: int | None = version
    while current is not None and current in versions:
        row = versions[current]
        entry = {key: row[key] for key in ("model_version", "parent_version", "kind", "iteration", "checkpoint_uri",
                                           "batch_ids", "run_id", "created_at")}
        entry["metrics"] = json.loads(row["metrics"] or "{}")
        batch = (lake.read("batches", filter=pc.field("batch_id").isin(row["batch_ids"])) if row["batch_ids"]
                 else None)
        if batch is not None and batch.is_empty():
            entry["replaced_batches"] = list(row["batch_ids"])   # the iteration's advantages were re-run since
        elif batch is not None:
            rollouts = lake.read("rollouts", filter=pc.field("rollout_id").isin(batch["rollout_id"].to_list()),
                                 columns=["rollout_id", "problem_id", "model_version", "run_id"])
            problems = lake.read("problems", filter=pc.field("problem_id").isin(rollouts["problem_id"].unique().to_list()),
                                 columns=["problem_id", "bank_version"])
            entry |= {"rollouts": batch.height, "problems": rollouts["problem_id"].n_unique(),
                      "sampled_by": sorted(set(rollouts["model_version"].to_list())),
                      "bank_versions": sorted(set(problems["bank_version"].to_list())),
                      "runs": sorted(set(batch["run_id"].to_list()) | set(rollouts["run_id"].to_list()))}
        chain.append(entry)
        current = row["parent_version"]
        if current is not None and current not in versions:
            chain.append({"model_version": current, "missing": True})
    return chain
