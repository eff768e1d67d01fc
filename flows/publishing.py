"""The publish stage: make a model version servable on the rollout endpoints before anything samples it.

Its own run row; every endpoint's outcome appended to `publications` in one commit (failures
included, so SQL shows which server refused which version and why), and only then does it fail
when too few endpoints confirmed. Nothing to do on the hf backend, which loads versions itself.
"""

from __future__ import annotations

import os
from typing import Any

import polars as pl
import pyarrow.compute as pc
from prefect import flow
from prefect.runtime import flow_run

from storage.lake import Lake
from storage.registry import version_row
from storage.runs import utc_now
from tasks.rollout.publish import PublishConfig, publish, require_confirmed
from tasks.rollout.stage import RolloutConfig


def served_name(row: dict[str, Any], rollout: RolloutConfig) -> str:
    """The name a registry row's version is served by: its own `served_name`, else the backend's template."""
    return row["served_name"] or rollout.openai.model_name.format(model_version=row["model_version"])


def base_names(lake: Lake, rollout: RolloutConfig) -> set[str]:
    """Served names a server was started with (base models): never unloaded."""
    bases = lake.read("model_versions", filter=pc.field("kind") == "base", columns=["model_version", "served_name"])
    return {served_name(row, rollout) for row in bases.iter_rows(named=True)}


def publish_version(lake: Lake, rollout: RolloutConfig, config: PublishConfig, version: int,
                    flow: str = "publish-policy", iteration: int | None = None) -> list[dict[str, Any]] | None:
    """Publish `version` to every endpoint of `rollout.openai`; None when there is nothing to publish to."""
    if rollout.backend != "openai" or not config.enabled:
        return None
    row = version_row(lake, version)
    name = served_name(row, rollout)
    endpoints = rollout.openai.endpoints
    parameters = {"model_version": version, "served_name": name, "endpoints": endpoints, **config.model_dump()}
    with lake.run(flow, "publish", parameters, iteration=iteration, prefect_flow_run_id=flow_run.id) as run:
        results = publish(endpoints, name, row["checkpoint_uri"], config,
                          rollout.openai.model_name, base_names(lake, rollout), os.environ.get(rollout.openai.api_key_env))
        rows = [{"model_version": version, "served_name": r.served_name, "endpoint": r.endpoint,
                 "path": r.path, "action": r.action, "error": r.error, "unloaded": r.unloaded,
                 "created_at": utc_now()} for r in results]
        lake.append("publications", pl.DataFrame(rows, schema_overrides={"error": pl.String,
                                                                         "unloaded": pl.List(pl.String)}), run)
    for result in results:
        state = result.action.replace("_", " ") + (f": {result.error}" if result.error else "")
        unloaded = f" (unloaded {', '.join(result.unloaded)})" if result.unloaded else ""
        print(f"publish: model version {version} as {name!r} on {result.endpoint}: {state}{unloaded}")
    require_confirmed(results, config.min_endpoints)
    return rows


@flow(name="publish-policy", log_prints=True)
def publish_policy(version: int, rollout: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
                   lake_uri: str | None = None) -> list[dict[str, Any]] | None:
    """Load model version `version` into every rollout endpoint and confirm it (`rlvr policy publish`)."""
    return publish_version(Lake.open(lake_uri), RolloutConfig.model_validate(rollout or {}),
                           PublishConfig.model_validate(config or {}), version)
