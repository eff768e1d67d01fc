"""The lake: Delta tables with explicit schemas, one transaction per write, a run row per stage.

Two write modes, both single Delta commits:
- `replace(table, rows, key={...})` swaps out exactly the slice with that key (a bank version,
  an iteration) and nothing else, so re-running a stage never duplicates its output;
- `append(table, rows)` adds rows.
A write streamed from an iterator that fails half-way commits nothing: Delta only publishes
data files through the log entry written at the very end.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from storage.location import LakeLocation
from storage.runs import Run, utc_now
from storage.schemas import TABLES, TableSpec

RowData = pl.DataFrame | pa.Table | Iterable[pa.RecordBatch]


class LakeError(RuntimeError):
    """A lake operation failed for a reason the user can act on."""


class Lake:
    def __init__(self, location: LakeLocation):
        self.location = location

    @classmethod
    def open(cls, uri: str | None = None) -> "Lake":
        location = LakeLocation.resolve(uri)
        if not location.is_s3 and os.path.exists(location.uri) and not os.path.isdir(location.uri):
            raise LakeError(f"lake location {location.uri} is a file, not a folder")
        return cls(location)

    @property
    def uri(self) -> str:
        return self.location.uri

    # ---- reading -------------------------------------------------------------------------
    def table(self, name: str, version: int | str | datetime | None = None) -> DeltaTable | None:
        """The Delta table, optionally time-travelled; None when it has never been written."""
        try:
            table = DeltaTable(self.location.table_uri(name), storage_options=self.location.storage_options())
        except TableNotFoundError:
            return None
        if version is not None:
            table.load_as_version(version)
        return table

    def exists(self, name: str) -> bool:
        return self.table(name) is not None

    def existing_tables(self) -> list[str]:
        return [name for name in TABLES if self.exists(name)]

    def read(self, name: str, filter: pc.Expression | None = None, columns: list[str] | None = None,
             version: int | None = None) -> pl.DataFrame:
        """Rows of a table as a Polars frame; an empty frame with the contract's schema if absent."""
        table = self.table(name, version)
        if table is None:
            empty = TABLES[name].schema.empty_table()
            return pl.from_arrow(empty.select(columns) if columns else empty)
        data = table.to_pyarrow_dataset().to_table(filter=filter, columns=columns)
        return pl.from_arrow(data)

    # ---- writing -------------------------------------------------------------------------
    def replace(self, name: str, rows: RowData, key: dict[str, Any], run: Run) -> int:
        """Atomically replace the rows whose key columns equal `key` with `rows`; returns the new version."""
        spec = TABLES[name]
        if not spec.partition_by or not set(spec.partition_by) <= set(key):
            raise LakeError(f"{name}: a replace key {sorted(key)} must include the partition columns {list(spec.partition_by)}")
        return self._write(spec, rows, run, key=key, predicate=_key_predicate(key))

    def append(self, name: str, rows: RowData, run: Run) -> int:
        return self._write(TABLES[name], rows, run, key={}, predicate=None)

    def restore(self, name: str, key: dict[str, Any], version: int | None, run: Run) -> int:
        """Put a slice back as it was at table `version` (None: before the table existed), keeping the
        restored rows' own run ids: the compensating write of a multi-stage re-run that failed."""
        condition = None
        for column, value in key.items():
            condition = (pc.field(column) == value) if condition is None else condition & (pc.field(column) == value)
        rows = self.read(name, filter=condition, version=version) if version is not None else pl.DataFrame()
        return self._write(TABLES[name], rows, run, key, _key_predicate(key), keep_run_ids=True)

    def _write(self, spec: TableSpec, rows: RowData, run: Run, key: dict[str, Any], predicate: str | None,
               keep_run_ids: bool = False) -> int:
        if isinstance(rows, (pl.DataFrame, pa.Table)):   # replayable: a commit conflict is retried
            return _retry_on_conflict(lambda: self._write_once(spec, rows, run, key, predicate, keep_run_ids),
                                      f"write {spec.name}")
        return self._write_once(spec, rows, run, key, predicate, keep_run_ids)

    def _write_once(self, spec: TableSpec, rows: RowData, run: Run, key: dict[str, Any], predicate: str | None,
                    keep_run_ids: bool = False) -> int:
        counter: dict[str, Any] = {"rows": 0, "error": None}
        reader = pa.RecordBatchReader.from_batches(
            spec.schema, _conformed_batches(spec, rows, None if keep_run_ids else run.run_id, key, counter))
        existing = self.table(spec.name)
        try:
            write_deltalake(
                existing if existing is not None else self.location.table_uri(spec.name),
                reader,
                mode="overwrite" if predicate and existing is not None else "append",
                predicate=predicate if existing is not None else None,
                partition_by=list(spec.partition_by) or None,
                storage_options=self.location.storage_options(),
                commit_properties=CommitProperties(custom_metadata={"run_id": run.run_id, "stage": run.stage}),
            )
        except Exception:
            if counter["error"] is not None:   # the rows' own failure, not delta-rs's wrapping of it
                raise counter["error"] from None
            raise
        version = self._committed_version(spec.name, run.run_id)
        run.record_write(spec.name, version, counter["rows"], slice_key=predicate)
        return version

    def _committed_version(self, name: str, run_id: str) -> int:
        """The version of this run's latest commit to a table (others may have committed since).

        Read from the log files themselves: `DeltaTable.history()` numbers commits by counting
        down from the latest, which mislabels them when writers race.
        """
        fs = self.location.filesystem
        log = self.location.table_uri(name).removeprefix("s3://") + "/_delta_log"
        fs.invalidate_cache(log)                       # s3fs caches listings
        commits = sorted((p for p in fs.ls(log, detail=False) if p.endswith(".json")), reverse=True)
        for path in commits[:200]:
            with fs.open(path, "rb") as handle:
                for line in handle:
                    info = json.loads(line).get("commitInfo")
                    if info is not None and info.get("run_id") == run_id:
                        return int(path.rsplit("/", 1)[1].split(".")[0])
        raise LakeError(f"run {run_id} wrote to {name} but its commit is not in the log")

    # ---- runs ----------------------------------------------------------------------------
    @contextmanager
    def run(self, flow: str, stage: str, parameters: dict[str, Any], *, bank_version: int | None = None,
            iteration: int | None = None, prefect_flow_run_id: str | None = None) -> Iterator[Run]:
        """Record a stage run in `runs`: a `running` row first, then `completed` or `failed`."""
        run = Run(flow=flow, stage=stage, parameters=parameters, bank_version=bank_version,
                  iteration=iteration, prefect_flow_run_id=prefect_flow_run_id)
        self._write_run_row(run.row("running"), insert=True)
        try:
            yield run
        except BaseException as error:
            self._write_run_row(run.row("failed", utc_now(), f"{type(error).__name__}: {error}"[:4000]))
            raise
        self._write_run_row(run.row("completed", utc_now()))

    def mark_runs(self, iteration: int, stages: set[str], since: datetime, status: str,
                  unless_in: dict[str, str] | None = None) -> list[str]:
        """Set the status of the completed runs of `stages` for `iteration` started at or after `since`,
        except those whose rows are still in their stage's table (`unless_in`: stage -> table)."""
        runs = self.read("runs", filter=(pc.field("iteration") == iteration) & pc.field("stage").isin(sorted(stages))
                         & (pc.field("status") == "completed") & (pc.field("started_at") >= pa.scalar(
                             since, pa.timestamp("us", tz="UTC"))))
        marked = []
        for row in runs.iter_rows(named=True):
            table = (unless_in or {}).get(row["stage"])
            if table and not self.read(table, filter=(pc.field("iteration") == iteration)
                                       & (pc.field("run_id") == row["run_id"]), columns=["run_id"]).is_empty():
                continue
            self._write_run_row({**row, "status": status})
            marked.append(row["run_id"])
        return marked

    def record_skipped(self, flow: str, stage: str, parameters: dict[str, Any], *, iteration: int | None = None,
                       prefect_flow_run_id: str | None = None) -> Run:
        """A `skipped` row in `runs`: the stage was asked for but its output was already in place."""
        run = Run(flow=flow, stage=stage, parameters=parameters, iteration=iteration,
                  prefect_flow_run_id=prefect_flow_run_id)
        self._write_run_row(run.row("skipped", utc_now()), insert=True)
        return run

    def _write_run_row(self, row: dict[str, Any], insert: bool = False) -> None:
        data = pa.Table.from_pylist([row], schema=TABLES["runs"].schema)

        def commit() -> None:
            table = self.table("runs")
            if insert or table is None:
                write_deltalake(table if table is not None else self.location.table_uri("runs"), data, mode="append",
                                storage_options=self.location.storage_options())
            else:
                (table.merge(data, predicate="t.run_id = s.run_id", source_alias="s", target_alias="t")
                      .when_matched_update_all().when_not_matched_insert_all().execute())

        _retry_on_conflict(commit, f"record run {row['run_id']}")

    def runs_version(self) -> int | None:
        table = self.table("runs")
        return None if table is None else table.version()

    def versions_as_of(self, as_of: int | str) -> dict[str, int]:
        """The version of each table at a point in the lake's history.

        An integer is a *lake version*: the version of the `runs` table, which advances with every
        run start and end. Each table is taken at the last version written by a run that had
        completed by then, so the snapshot is consistent across tables. An ISO timestamp means
        the lake version current at that instant (from the commits' own millisecond timestamps,
        not the object store's file times).
        """
        lake_version = self.lake_version_at(as_of) if isinstance(as_of, str) and not as_of.isdigit() else int(as_of)
        latest = self.runs_version()
        if latest is None or not 0 <= lake_version <= latest:
            raise LakeError(f"lake version {lake_version} does not exist (latest is {latest})")
        runs = self.table("runs", lake_version).to_pyarrow_table(columns=["status", "table_versions"])
        versions: dict[str, int] = {"runs": lake_version}
        for status, table_versions in zip(runs["status"].to_pylist(), runs["table_versions"].to_pylist()):
            if status != "completed" or not table_versions:
                continue
            for table, version in json.loads(table_versions).items():
                versions[table] = max(version, versions.get(table, -1))
        return versions

    def lake_version_at(self, moment: str) -> int:
        try:
            instant = datetime.fromisoformat(moment)
        except ValueError:
            raise LakeError(f"--as-of {moment!r} is neither a lake version nor an ISO timestamp") from None
        if instant.tzinfo is None:
            instant = instant.replace(tzinfo=timezone.utc)
        runs = self.table("runs")
        history = runs.history() if runs is not None else []
        before = [c["version"] for c in history if c["timestamp"] <= instant.timestamp() * 1000]
        if not before:
            raise LakeError(f"the lake at {self.uri} has no version at or before {instant.isoformat()}")
        return max(before)


