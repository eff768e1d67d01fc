"""Writing the lake: two modes, both single Delta commits.
- `replace(table, rows, key={...})` swaps out exactly the slice with that key (a bank version, an iteration) and
  nothing else, so re-running a stage never duplicates its output;
- `append(table, rows)` adds rows.
A write streamed from an iterator that fails half-way commits nothing: Delta only publishes data files through
the log entry written at the very end. Writes that must not race (a table's unique key, a slice that must still
be empty) are conditional: checked against a snapshot and committed exactly on top of it, else re-checked.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from storage import faults, leases, runs_table
from storage.errors import LakeError
from storage.outputs import Outputs
from storage.predicates import both, key_expression, key_predicate
from storage.runs import Run
from storage.schemas import PARQUET_WRITER, POST_COMMIT, TABLES, TableSpec
from storage.snapshots import SNAPSHOT_LOCK, SNAPSHOTS, entry_dataset

RowData = pl.DataFrame | pa.Table | Iterable[pa.RecordBatch]
Condition = Callable[[DeltaTable | None], None]


class Writes:
    """`Lake`'s writes, committed on the process's snapshot where the rows are in memory (`SnapshotReads`)."""

    def replace(self, name: str, rows: RowData, key: dict[str, Any], run: Run, only_if_empty: bool = False) -> int:
        """Atomically replace the rows whose key columns equal `key` with `rows`; returns the new version.

        `only_if_empty`: a conditional commit that refuses when the slice already holds visible rows of another
        run (how numbers such as model versions are allocated); an orphan slice, left by a run that never
        completed, is replaced."""
        spec = TABLES[name]
        if not spec.replace_key or not set(spec.replace_key) <= set(key):
            raise LakeError(
                f"{name}: a replace key {sorted(key)} must include the slice columns {list(spec.replace_key)}"
            )
        conditions = [self._slice_empty(spec, key, run)] if only_if_empty else []
        return self._write(spec, rows, run, key=key, predicate=key_predicate(key), conditions=conditions)

    def clear(self, name: str, key: dict[str, Any], run: Run) -> int | None:
        """Empty a slice (a replace by no rows); no commit when it holds no row at all, visible or not, which
        is the common case of a fresh iteration (four empty commits an iteration otherwise). Returns the new
        version, or None when there was nothing to clear."""
        if self.read(name, filter=key_expression(key), columns=["run_id"], raw=True).is_empty():
            return None
        return self.replace(name, pl.DataFrame(), key, run)

    def append(self, name: str, rows: RowData, run: Run) -> int:
        return self._write(TABLES[name], rows, run, key={}, predicate=None)

    def commit(self, outputs: Outputs, run: Run) -> list[int | None]:
        """Write a stage's outputs with its run, in their order: the one call a stage's flow makes. Returns each
        write's new table version (None for a clear that found nothing)."""
        versions = []
        for write in outputs.writes:
            if write.mode == "replace":
                versions.append(self.replace(write.table, write.rows, write.key, run))
            elif write.mode == "clear":
                versions.append(self.clear(write.table, write.key, run))
            else:
                versions.append(self.append(write.table, write.rows, run))
        return versions

    def remove_rows_of_runs(self, name: str, run_ids: list[str], run: Run) -> int:
        """Delete the rows those runs wrote (one commit): how `rlvr doctor --repair` clears rows of runs that
        never completed. Returns the new version."""
        leases.check(self.location)
        metrics = retry_on_conflict(
            lambda: self.table(name).delete(  # idempotent: a fresh snapshot
                runs_table.run_ids_predicate(run_ids),
                post_commithook_properties=POST_COMMIT,
                commit_properties=CommitProperties(custom_metadata={"run_id": run.run_id, "stage": run.stage}),
            ),
            f"remove rows of {name}",
        )
        version = self._committed_version(name, run.run_id)
        run.record_write(name, version, -int(metrics.get("num_deleted_rows", 0)))
        return version

    def restore(self, name: str, key: dict[str, Any], version: int | None, run: Run) -> int:
        """Put a slice back as it was at table `version` (None: before the table existed), keeping the
        restored rows' own run ids: the compensating write of a multi-stage re-run that failed."""
        rows = self.read(name, filter=key_expression(key), version=version) if version is not None else pl.DataFrame()
        return self._write(TABLES[name], rows, run, key, key_predicate(key), keep_run_ids=True)

    def _write(
        self,
        spec: TableSpec,
        rows: RowData,
        run: Run,
        key: dict[str, Any],
        predicate: str | None,
        keep_run_ids: bool = False,
        conditions: list[Condition] | None = None,
    ) -> int:
        conditions = list(conditions or [])
        if spec.unique:
            conditions.append(self._unique(spec, rows, key, run))
        if isinstance(rows, (pl.DataFrame, pa.Table)):  # replayable: a commit conflict is retried
            return retry_on_conflict(
                lambda: self._write_once(spec, rows, run, key, predicate, keep_run_ids, conditions),
                f"write {spec.name}",
            )
        if conditions:
            raise LakeError(f"{spec.name}: a conditional write needs its rows in memory, not a stream")
        return self._write_once(spec, rows, run, key, predicate, keep_run_ids)

    def _write_once(
        self,
        spec: TableSpec,
        rows: RowData,
        run: Run,
        key: dict[str, Any],
        predicate: str | None,
        keep_run_ids: bool = False,
        conditions: list[Condition] | None = None,
    ) -> int:
        leases.check(self.location)  # a writer whose lease was taken over writes nothing
        counter: dict[str, Any] = {"rows": 0, "error": None}
        reader = pa.RecordBatchReader.from_batches(
            spec.schema, _conformed_batches(spec, rows, None if keep_run_ids else run.run_id, key, counter)
        )
        version = None
        if isinstance(rows, (pl.DataFrame, pa.Table)):  # rows in memory: committed on the process's snapshot

            def commit(existing: DeltaTable | None) -> int | None:
                before = existing.version() if existing is not None else None
                bare = predicate is not None and existing is not None and self._slice_bare(spec.name, existing, key)
                self._commit_rows(
                    spec, reader, existing, None if bare else predicate, run, conditions, counter, on_snapshot_only=bare
                )
                # the snapshot one commit on: that commit is this write's (else the log says which one is)
                return existing.version() if existing is not None and existing.version() == before + 1 else None

            version = self._on_snapshot(spec.name, commit)
        else:  # a stream may take long: no lock held while it is read
            self._commit_rows(spec, reader, self.table(spec.name), predicate, run, conditions, counter)
        version = version if version is not None else self._committed_version(spec.name, run.run_id)
        run.record_write(spec.name, version, counter["rows"], slice_key=predicate)
        faults.point(f"committed:{run.stage}:{spec.name}")
        return version

    def _commit_rows(
        self,
        spec: TableSpec,
        reader,
        existing: DeltaTable | None,
        predicate: str | None,
        run: Run,
        conditions: list[Condition] | None,
        counter: dict[str, Any],
        on_snapshot_only: bool = False,
    ) -> None:
        """Commit the rows: an overwrite of the `predicate`'s rows, else an append. `on_snapshot_only` (as with
        conditions): the commit lands right on `existing`'s version or is refused (CommitFailedError), so that
        what was checked on that snapshot still holds when it lands."""
        for condition in conditions or []:  # checked on this snapshot; the commit must land right on it
            condition(existing)
        grows = existing is not None and not set(spec.schema.names) <= {f.name for f in existing.schema().fields}
        try:
            write_deltalake(
                existing if existing is not None else self.location.table_uri(spec.name),
                reader,
                mode="overwrite" if predicate and existing is not None else "append",
                predicate=predicate if existing is not None else None,
                partition_by=partitions(spec, existing),
                schema_mode="merge" if grows else None,  # the contract gained nullable columns since
                storage_options=self.location.storage_options(),
                writer_properties=PARQUET_WRITER,
                post_commithook_properties=POST_COMMIT,
                commit_properties=CommitProperties(
                    custom_metadata={"run_id": run.run_id, "stage": run.stage},
                    max_commit_retries=0 if conditions or on_snapshot_only else None,
                ),
            )
        except Exception:
            if counter["error"] is not None:  # the rows' own failure, not delta-rs's wrapping of it
                raise counter["error"] from None
            raise

    def _slice_bare(self, name: str, existing: DeltaTable, key: dict[str, Any]) -> bool:
        """Whether the process's snapshot `existing` holds no row of the slice at all, visible or not (a fresh
        iteration's slice, most often). Then a replace is an append that lands right on that snapshot: the same
        rows without the scan for the predicate's rows that delta-rs's overwrite plans. Only on the process's snapshot, whose dataset is at hand; any other table is
        taken as not bare."""
        with SNAPSHOT_LOCK:
            entry = SNAPSHOTS.get(self._snapshot_key(name))
            if entry is None or entry.table is not existing:
                return False
            dataset = entry_dataset(entry)
        return dataset.count_rows(filter=key_expression(key)) == 0

    def _unique(self, spec: TableSpec, rows: RowData, key: dict[str, Any], run: Run) -> Condition:
        """No two visible rows may share the table's unique columns: refuse rows that repeat each other or a
        visible row outside the replaced slice."""
        frame = rows if isinstance(rows, pl.DataFrame) else pl.from_arrow(rows) if isinstance(rows, pa.Table) else None
        columns = list(spec.unique)

        def check(existing: DeltaTable | None) -> None:
            if frame is None or frame.is_empty():
                return
            values = frame.select(columns)
            repeated = values.filter(values.is_duplicated())
            if repeated.height:
                raise LakeError(
                    f"{spec.name}: refused commit: the rows repeat {columns} {repeated.row(0)} ({repeated.height} rows)"
                )
            if existing is None:
                return
            condition = both(pc.field(columns[0]).isin(values[columns[0]].unique().to_list()), self._visible(spec.name))
            if key:
                condition = condition & ~key_expression(key)
            clash = pl.from_arrow(
                self._dataset_of(spec.name, existing).to_table(
                    filter=condition, columns=list(dict.fromkeys([*columns, *key, "run_id"]))
                )
            )
            clash = clash.join(values, on=columns, how="semi") if len(columns) > 1 else clash
            if clash.height:
                where = ", ".join(f"{k} {clash[k][0]}" for k in key) or "the table"
                raise LakeError(
                    f"{spec.name}: refused commit: {clash.height} row(s) would repeat a {'/'.join(columns)} "
                    f"already there (e.g. {clash[columns[0]][0]} in {where}, run {clash['run_id'][0]}); "
                    f"run `rlvr doctor --lake {self.uri}` if that is unexpected"
                )

        return check

    def _slice_empty(self, spec: TableSpec, key: dict[str, Any], run: Run) -> Condition:
        def check(existing: DeltaTable | None) -> None:
            if existing is None:
                return
            condition = both(key_expression(key), self._visible(spec.name)) & (pc.field("run_id") != run.run_id)
            holders = self._dataset_of(spec.name, existing).to_table(filter=condition, columns=["run_id"])["run_id"]
            if len(holders):
                slice_ = ", ".join(f"{k} = {v}" for k, v in key.items())
                raise LakeError(f"{spec.name}: refused commit: {slice_} is already taken by run {holders[0]}")

        return check

    def _committed_version(self, name: str, run_id: str) -> int:
        """The version of this run's latest commit to a table (others may have committed since).

        Read from the log files themselves: `DeltaTable.history()` numbers commits by counting
        down from the latest, which mislabels them when writers race.
        """
        fs = self.location.filesystem
        for path in self.commit_files(name)[:200]:
            with fs.open(path, "rb") as handle:
                for line in handle:
                    info = json.loads(line).get("commitInfo")
                    if info is not None and info.get("run_id") == run_id:
                        return int(path.rsplit("/", 1)[1].split(".")[0])
        raise LakeError(f"run {run_id} wrote to {name} but its commit is not in the log")


