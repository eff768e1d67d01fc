"""The curation flow: load every source, validate, deduplicate, decontaminate, write one bank version.

Thin by design: each task hands a config and frames to a function of `tasks.curation`.
Runs in Prefect's ephemeral mode when no server is configured, and shows in the UI when
`PREFECT_API_URL` points at `prefect server start`.
"""

from __future__ import annotations

from typing import Any

import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from flows.policies import STORAGE_RETRY_DELAYS, stage_task
from storage.lake import Lake
from tasks.curation.config import CurationConfig
from tasks.curation.gate import GateSettings, admit, bank_run
from tasks.curation.load import load_source
from tasks.curation.stage import check_code_solutions, preflight, source_report

load_source_task = stage_task(load_source, "load-source")
check_code_task = task(check_code_solutions, name="check-code-solutions", cache_policy=NO_CACHE)
admit_task = stage_task(admit, "dedup-decontaminate-write", retry_delays=STORAGE_RETRY_DELAYS)


@flow(name="curate-bank", log_prints=True)
def curate_bank(config: dict[str, Any], lake_uri: str | None = None, force: bool = False) -> dict[str, Any]:
    """Curate one bank version from the sources in `config` (a `CurationConfig` as a dict).

    Sources are loaded and validated first, side by side with other curations. Then the bank's gate
    (`tasks/curation/gate.py`, the one every problem passes, an iteration's made ones too): under the lake's
    `bank` lease (concurrent curations queue for it), one critical section allocates the bank version,
    deduplicates against the bank as it stands, decontaminates, writes, and completes the run (its rows become
    visible), so the next curation in line deduplicates against this one's problems."""
    curation = CurationConfig.model_validate(config)
    preflight(curation)
    lake = Lake.open(lake_uri)
    with bank_run(
        lake,
        "curate-bank",
        curation.model_dump(mode="json"),
        bank_version=curation.bank_version,
        prefect_flow_run_id=flow_run.id,
    ) as section:
        loaded = [
            load_source_task.with_options(task_run_name=f"load {s.source_name}")(s, curation.validation)
            for s in curation.sources
        ]
        loaded = [check_code_task(s, curation.validation) for s in loaded]
        candidates, quarantined = pl.concat([s.problems for s in loaded]), pl.concat([s.quarantined for s in loaded])
        admitted = admit_task(section, candidates, quarantined, GateSettings.of(curation), curation.bank_version, force)
    report = source_report(loaded, admitted.kept, admitted.dropped)
    return {
        "bank_version": admitted.bank_version,
        "run_id": section.run.run_id,
        "lake_version": lake.runs_version(),
        "sources": report.to_dicts(),
    }
