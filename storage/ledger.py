"""The run ledger: a row in `runs` per stage run (`running`, then `completed` or `failed`), the leases a writer
holds, and reaping the runs of dead processes (`abandoned`). A run's rows become visible when its row says
`completed`; the process record names it meanwhile (`storage/presence.py`), so a run whose process dies is found.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, QueryBuilder, write_deltalake

from storage import faults, leases, presence, runs_table
from storage.errors import LakeError
from storage.runs import Run, utc_now
from storage.runs_table import sql_literal
from storage.schemas import PARQUET_WRITER, POST_COMMIT, TABLES
from storage.snapshots import SNAPSHOTS
from storage.visibility import ACTIVE_RUNS
from storage.writes import retry_on_conflict


class RunLedger:
    """`Lake`'s runs and leases."""

    @contextmanager
    def run(
        self,
        flow: str,
        stage: str,
        parameters: dict[str, Any],
        *,
        bank_version: int | None = None,
        iteration: int | None = None,
        prefect_flow_run_id: str | None = None,
    ) -> Iterator[Run]:
        """Record a stage run in `runs`: a `running` row first, then `completed` or `failed`. Its rows become
        visible to other readers when it completes; this process's record names it meanwhile, so a run
        whose process dies is found and marked `abandoned` (`reap`)."""
        run = Run(
            flow=flow,
            stage=stage,
            parameters=parameters,
            bank_version=bank_version,
            iteration=iteration,
            prefect_flow_run_id=prefect_flow_run_id,
        )
        mine = presence.presence(self.location)
        mine.add_run(run.run_id)  # the process record names the run before `runs` does
        ACTIVE_RUNS.add(run.run_id)
        try:
            self._write_run_row(run.row("running"), insert=True)
            faults.point(f"run-started:{stage}")
            try:
                yield run
            except BaseException as error:
                self._write_run_row(
                    run.row("failed", utc_now(), f"{type(error).__name__}: {error}"[:4000]), only_if_running=True
                )
                raise
            faults.point(f"run-ending:{stage}")
            if not self._write_run_row(run.row("completed", utc_now()), only_if_running=True):
                raise LakeError(
                    f"run {run.run_id} was marked abandoned while it worked (its process looked dead "
                    f"to another for over {presence.lease_timeout():.0f} s); its output stays invisible"
                )
        finally:
            ACTIVE_RUNS.discard(run.run_id)
            mine.remove_run(run.run_id)

    @contextmanager
    def lease(self, name: str, wait: bool | float = False) -> Iterator[leases.Grant]:
        """Hold one of the lake's leases (`storage/leases.py`): refused at once while another live process holds
        it, unless `wait`. Taking it first marks the runs of dead processes `abandoned`, and a takeover from a
        dead holder is logged in `runs`."""
        grant = leases.acquire(self.location, name, wait)
        try:
            if grant.count == 1:
                self.reap(grant)
                faults.point(f"lease-taken:{name}")
            yield grant
        finally:
            leases.release(self.location, name)

    def reap(self, grant: leases.Grant | None = None) -> list[str]:
        """Mark `abandoned` every `running` run whose process is dead and forget dead processes' records; log a
        lease takeover. Returns the abandoned run ids."""
        abandoned = []
        for row, reason in self.dead_runs():
            if self._write_run_row(
                {**row, "status": "abandoned", "ended_at": utc_now(), "error": reason}, only_if_running=True
            ):
                abandoned.append(row["run_id"])
        for record in presence.process_records(self.location):
            if not presence.alive(record):
                presence.forget(self.location, record["process_id"])
        if grant is not None and grant.taken_from is not None:
            taken = Run(
                flow="lease",
                stage="takeover",
                parameters={
                    "lease": grant.name,
                    "epoch": grant.epoch,
                    "from": presence.describe(grant.taken_from),
                    "from_process": grant.taken_from.get("process_id"),
                    "abandoned_runs": abandoned,
                },
            )
            self._write_run_row(taken.row("completed", utc_now()), insert=True)
        return abandoned

    def dead_runs(self) -> list[tuple[dict[str, Any], str]]:
        """`running` runs whose process is dead, each with why. A run no process record names (from an older
        version, or killed before its record was written) counts once it is older than the lease timeout."""
        records = presence.process_records(self.location)
        live = {record["process_id"] for record in records if presence.alive(record)}
        owner_of = {
            run_id: record
            for record in records
            if record["process_id"] not in live
            for run_id in record.get("runs", [])
        }
        live_runs = {
            run_id for record in records if record["process_id"] in live for run_id in record.get("runs", [])
        } | ACTIVE_RUNS
        now, dead = utc_now(), []
        for row in self.read("runs", filter=pc.field("status") == "running").iter_rows(named=True):
            owner = owner_of.get(row["run_id"])
            age = (now - row["started_at"]).total_seconds()
            if row["run_id"] in live_runs or (owner is None and age < presence.lease_timeout()):
                continue
            who = f"its process ({presence.describe(owner)}) died" if owner else "no live process runs it"
            dead.append((row, f"abandoned: {who}"))
        return dead

    def mark_runs(
        self, iteration: int, stages: set[str], since: datetime, status: str, unless_in: dict[str, str] | None = None
    ) -> list[str]:
        """Set the status of the completed runs of `stages` for `iteration` started at or after `since`,
        except those whose rows are still in their stage's table (`unless_in`: stage -> table)."""
        runs = self.read(
            "runs",
            filter=(pc.field("iteration") == iteration)
            & pc.field("stage").isin(sorted(stages))
            & (pc.field("status") == "completed")
            & (pc.field("started_at") >= pa.scalar(since, pa.timestamp("us", tz="UTC"))),
        )
        marked = []
        for row in runs.iter_rows(named=True):
            table = (unless_in or {}).get(row["stage"])
            if (
                table
                and not self.read(
                    table,
                    filter=(pc.field("iteration") == iteration) & (pc.field("run_id") == row["run_id"]),
                    columns=["run_id"],
                ).is_empty()
            ):
                continue
            self._write_run_row({**row, "status": status})
            marked.append(row["run_id"])
        return marked

    def record_skipped(
        self,
        flow: str,
        stage: str,
        parameters: dict[str, Any],
        *,
        iteration: int | None = None,
        prefect_flow_run_id: str | None = None,
    ) -> Run:
        """A `skipped` row in `runs`: the stage was asked for but its output was already in place."""
        run = Run(
            flow=flow, stage=stage, parameters=parameters, iteration=iteration, prefect_flow_run_id=prefect_flow_run_id
        )
        self._write_run_row(run.row("skipped", utc_now()), insert=True)
        return run

    def _write_run_row(self, row: dict[str, Any], insert: bool = False, only_if_running: bool = False) -> bool:
        """Insert or update a run's row; `only_if_running` updates it only while its status is `running` (a run
        marked abandoned stays so). Returns whether a row was written."""
        data = pa.Table.from_pylist([row], schema=TABLES["runs"].schema)

        def write(table: DeltaTable | None) -> bool:
            if insert or table is None:
                write_deltalake(
                    table if table is not None else self.location.table_uri("runs"),
                    data,
                    mode="append",
                    storage_options=self.location.storage_options(),
                    writer_properties=PARQUET_WRITER,
                    post_commithook_properties=POST_COMMIT,
                )
                return True
            # the run's row replaced in one commit that lands right on this snapshot (or is retried on a fresh
            # one), so the status read here still holds when it lands. Not a MERGE: delta-rs writes the file a
            # MERGE rewrites with string_view columns, which a filtered read of a compacted file cannot compare
            predicate = f"run_id = {sql_literal(row['run_id'])}"
            if only_if_running:
                status = runs_table.status_of(table, row["run_id"])
                status = (
                    status
                    if status is not None
                    else QueryBuilder()
                    .register("runs", table)
                    .execute(f"select status from runs where {predicate}")
                    .read_all()["status"]
                    .to_pylist()
                )
                if status != ["running"]:
                    return False
            write_deltalake(
                table,
                data,
                mode="overwrite",
                predicate=predicate,
                storage_options=self.location.storage_options(),
                writer_properties=PARQUET_WRITER,
                post_commithook_properties=POST_COMMIT,
                commit_properties=CommitProperties(max_commit_retries=0),
            )
            return True

        written = retry_on_conflict(lambda: self._on_snapshot("runs", write), f"record run {row['run_id']}")
        kept = SNAPSHOTS.get(self._snapshot_key("runs"))  # counted on the snapshot as it is: no log lookups
        if kept is not None and len(kept.table.file_uris()) >= runs_table.COMPACT_FILES:
            self._on_snapshot("runs", runs_table.compact)
        return written
