"""The skip check every stage flow makes before it runs (flows/stage_plans.py, storage/fingerprints.py)."""

from __future__ import annotations

from typing import Any

from prefect.runtime import flow_run

from flows.stage_plans import StageKey, skip_if_in_place
from storage.lake import Lake


def unchanged_or_fingerprint(
    lake: Lake, key: StageKey, iteration: int, force: bool
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the run parameters to record: the stage's config plus its inputs and fingerprint, a skip summary or
    None). Unless `force`, a stage whose output from an identical run is still in place is not run again:
    a `skipped` row goes to `runs` and the summary names the run whose output stands."""
    skipped = skip_if_in_place(lake, key, iteration, force, flow_run.id)
    if skipped is not None:
        print(
            f"{key.stage} of iteration {iteration}: skipped, its inputs, config and code are unchanged since run "
            f"{skipped['same_as']} (force to re-run)"
        )
    return key.parameters, skipped