def retry_on_conflict(commit, what: str, attempts: int = 30):
    """Delta's optimistic concurrency: a commit that lost a race is retried on a fresh snapshot."""
    for attempt in range(attempts):
        try:
            return commit()
        except CommitFailedError:
            time.sleep(random.uniform(0.02, 0.1) * min(attempt + 1, 10))
    raise LakeError(f"could not {what}: {attempts} commits in a row lost a race with concurrent writers")


def partitions(spec: TableSpec, existing: DeltaTable | None) -> list[str] | None:
    """The partition columns a write uses: the table's own once it exists (a lake made when the iteration tables
    were partitioned keeps them so), the contract's for a new one."""
    columns = existing.metadata().partition_columns if existing is not None else list(spec.partition_by)
    return list(columns) or None


def _as_batches(rows: RowData) -> Iterable[pa.RecordBatch]:
    if isinstance(rows, pl.DataFrame):
        return rows.to_arrow().to_batches(max_chunksize=65536)
    if isinstance(rows, pa.Table):
        return rows.to_batches(max_chunksize=65536)
    return rows


def _conformed_batches(
    spec: TableSpec, rows: RowData, run_id: str | None, key: dict[str, Any], counter: dict[str, Any]
) -> Iterator[pa.RecordBatch]:
    """Cast each batch to the table's schema, stamp the run id (None: keep the rows' own), and check it
    lies inside the key."""
    try:
        yield from _conform(spec, rows, run_id, key, counter)
    except BaseException as error:
        counter["error"] = error
        raise


def _conform(
    spec: TableSpec, rows: RowData, run_id: str | None, key: dict[str, Any], counter: dict[str, Any]
) -> Iterator[pa.RecordBatch]:
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