def _retry_on_conflict(commit, what: str, attempts: int = 30):
    """Delta's optimistic concurrency: a commit that lost a race is retried on a fresh snapshot."""
    for attempt in range(attempts):
        try:
            return commit()
        except CommitFailedError:
            time.sleep(random.uniform(0.02, 0.1) * min(attempt + 1, 10))
    raise LakeError(f"could not {what}: {attempts} commits in a row lost a race with concurrent writers")


def _sql_literal(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise LakeError(f"unsupported key value {value!r}")
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def _key_predicate(key: dict[str, Any]) -> str:
    """The SQL predicate of a replaced slice: every key column equal to its value."""
    return " AND ".join(f"{column} = {_sql_literal(value)}" for column, value in key.items())


def _as_batches(rows: RowData) -> Iterable[pa.RecordBatch]:
    if isinstance(rows, pl.DataFrame):
        return rows.to_arrow().to_batches(max_chunksize=65536)
    if isinstance(rows, pa.Table):
        return rows.to_batches(max_chunksize=65536)
    return rows


def _conformed_batches(spec: TableSpec, rows: RowData, run_id: str | None, key: dict[str, Any],
                       counter: dict[str, Any]) -> Iterator[pa.RecordBatch]:
    """Cast each batch to the table's schema, stamp the run id (None: keep the rows' own), and check it
    lies inside the key."""
    try:
        yield from _conform(spec, rows, run_id, key, counter)
    except BaseException as error:
        counter["error"] = error
        raise


def _conform(spec: TableSpec, rows: RowData, run_id: str | None, key: dict[str, Any],
             counter: dict[str, Any]) -> Iterator[pa.RecordBatch]:
    for batch in _as_batches(rows):
        if batch.num_rows == 0:
            continue
        columns = {}
        for field in spec.schema:
            if field.name == "run_id" and run_id is not None:
                columns[field.name] = pa.array([run_id] * batch.num_rows, pa.string())
            elif field.name in batch.schema.names:
                columns[field.name] = batch.column(field.name)
            elif field.nullable:
                columns[field.name] = pa.nulls(batch.num_rows, field.type)
            else:
                raise LakeError(f"{spec.name}: required column {field.name!r} is missing")
        extra = set(batch.schema.names) - set(spec.schema.names)
        if extra:
            raise LakeError(f"{spec.name}: columns {sorted(extra)} are not in the table's schema")
        try:
            table = pa.Table.from_pydict(columns).cast(spec.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
            raise LakeError(f"{spec.name}: rows do not match the schema: {error}") from error
        for column, value in key.items():
            if not pc.all(pc.equal(table[column], value)).as_py():
                raise LakeError(f"{spec.name}: rows outside the replaced slice {column} = {value!r}")
        counter["rows"] += table.num_rows
        yield from table.to_batches()
