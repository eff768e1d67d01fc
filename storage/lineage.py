"""Lineage queries: where a row came from, walked back through the tables by their ids."""

from __future__ import annotations

import json
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from storage.lake import Lake
from storage.schemas import VERIFICATION_ROUND


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
        lineage["problem"] = {
            key: row[key]
            for key in ("source", "split", "domain", "level", "verifier", "bank_version", "prompt", "answer")
        }
        lineage["origin"] = _origin(row)
        lineage["run"] = run_record(lake, row["run_id"])
        if row["source_kind"] == "selfplay" and row["source_uri"].startswith("proposal:"):
            lineage["proposal"] = proposal_lineage(lake, row["source_uri"].split(":", 1)[1])
    lineage["dropped"] = [
        {
            key: row[key]
            for key in (
                "bank_version",
                "reason",
                "duplicate_of",
                "similarity",
                "source",
                "source_uri",
                "source_line",
                "run_id",
            )
        }
        for row in dropped.iter_rows(named=True)
    ]
    lineage["history"] = problem_history(lake, problem_id)
    refused_task = next((uri for uri in dropped["source_uri"] if uri.startswith("proposal:")), None)
    if "proposal" not in lineage and refused_task is not None:  # a self-play task the bank's gate refused
        lineage["proposal"] = proposal_lineage(lake, refused_task.split(":", 1)[1])
    return lineage


def problem_history(lake: Lake, problem_id: str, recent: int = 5) -> dict[str, Any] | None:
    """The problem's evidence across every run of the lake (the `problem_history` view's rows of it): groups,
    trials and successes, the iterations and versions that drew it, its last groups, and the solve rate the DBB
    state after its last iteration predicts. None when no group drew it."""
    by_id = pc.field("problem_id") == problem_id
    training = by_id & (pc.field("round").is_null() | (pc.field("round") != VERIFICATION_ROUND))
    groups = lake.read(
        "groups",
        filter=training,
        columns=["iteration", "run_id", "model_version", "n_samples", "solve_rate", "kept", "filter_reason"],
    ).sort("iteration")
    if groups.is_empty():
        return None
    groups = groups.with_columns(successes=(pl.col("solve_rate") * pl.col("n_samples")).round().cast(pl.Int64))
    last = int(groups["iteration"].max())
    state = lake.read("dbb_state", filter=by_id & (pc.field("iteration") == last), columns=["dbb_alpha", "dbb_beta"])
    alpha, beta = state.row(0) if state.height else (None, None)
    return {
        "groups": groups.height,
        "trials": int(groups["n_samples"].sum()),
        "successes": int(groups["successes"].sum()),
        "kept": int(groups["kept"].sum()),
        "iterations": groups["iteration"].n_unique(),
        "first_iteration": int(groups["iteration"].min()),
        "last_iteration": last,
        "model_versions": (groups["model_version"].min(), groups["model_version"].max()),
        "dbb_alpha": alpha,
        "dbb_beta": beta,
        "predicted_solve_rate": alpha / (alpha + beta) if alpha is not None else None,
        "recent": groups.tail(recent).drop("run_id").to_dicts(),
    }


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
    rollouts = lake.read(
        "rollouts",
        filter=pc.field("rollout_id") == row["rollout_id"],
        columns=["rollout_id", "model_version", "prompt", "response", "run_id"],
    )
    versions = lake.read(
        "model_versions",
        filter=pc.field("model_version") == row["model_version"],
        columns=["model_version", "kind", "parent_version", "iteration", "run_id"],
    )
    return {
        "proposal": {
            key: row.get(key)
            for key in (
                "proposal_id",
                "iteration",
                "role",
                "task_type",
                "model_version",
                "rollout_id",
                "document_id",
                "document_source",
                "document_licence",
                "span",
                "verdict",
                "solve_rate",
                "reward",
                "run_id",
            )
        },
        "rollout": rollouts.row(0, named=True) if rollouts.height else None,
        "model_version": versions.row(0, named=True) if versions.height else None,
    }


