"""The skip check every stage flow makes before it runs (see storage/fingerprints.py)."""

from __future__ import annotations

from typing import Any

from prefect.runtime import flow_run

from storage.fingerprints import fingerprint, in_place_run
from storage.lake import Lake


def unchanged_or_fingerprint(lake: Lake, flow: str, stage: str, iteration: int, config: dict[str, Any],
                             inputs: dict[str, Any], force: bool, output_settings: dict[str, Any] | None = None
                             ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the run parameters to record, a skip summary or None).

    The parameters are the stage's config plus its inputs and fingerprint; the fingerprint covers
    `output_settings` when given (the config without how the work is spread out), else the config.
    Unless `force`, a stage whose output from an identical run is still in place is not run again:
    a `skipped` row goes to `runs` and the summary names the run whose output stands.
    """
    stage_fingerprint = fingerprint(config if output_settings is None else output_settings, inputs)
    parameters = {**config, "inputs": inputs, "fingerprint": stage_fingerprint}
    same_as = None if force else in_place_run(lake, stage, iteration, stage_fingerprint)
    if same_as is None:
        return parameters, None
    run = lake.record_skipped(flow, stage, {**parameters, "same_as": same_as}, iteration=iteration,
                              prefect_flow_run_id=flow_run.id)
    print(f"{stage} of iteration {iteration}: skipped, its inputs, config and code are unchanged since run "
          f"{same_as} (force to re-run)")
    return parameters, {"stage": stage, "iteration": iteration, "skipped": True, "same_as": same_as,
                        "run_id": run.run_id}


def config_of(parameters: dict[str, Any]) -> dict[str, Any]:
    """A recorded run's config: its parameters without what the skip check added."""
    return {key: value for key, value in parameters.items() if key not in ("inputs", "fingerprint", "same_as")}
