"""The curation flow: load every source, validate, deduplicate, decontaminate, write one bank version.

Thin by design: each task hands a config and frames to a function of `tasks.curation`.
Runs in Prefect's ephemeral mode when no server is configured, and shows in the UI when
`PREFECT_API_URL` points at `prefect server start`.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import polars as pl
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from flows.policies import stage_task
from storage.lake import Lake
from tasks.curation.config import CurationConfig
from tasks.curation.filter import decontaminate, deduplicate
from tasks.curation.load import load_source
from storage.leases import BANK
from tasks.curation.stage import (check_code_solutions, check_recuration, evaluation_sets, existing_bank,
                                  next_bank_version, preflight, source_report, write_bank)

load_source_task = stage_task(load_source, "load-source")
check_code_task = task(check_code_solutions, name="check-code-solutions", cache_policy=NO_CACHE)
existing_bank_task = task(existing_bank, name="read-existing-bank", cache_policy=NO_CACHE)
deduplicate_task = task(deduplicate, name="deduplicate", cache_policy=NO_CACHE)
evaluation_sets_task = task(evaluation_sets, name="evaluation-sets", cache_policy=NO_CACHE)
decontaminate_task = task(decontaminate, name="decontaminate", cache_policy=NO_CACHE)
write_bank_task = task(write_bank, name="write-bank", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)


@flow(name="curate-bank", log_prints=True)
def curate_bank(config: dict[str, Any], lake_uri: str | None = None, force: bool = False) -> dict[str, Any]:
    """Curate one bank version from the sources in `config` (a `CurationConfig` as a dict).

    Sources are loaded and validated first, side by side with other curations. Then, under the lake's
    `bank` lease (concurrent curations queue for it), one critical section: allocate the bank version,
    deduplicate against the bank as it stands, write, and complete the run (its rows become visible), so
    the next curation in line deduplicates against this one's problems."""
    curation = CurationConfig.model_validate(config)
    preflight(curation)
    lake = Lake.open(lake_uri)
    with ExitStack() as critical:                      # left only after the run's row says how it ended
        with lake.run("curate-bank", "curate", curation.model_dump(mode="json"), bank_version=curation.bank_version,
                      prefect_flow_run_id=flow_run.id) as run:
            loaded = [load_source_task.with_options(task_run_name=f"load {s.source_name}")(s, curation.validation)
                      for s in curation.sources]
            loaded = [check_code_task(s, curation.validation) for s in loaded]
            critical.enter_context(lake.lease(BANK, wait=True))
            if curation.bank_version is not None:
                check_recuration(lake, curation.bank_version, force)
            run.bank_version = bank_version = curation.bank_version or next_bank_version(lake)
            candidates = pl.concat([s.problems for s in loaded])
            quarantined = pl.concat([s.quarantined for s in loaded])
            existing = existing_bank_task(lake, bank_version)
            kept, duplicates = deduplicate_task(candidates, existing, curation.dedup)
            eval_sets = evaluation_sets_task(existing, kept, curation.decontamination, curation.validation)
            kept, contaminated = decontaminate_task(kept, eval_sets, curation.decontamination, existing)
            dropped = pl.concat([duplicates, contaminated])
            write_bank_task(lake, run, bank_version, kept, quarantined, dropped)
    report = source_report(loaded, kept, dropped)
    return {"bank_version": bank_version, "run_id": run.run_id, "lake_version": lake.runs_version(),
            "sources": report.to_dicts()}
