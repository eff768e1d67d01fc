"""The model registry's data: which versions exist, their lineage rows and where their checkpoints live.

It lives on the storage floor because every stage reads it (rollout samples the latest version,
training registers the next, evaluation and lineage walk it). Loading and saving the models
themselves is `policy/checkpoints.py`'s business.

Numbers and folders are allocated so that nothing is reused by accident: a version number is taken
by a conditional commit (`register`), a checkpoint folder by a conditional write (`claim_checkpoint`).
"""

from __future__ import annotations

import json
import os

import polars as pl
import pyarrow.compute as pc

from storage import objects, presence
from storage.lake import Lake, LakeError
from storage.runs import Run, utc_now


def checkpoint_uri(lake: Lake, version: int) -> str:
    return lake.location.path("models", f"v{version:05d}")


CLAIM = "_claimed.json"


def claim_checkpoint(lake: Lake, version: int) -> str:
    """A checkpoint folder nobody else uses, claimed by a conditional write: `models/v00007`, or `v00007-2`, ...
    when one is taken. A folder a dead process claimed but never registered (or registered under a run that
    never completed) is reclaimed: nothing any reader sees refers to it. A folder whose checkpoint was
    registered by a completed run is never overwritten, even if its registry row was lost."""
    base = checkpoint_uri(lake, version)
    for attempt in range(1, 1000):
        uri = base if attempt == 1 else f"{base}-{attempt}"
        if reclaimable(lake, uri):
            lake.location.filesystem.rm(uri.removeprefix("s3://"), recursive=True)
        if _claim(lake, uri):
            return uri
    raise LakeError(f"no free checkpoint folder for model version {version} under {base}")


def _claim(lake: Lake, uri: str) -> bool:
    path = uri.removeprefix("s3://")
    claim = {**presence.this_process().as_record(), "state": "claimed"}
    if lake.location.is_s3:
        if lake.location.filesystem.exists(f"{path}/config.json"):  # written before folders were claimed
            return False
        return objects.create_new(lake.location, f"{path}/{CLAIM}", claim)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        os.mkdir(path)  # atomic: one process creates the folder
    except FileExistsError:
        return False
    with open(os.path.join(path, CLAIM), "w") as handle:
        json.dump(claim, handle)
    return True


def claim_record(lake: Lake, uri: str) -> dict | None:
    try:
        with lake.location.filesystem.open(f"{uri.removeprefix('s3://')}/{CLAIM}", "rb") as handle:
            return json.loads(handle.read())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def reclaimable(lake: Lake, uri: str) -> bool:
    """Did a process that died claim this folder without a completed run registering it?"""
    claim = claim_record(lake, uri)
    if claim is None:
        return False  # no claim: made by an older version, keep it
    named = lake.read("model_versions", filter=pc.field("checkpoint_uri") == uri, columns=["model_version"])
    if named.height:
        return False
    if claim.get("state") == "registered":
        return claim.get("run_id") in lake.hidden_runs() and not presence.alive(claim)
    return not presence.alive(claim)


def versions(lake: Lake) -> pl.DataFrame:
    return lake.read("model_versions").sort("model_version")


BRANCH = "rl-branch"


def latest_version(lake: Lake) -> int | None:
    """The newest version of the main line: what the loop samples and trains next, and what evaluation
    means by "latest". A branch (an old iteration re-trained from its own parent) is never it."""
    registered = lake.read("model_versions", filter=pc.field("kind") != BRANCH, columns=["model_version"])
    return None if registered.is_empty() else int(registered["model_version"].max())


def next_version_number(lake: Lake) -> int:
    """The next version number, branches included: one past the highest a completed run registered (a number
    left by a run that never completed is reused; its checkpoint folder is not, see `claim_checkpoint`)."""
    registered = lake.read("model_versions", columns=["model_version"])["model_version"]
    return 0 if registered.is_empty() else int(registered.max()) + 1


def version_row(lake: Lake, version: int) -> dict:
    rows = lake.read("model_versions", filter=pc.field("model_version") == version)
    if rows.is_empty():
        known = lake.read("model_versions", columns=["model_version"])["model_version"].to_list()
        raise ValueError(
            f"model version {version} is not registered in {lake.uri} (registered: {sorted(known)}); "
            "run an iteration or `rlvr policy init` to create version 0"
        )
    return rows.row(0, named=True)


def register(
    lake: Lake,
    run: Run,
    version: int,
    *,
    uri: str,
    kind: str,
    parent: int | None = None,
    iteration: int | None = None,
    batch_ids: list[str] | None = None,
    architecture: dict | None = None,
    metrics: dict | None = None,
    served_name: str | None = None,
) -> None:
    row = {
        "model_version": version,
        "parent_version": parent,
        "kind": kind,
        "checkpoint_uri": uri,
        "served_name": served_name,
        "iteration": iteration,
        "batch_ids": batch_ids or [],
        "architecture": json.dumps(architecture or {}, sort_keys=True, default=str),
        "metrics": json.dumps(metrics or {}, sort_keys=True, default=str),
        "created_at": utc_now(),
    }
    lake.replace(
        "model_versions",
        pl.DataFrame([row], schema_overrides={"parent_version": pl.Int64, "iteration": pl.Int64}),
        {"model_version": version},
        run,
        only_if_empty=True,
    )  # the number is allocated by this commit
    if claim_record(lake, uri) is not None:  # a completed run's checkpoint is never reclaimed
        path = f"{uri.removeprefix('s3://')}/{CLAIM}"
        with lake.location.filesystem.open(path, "wb") as handle:
            handle.write(
                json.dumps(
                    {**presence.this_process().as_record(), "state": "registered", "run_id": run.run_id}
                ).encode()
            )
