"""Stage fingerprints: what a stage's output depends on, so an unchanged re-run can be skipped.

A stage's output for an iteration is a function of its config, its inputs and the code. Inputs are
named by the run ids of the rows a stage reads (every row carries the run that wrote it), plus the
model and bank versions it reads; re-running an upstream stage gives its rows a new run id, which
changes every downstream fingerprint. The code is a digest of the platform's own source files, so
an uncommitted edit counts as a change too.

A stage is skipped when an earlier completed run of it, for the same iteration, had the same
fingerprint and its output is still the one in place (no later run replaced it).
"""

from __future__ import annotations

import json
from functools import lru_cache
from hashlib import blake2b
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from storage.lake import Lake

PACKAGES = ("flows", "tasks", "policy", "storage", "trainers")

# The table whose rows a stage run writes for its iteration; a run whose rows are still there is in place.
OUTPUT_TABLE = {
    "rollout": "rollouts",
    "verify": "rewards",
    "advantages": "groups",
    "train": "model_versions",
    "evaluate": "evaluations",
}


@lru_cache(maxsize=1)
def source_digest() -> str:
    """BLAKE2b of every .py file of the platform's packages (path and bytes), in path order."""
    root = Path(__file__).resolve().parents[1]
    digest = blake2b(digest_size=8)
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def fingerprint(config: dict[str, Any], inputs: dict[str, Any]) -> str:
    """One hash of a stage's config, inputs and code."""
    text = json.dumps({"config": config, "inputs": inputs, "code": source_digest()}, sort_keys=True, default=str)
    return blake2b(text.encode(), digest_size=12).hexdigest()


def run_ids(lake: Lake, table: str, iteration: int, where: pc.Expression | None = None) -> list[str]:
    """The runs that wrote an iteration's rows of a table, sorted."""
    condition = pc.field("iteration") == iteration
    if where is not None:
        condition = condition & where
    return sorted(lake.read(table, filter=condition, columns=["run_id"])["run_id"].unique().to_list())


def in_place_run(lake: Lake, stage: str, iteration: int, stage_fingerprint: str) -> str | None:
    """The id of a completed run of `stage` for `iteration` with this fingerprint whose output is in place."""
    runs = lake.read(
        "runs",
        filter=(pc.field("stage") == stage)
        & (pc.field("iteration") == iteration)
        & (pc.field("status") == "completed"),
        columns=["run_id", "parameters", "started_at"],
    )
    if runs.is_empty():
        return None
    matching = [
        run_id
        for run_id, parameters in runs.sort("started_at", descending=True).select("run_id", "parameters").rows()
        if json.loads(parameters).get("fingerprint") == stage_fingerprint
    ]
    if not matching:
        return None
    if (
        stage == "rollout"
        and lake.read("groups", filter=pc.field("iteration") == iteration, columns=["run_id"]).is_empty()
    ):
        return None  # sampling failed or stopped before its groups were written: not done
    written = set(
        lake.read(OUTPUT_TABLE[stage], filter=pc.field("run_id").isin(matching), columns=["run_id"])["run_id"].to_list()
    )
    return next((run_id for run_id in matching if run_id in written), None)
