"""The `lake-maintenance` flow: `rlvr lake maintain` as a Prefect flow, scheduled by configs/deployments.yaml.
It runs beside a live loop; see storage/maintenance.py for why that is safe."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from prefect import flow

from storage.lake import Lake
from storage.maintenance import MaintenanceConfig, maintain


@flow(name="lake-maintenance", log_prints=True)
def lake_maintenance(config: dict[str, Any] | None = None, lake_uri: str | None = None) -> list[dict[str, Any]]:
    """Compact, checkpoint and vacuum each table of the lake (config: MaintenanceConfig)."""
    results = maintain(
        Lake.open(lake_uri),
        MaintenanceConfig.model_validate(config or {}),
        progress=lambda name: print(f"maintained {name}"),
    )
    return [asdict(result) for result in results]