def _origin(row: dict[str, Any]) -> dict[str, Any]:
    if row["source_kind"] == "selfplay":
        return {"kind": "self-play", "uri": row["source_uri"], "parameters": json.loads(row["params"] or "{}")}
    if row["source_line"] is not None:
        return {"kind": "file", "layout": row["source_kind"], "file": row["source_uri"], "line": row["source_line"]}
    return {
        "kind": "generator",
        "generator": row["source_uri"],
        "family": row["source_kind"],
        "seed": row["seed"],
        "parameters": json.loads(row["params"] or "{}"),
    }


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
    consumed = _consumed(lake, rows)
    chain: list[dict[str, Any]] = []
    for row in rows:
        entry = {
            key: row[key]
            for key in (
                "model_version",
                "parent_version",
                "kind",
                "iteration",
                "checkpoint_uri",
                "batch_ids",
                "run_id",
                "created_at",
            )
        }
        entry["metrics"] = json.loads(row["metrics"] or "{}")
        if row["batch_ids"] and row["model_version"] not in consumed:
            entry["replaced_batches"] = list(row["batch_ids"])  # the iteration's advantages were re-run since
        elif row["batch_ids"]:
            entry |= consumed[row["model_version"]]
        chain.append(entry)
    if missing is not None:
        chain.append({"model_version": missing, "missing": True})
    return chain


def _consumed(lake: Lake, rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per version of the chain whose batches are still there: its rollouts, their problems, the versions that
    sampled them, the bank versions and the stage runs — one join and one grouping over the whole chain, not a
    scan of it a version."""
    batches, rollouts, problems = _chain_batches(lake, rows)
    trained = pl.DataFrame(
        {
            "model_version": [row["model_version"] for row in rows for _ in row["batch_ids"] or []],
            "batch_id": [batch_id for row in rows for batch_id in row["batch_ids"] or []],
        },
        schema={"model_version": pl.Int64, "batch_id": pl.String},
    )
    sampled = trained.join(batches.select("batch_id", "rollout_id", "run_id"), on="batch_id").join(
        rollouts.rename({"model_version": "sampled_by", "run_id": "sampler_run_id"}), on="rollout_id", how="left"
    )
    by_version = sampled.group_by("model_version").agg(
        rollouts=pl.len(),
        problems=pl.col("problem_id").drop_nulls().n_unique(),
        sampled_by=pl.col("sampled_by").drop_nulls().unique().sort(),
        runs=pl.col("run_id").append(pl.col("sampler_run_id").drop_nulls()).unique().sort(),
    )
    banked = (
        sampled.select("model_version", "problem_id")
        .unique()
        .join(problems, on="problem_id")
        .group_by("model_version")
        .agg(bank_versions=pl.col("bank_version").unique().sort())
    )
    summary = by_version.join(banked, on="model_version", how="left")
    return {
        row.pop("model_version"): {**row, "bank_versions": row["bank_versions"] or []}
        for row in summary.iter_rows(named=True)
    }


def _chain_batches(lake: Lake, rows: list[dict[str, Any]]) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The batches the chain's versions consumed, their rollouts and those rollouts' problems, one read each
    (batches and rollouts pruned to the iterations the batches came from)."""

    def among(column: str, values, type_: pa.DataType) -> pc.Expression:
        return pc.field(column).isin(pa.array(sorted(set(values)), type_))  # typed: the set may be empty

    batch_ids = [batch_id for row in rows for batch_id in row["batch_ids"] or []]
    trained_at = [row["iteration"] for row in rows if row["iteration"] is not None]
    batches = lake.read(
        "batches", filter=among("iteration", trained_at, pa.int64()) & among("batch_id", batch_ids, pa.string())
    )
    missed = set(batch_ids) - set(batches["batch_id"].to_list())
    if missed:  # a batch of another iteration than its version's, or replaced
        batches = pl.concat([batches, lake.read("batches", filter=among("batch_id", missed, pa.string()))])
    rollouts = lake.read(
        "rollouts",
        filter=among("iteration", batches["iteration"].to_list(), pa.int64())
        & among("rollout_id", batches["rollout_id"].to_list(), pa.string()),
        columns=["rollout_id", "problem_id", "model_version", "run_id"],
    )
    problems = lake.read(
        "problems",
        filter=among("problem_id", rollouts["problem_id"].to_list(), pa.string()),
        columns=["problem_id", "bank_version"],
    )
    return batches, rollouts, problems
