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

from storage.lake import Lake
from tasks.curation.config import CurationConfig
from tasks.curation.filter import decontaminate, deduplicate
from tasks.curation.load import load_source
from tasks.curation.stage import (preflight, evaluation_sets, existing_bank, next_bank_version,
                                  source_report, write_bank)

load_source_task = task(load_source, name="load-source", cache_policy=NO_CACHE)
existing_bank_task = task(existing_bank, name="read-existing-bank", cache_policy=NO_CACHE)
deduplicate_task = task(deduplicate, name="deduplicate", cache_policy=NO_CACHE)
evaluation_sets_task = task(evaluation_sets, name="evaluation-sets", cache_policy=NO_CACHE)
decontaminate_task = task(decontaminate, name="decontaminate", cache_policy=NO_CACHE)
write_bank_task = task(write_bank, name="write-bank", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)


@flow(name="curate-bank", log_prints=True)
def curate_bank(config: dict[str, Any], lake_uri: str | None = None) -> dict[str, Any]:
    """Curate one bank version from the sources in `config` (a `CurationConfig` as a dict)."""
    curation = CurationConfig.model_validate(config)
    preflight(curation)
    lake = Lake.open(lake_uri)
    bank_version = curation.bank_version or next_bank_version(lake)
    with lake.run("curate-bank", "curate", curation.model_dump(mode="json"), bank_version=bank_version,
                  prefect_flow_run_id=flow_run.id) as run:
        loaded = [load_source_task.with_options(task_run_name=f"load {s.source_name}")(s, curation.validation)
                  for s in curation.sources]
        candidates = pl.concat([s.problems for s in loaded])
        quarantined = pl.concat([s.quarantined for s in loaded])
        existing = existing_bank_task(lake, bank_version)
        kept, duplicates = deduplicate_task(candidates, existing, curation.dedup)
        eval_sets = evaluation_sets_task(existing, kept, curation.decontamination, curation.validation)
        kept, contaminated = decontaminate_task(kept, eval_sets, curation.decontamination)
        dropped = pl.concat([duplicates, contaminated])
        write_bank_task(lake, run, bank_version, kept, quarantined, dropped)
    report = source_report(loaded, kept, dropped)
    return {"bank_version": bank_version, "run_id": run.run_id, "lake_version": lake.runs_version(),
            "sources": report.to_dicts()}
