"""The lake: Delta tables with explicit schemas, one transaction per write, a run row per stage.

Two write modes, both single Delta commits:
- `replace(table, rows, key={...})` swaps out exactly the slice with that key (a bank version,
  an iteration) and nothing else, so re-running a stage never duplicates its output;
- `append(table, rows)` adds rows.
A write streamed from an iterator that fails half-way commits nothing: Delta only publishes
data files through the log entry written at the very end.

What readers see: every data row carries the run that wrote it, and a row is visible only once its
run has *completed* (or to the run itself while it works). A stage killed between two commits, or
after its last commit but before its run row says `completed`, leaves rows no reader, SQL view,
training mix or deduplication sees; the next run of the stage replaces them. Writes that must not
race (a table's unique key, a slice that must still be empty) are conditional: checked against a
snapshot and committed exactly on top of it, else re-checked.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any
from urllib.parse import unquote

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from deltalake import CommitProperties, DeltaTable, QueryBuilder, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from storage import faults, fragment_reads, leases, presence, runs_table
from storage.arrow_reads import arrow_dataset
from storage.errors import LakeError, LeaseHeld, LeaseLost  # noqa: F401  (re-exported: callers catch them here)
from storage.location import LakeLocation
from storage.runs import Run, utc_now
from storage.runs_table import sql_literal
from storage.schemas import PARQUET_WRITER, POST_COMMIT, TABLES, TableSpec

RowData = pl.DataFrame | pa.Table | Iterable[pa.RecordBatch]
Condition = Callable[[DeltaTable | None], None]

# Runs in progress in this process: their own rows are visible to them before they complete.
_ACTIVE_RUNS: set[str] = set()


class _Snapshot:
    """A table as this process last saw it: the Delta table, its commit stamp, its Arrow dataset (version,
    dataset) and, for `runs`, the runs not completed at a version."""

    def __init__(self, table: DeltaTable, stamp: tuple):
        self.table, self.stamp = table, stamp
        self.dataset: tuple[int, Any] | None = None
        self.hidden: tuple[int, frozenset[str]] | None = None


_SNAPSHOTS: dict[str, _Snapshot] = {}
_SNAPSHOT_LOCK = threading.RLock()


# The same slice is read again and again within an iteration (the latest model version, the iteration's
# groups, the bank's problems): a table version is immutable, so a small result is kept per (table, version,
# filter with the visibility rule, columns) and handed out again; a new commit is a new key, and so is a run
# completing, which changes the visibility rule (the filter is keyed exactly: fragment_reads.filter_key).
READ_CACHE_ENTRIES = 256
READ_CACHE_MAX_ROWS = 20_000
_READS = fragment_reads.KeptTables(entries=READ_CACHE_ENTRIES)


def _next_dataset(table: DeltaTable, previous: "pads.FileSystemDataset | None") -> "pads.FileSystemDataset":
    """The table's Arrow dataset, built from the previous version's where it can be. delta-rs spends about 1 ms a
    file writing each file's statistics into an expression, and the loop adds a file to most tables every
    iteration, so a full build grows with the run (30-60 ms a table at 50 iterations, read after each of its
    writes: a quarter of a second a step); files are immutable, so only the files that are new since `previous`
    are built: from the partitions that hold them, or for an unpartitioned table from their Parquet footers."""
    partitions = table.metadata().partition_columns
    schema = pa.schema(table.schema().to_arrow())
    if previous is None or len(partitions) > 1 or not previous.schema.equals(schema):
        return arrow_dataset(table)
    # relative paths, as the fragments name them, in delta-rs's own order (rows come back in the order a full
    # build gives them)
    paths = pa.table(table.get_add_actions(flatten=False)).column("path").to_pylist()
    fragments = {fragment.path: fragment for fragment in previous.get_fragments()}
    new = [path for path in paths if path not in fragments]
    if new and not partitions:
        fragments.update((path, _footer_fragment(previous, path)) for path in new)
    elif new:
        values = {unquote(path.split("/", 1)[0].partition("=")[2]) for path in new}
        if any(not path.startswith(partitions[0] + "=") for path in new) or "__HIVE_DEFAULT_PARTITION__" in values:
            return arrow_dataset(table)
        built = arrow_dataset(table, file_pruning_predicate=[(partitions[0], "in", sorted(values))])
        fragments.update((fragment.path, fragment) for fragment in built.get_fragments())
    if any(path not in fragments for path in new):
        return arrow_dataset(table)
    return pads.FileSystemDataset([fragments[path] for path in paths], schema, previous.format, previous.filesystem)


def _footer_fragment(dataset: "pads.FileSystemDataset", path: str) -> "pads.ParquetFileFragment":
    """A new file of an unpartitioned table as a fragment, bounded by its footer's statistics as delta-rs bounds
    a file by the log's (read once: the fragment is kept with the process's snapshot). The integer columns'
    bounds (iteration, model_version) let a read skip the file without looking at it; other filters fall to
    Arrow's own row-group statistics, which the footer read here also holds."""
    fragment = dataset.format.make_fragment(path, filesystem=dataset.filesystem)
    try:
        fragment.ensure_complete_metadata()
    except (OSError, pa.ArrowException):    # missing or unreadable: the read that opens it says the lake is damaged
        return fragment
    bounds = _integer_bounds(fragment.metadata, dataset.schema)
    if bounds is None:
        return fragment
    bounded = dataset.format.make_fragment(path, filesystem=dataset.filesystem, partition_expression=bounds)
    bounded.ensure_complete_metadata()   # kept with the snapshot: its reads then open the file without its footer
    return bounded


def _integer_bounds(metadata, schema: pa.Schema) -> pc.Expression | None:
    """`min <= column <= max` (or null, where the file holds nulls) for each integer column whose statistics
    every row group of the file has; None when there is none."""
    bounds = None
    for index in range(metadata.num_columns):
        name = metadata.schema.column(index).path
        if name not in schema.names or not pa.types.is_integer(schema.field(name).type):
            continue
        stats = [metadata.row_group(group).column(index).statistics for group in range(metadata.num_row_groups)]
        if not stats or any(stat is None or not stat.has_min_max or stat.null_count is None for stat in stats):
            continue
        low, high = min(stat.min for stat in stats), max(stat.max for stat in stats)
        within = (pc.field(name) >= low) & (pc.field(name) <= high)
        if any(stat.null_count for stat in stats):
            within = within | pc.field(name).is_null()
        bounds = _and(bounds, within)
    return bounds


def _entry_dataset(entry: _Snapshot) -> "pads.FileSystemDataset":
    """A snapshot's Arrow dataset at its table's version, built once per version (under the snapshot lock)."""
    if entry.dataset is None or entry.dataset[0] != entry.table.version():
        entry.dataset = (entry.table.version(), _next_dataset(entry.table, entry.dataset[1] if entry.dataset else None))
    return entry.dataset[1]


def _partitions(spec: TableSpec, existing: DeltaTable | None) -> list[str] | None:
    """The partition columns a write uses: the table's own once it exists (a lake made when the iteration tables
    were partitioned keeps them so), the contract's for a new one."""
    columns = existing.metadata().partition_columns if existing is not None else list(spec.partition_by)
    return list(columns) or None


def _not_completed(runs: DeltaTable) -> frozenset[str]:
    known = runs_table.not_completed(runs)
    if known is not None:
        return known
    rows = QueryBuilder().register("runs", runs).execute("select run_id from runs where status <> 'completed'").read_all()
    return frozenset(rows["run_id"].to_pylist())


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
        """The Delta table, optionally time-travelled; None when it has never been written. A table whose log
        or files are damaged raises a LakeError that names it (the other tables stay readable)."""
        try:
            table = DeltaTable(self.location.table_uri(name), storage_options=self.location.storage_options())
            if version is not None:
                table.load_as_version(version)
        except TableNotFoundError:
            return None
        except (DeltaError, OSError) as error:
            raise self.damaged(name, error) from None
        return table

    def damaged(self, name: str, error: BaseException) -> LakeError:
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        return LakeError(f"table {name} in {self.uri} cannot be read ({first_line}); run `rlvr doctor --lake "
                         f"{self.uri}` to see what is wrong")

    def exists(self, name: str) -> bool:
        return self.table(name) is not None

    def existing_tables(self) -> list[str]:
        return [name for name in TABLES if self.exists(name)]

    def read(self, name: str, filter: pc.Expression | None = None, columns: list[str] | None = None,
             version: int | None = None, raw: bool = False) -> pl.DataFrame:
        """Visible rows of a table as a Polars frame (`raw`: every row, whoever wrote it); an empty frame
        with the contract's schema if absent."""
        snapshot = self._snapshot(name, version)
        if snapshot is None:
            empty = TABLES[name].schema.empty_table()
            return pl.from_arrow(empty.select(columns) if columns else empty)
        if not raw:
            filter = _and(filter, self._visible(name))
        present = set(snapshot[1].schema.names)
        wanted = columns if columns is not None else TABLES[name].schema.names
        read = [c for c in wanted if c in present]
        stamp = snapshot[2]                            # None when time-travelled: not cached
        table = self._snapshot_key(name)                # the location with its storage options (an endpoint)
        key = (table, stamp, fragment_reads.filter_key(filter), tuple(read))
        data = _READS.get(key) if stamp is not None else None
        if data is None:
            try:
                data = snapshot[1].to_table(filter=filter, columns=read) if stamp is None else fragment_reads.scan(
                    table, snapshot[1], filter, read)   # the new files' parts only
            except (DeltaError, OSError) as error:     # a data file the log names is missing or unreadable
                raise self.damaged(name, error) from None
            if stamp is not None and data.num_rows <= READ_CACHE_MAX_ROWS:
                _READS.put(key, data)
        for column in wanted:                          # a column added to the contract after this table was written
            if column not in present:
                field = TABLES[name].schema.field(column)
                data = data.append_column(field, pa.nulls(data.num_rows, field.type))
        return pl.from_arrow(data.select(wanted) if columns is not None else data)

    def dataset(self, name: str, version: int | None = None, runs_version: int | None = None):
        """A table's visible rows as a lazy Arrow dataset (what SQL reads), optionally as of a table version and
        the `runs` version that says which runs had completed; None when the table does not exist."""
        snapshot = self._snapshot(name, version)
        if snapshot is None:
            return None
        visible = self._visible(name, runs_version)
        return snapshot[1] if visible is None else snapshot[1].filter(visible)

    def _snapshot(self, name: str, version: int | None = None):
        """(Delta table, its Arrow dataset, its commit stamp: None when time-travelled). The latest version of
        each table is kept per process (shared by every `Lake` of the same location: each stage opens its
        own, see `_cached`), and its dataset is built once per version: building it is most of what a small
        read costs."""
        if version is not None:
            table = self.table(name, version)
            return None if table is None else (table, arrow_dataset(table), None)
        with _SNAPSHOT_LOCK:
            entry = self._cached(name)
            if entry is None:
                return None
            return entry.table, _entry_dataset(entry), entry.stamp

    def _dataset_of(self, name: str, table: DeltaTable) -> "pads.FileSystemDataset":
        """`table`'s Arrow dataset: the process's, built on from its last, when `table` is the process's snapshot
        (a write's conditions check the table they commit on, most often that one); else built in full."""
        with _SNAPSHOT_LOCK:
            entry = _SNAPSHOTS.get(self._snapshot_key(name))
            return _entry_dataset(entry) if entry is not None and entry.table is table else arrow_dataset(table)

    def _snapshot_key(self, name: str) -> str:
        return self.location.table_uri(name) + "|" + json.dumps(self.location.storage_options(), sort_keys=True)

    def _cached(self, name: str) -> "_Snapshot | None":
        """The process's snapshot of a table, up to date; reopened when the table at this location is no longer
        the one cached (its current commit file changed or vanished: a lake removed and made again)."""
        key = self._snapshot_key(name)
        entry = _SNAPSHOTS.get(key)
        if entry is not None:
            try:
                if self._commit_stamp(name, entry.table.version()) != entry.stamp:
                    raise FileNotFoundError("replaced")
                if self._has_commit(name, entry.table.version() + 1):   # commits are numbered without gaps: one
                    entry.table.update_incremental()                   # look, not a listing of the whole log
                    entry.stamp = self._commit_stamp(name, entry.table.version())
            except FileNotFoundError:
                _SNAPSHOTS.pop(key, None)
                entry = None
            except (DeltaError, OSError) as error:
                _SNAPSHOTS.pop(key, None)
                raise self.damaged(name, error) from None
        if entry is None:
            table = self.table(name)
            if table is None:
                return None
            entry = _SNAPSHOTS[key] = _Snapshot(table, self._commit_stamp(name, table.version()))
        return entry

    def log_path(self, name: str, file: str = "") -> str:
        """Where a table's Delta log (or `file` in it) is, on the lake's filesystem (`location.filesystem`)."""
        return self.location.table_uri(name).removeprefix("s3://") + "/_delta_log" + (f"/{file}" if file else "")

    def commit_files(self, name: str) -> list[str]:
        """The paths of a table's commit files, newest first, listed afresh (s3fs caches listings)."""
        fs, log = self.location.filesystem, self.log_path(name)
        fs.invalidate_cache(log)
        return sorted((path for path in fs.ls(log, detail=False) if path.endswith(".json")), reverse=True)

    def _log_file(self, name: str, version: int):
        """(filesystem, path) of a table's commit file `version`, with s3fs's cached details of it dropped."""
        path = self.log_path(name, f"{version:020d}.json")
        fs = self.location.filesystem
        if self.location.is_s3:
            fs.invalidate_cache(path)
        return fs, path

    def _has_commit(self, name: str, version: int) -> bool:
        fs, path = self._log_file(name, version)
        return fs.exists(path)

    def _commit_stamp(self, name: str, version: int) -> tuple:
        """What identifies a table's commit `version` at this location: its log file's size and time (and, on
        S3, its ETag: a content hash, since a time there has whole seconds)."""
        fs, path = self._log_file(name, version)
        info = fs.info(path)
        return version, info.get("size"), info.get("mtime"), info.get("ETag"), str(info.get("LastModified"))

    def _on_snapshot(self, name: str, write: Callable[[DeltaTable | None], Any]) -> Any:
        """Run `write` on the process's snapshot of a table (None when the table does not exist yet), brought up
        to date under the snapshot lock; after it, the snapshot is delta-rs's own post-commit state (dropped and
        reopened when another writer's commit landed in between). A fresh open replays the
        log since its last checkpoint (up to 100 commit files): about half of what a small write costs. A
        write that fails drops the snapshot, which is reopened from the log next time."""
        with _SNAPSHOT_LOCK:
            entry = self._cached(name)
            try:
                before = entry.table.version() if entry is not None else None
                result = write(entry.table if entry is not None else None)
                if entry is not None and entry.table.version() == before + 1:
                    entry.stamp = self._commit_stamp(name, entry.table.version())   # delta-rs holds the new state
                elif entry is not None and entry.table.version() != before:   # another writer's commit landed
                    _SNAPSHOTS.pop(self._snapshot_key(name), None)               # first: reopened from the log
            except BaseException:
                _SNAPSHOTS.pop(self._snapshot_key(name), None)
                raise
            return result

    def hidden_runs(self, runs_version: int | None = None) -> frozenset[str]:
        """Runs whose rows readers must not see: every run not `completed` (running elsewhere, killed,
        failed, abandoned, rolled back), except this process's own runs in progress."""
        if runs_version is not None:
            runs = self.table("runs", runs_version)
            return frozenset() if runs is None else _not_completed(runs) - _ACTIVE_RUNS
        with _SNAPSHOT_LOCK:
            entry = self._cached("runs")
            if entry is None:
                return frozenset()
            if entry.hidden is None or entry.hidden[0] != entry.table.version():   # no Arrow dataset to build
                entry.hidden = (entry.table.version(), _not_completed(entry.table))
            return entry.hidden[1] - _ACTIVE_RUNS

    def _visible(self, name: str, runs_version: int | None = None) -> pc.Expression | None:
        if name == "runs" or "run_id" not in TABLES[name].schema.names:
            return None
        hidden = self.hidden_runs(runs_version)
        return ~pc.field("run_id").isin(sorted(hidden)) if hidden else None

    # ---- writing -------------------------------------------------------------------------
    def replace(self, name: str, rows: RowData, key: dict[str, Any], run: Run, only_if_empty: bool = False) -> int:
        """Atomically replace the rows whose key columns equal `key` with `rows`; returns the new version.

        `only_if_empty`: a conditional commit that refuses when the slice already holds visible rows of another
        run (how numbers such as model versions are allocated); an orphan slice, left by a run that never
        completed, is replaced."""
        spec = TABLES[name]
        if not spec.replace_key or not set(spec.replace_key) <= set(key):
            raise LakeError(f"{name}: a replace key {sorted(key)} must include the slice columns {list(spec.replace_key)}")
        conditions = [self._slice_empty(spec, key, run)] if only_if_empty else []
        return self._write(spec, rows, run, key=key, predicate=_key_predicate(key), conditions=conditions)

    def clear(self, name: str, key: dict[str, Any], run: Run) -> int | None:
        """Empty a slice (a replace by no rows); no commit when it holds no row at all, visible or not, which
        is the common case of a fresh iteration (four empty commits an iteration otherwise). Returns the new
        version, or None when there was nothing to clear."""
        if self.read(name, filter=_key_expression(key), columns=["run_id"], raw=True).is_empty():
            return None
        return self.replace(name, pl.DataFrame(), key, run)

    def append(self, name: str, rows: RowData, run: Run) -> int:
        return self._write(TABLES[name], rows, run, key={}, predicate=None)

    def remove_rows_of_runs(self, name: str, run_ids: list[str], run: Run) -> int:
        """Delete the rows those runs wrote (one commit): how `rlvr doctor --repair` clears rows of runs that
        never completed. Returns the new version."""
        leases.check(self.location)
        metrics = retry_on_conflict(lambda: self.table(name).delete(              # idempotent: a fresh snapshot
            runs_table.run_ids_predicate(run_ids), post_commithook_properties=POST_COMMIT,
            commit_properties=CommitProperties(custom_metadata={"run_id": run.run_id, "stage": run.stage})),
            f"remove rows of {name}")
        version = self._committed_version(name, run.run_id)
        run.record_write(name, version, -int(metrics.get("num_deleted_rows", 0)))
        return version

    def restore(self, name: str, key: dict[str, Any], version: int | None, run: Run) -> int:
        """Put a slice back as it was at table `version` (None: before the table existed), keeping the
        restored rows' own run ids: the compensating write of a multi-stage re-run that failed."""
        rows = self.read(name, filter=_key_expression(key), version=version) if version is not None else pl.DataFrame()
        return self._write(TABLES[name], rows, run, key, _key_predicate(key), keep_run_ids=True)

    def _write(self, spec: TableSpec, rows: RowData, run: Run, key: dict[str, Any], predicate: str | None,
               keep_run_ids: bool = False, conditions: list[Condition] | None = None) -> int:
        conditions = list(conditions or [])
        if spec.unique:
            conditions.append(self._unique(spec, rows, key, run))
        if isinstance(rows, (pl.DataFrame, pa.Table)):   # replayable: a commit conflict is retried
            return retry_on_conflict(lambda: self._write_once(spec, rows, run, key, predicate, keep_run_ids,
                                                               conditions), f"write {spec.name}")
        if conditions:
            raise LakeError(f"{spec.name}: a conditional write needs its rows in memory, not a stream")
        return self._write_once(spec, rows, run, key, predicate, keep_run_ids)

    def _write_once(self, spec: TableSpec, rows: RowData, run: Run, key: dict[str, Any], predicate: str | None,
                    keep_run_ids: bool = False, conditions: list[Condition] | None = None) -> int:
        leases.check(self.location)                   # a writer whose lease was taken over writes nothing
        counter: dict[str, Any] = {"rows": 0, "error": None}
        reader = pa.RecordBatchReader.from_batches(
            spec.schema, _conformed_batches(spec, rows, None if keep_run_ids else run.run_id, key, counter))
        version = None
        if isinstance(rows, (pl.DataFrame, pa.Table)):    # rows in memory: committed on the process's snapshot

            def commit(existing: DeltaTable | None) -> int | None:
                before = existing.version() if existing is not None else None
                bare = predicate is not None and existing is not None and self._slice_bare(spec.name, existing, key)
                self._commit_rows(spec, reader, existing, None if bare else predicate, run, conditions, counter,
                                  on_snapshot_only=bare)
                # the snapshot one commit on: that commit is this write's (else the log says which one is)
                return existing.version() if existing is not None and existing.version() == before + 1 else None

            version = self._on_snapshot(spec.name, commit)
        else:                                          # a stream may take long: no lock held while it is read
            self._commit_rows(spec, reader, self.table(spec.name), predicate, run, conditions, counter)
        version = version if version is not None else self._committed_version(spec.name, run.run_id)
        run.record_write(spec.name, version, counter["rows"], slice_key=predicate)
        faults.point(f"committed:{run.stage}:{spec.name}")
        return version

    def _commit_rows(self, spec: TableSpec, reader, existing: DeltaTable | None, predicate: str | None, run: Run,
                     conditions: list[Condition] | None, counter: dict[str, Any],
                     on_snapshot_only: bool = False) -> None:
        """Commit the rows: an overwrite of the `predicate`'s rows, else an append. `on_snapshot_only` (as with
        conditions): the commit lands right on `existing`'s version or is refused (CommitFailedError), so that
        what was checked on that snapshot still holds when it lands."""
        for condition in conditions or []:            # checked on this snapshot; the commit must land right on it
            condition(existing)
        grows = existing is not None and not set(spec.schema.names) <= {f.name for f in existing.schema().fields}
        try:
            write_deltalake(
                existing if existing is not None else self.location.table_uri(spec.name),
                reader,
                mode="overwrite" if predicate and existing is not None else "append",
                predicate=predicate if existing is not None else None,
                partition_by=_partitions(spec, existing),
                schema_mode="merge" if grows else None,       # the contract gained nullable columns since
                storage_options=self.location.storage_options(), writer_properties=PARQUET_WRITER,
                post_commithook_properties=POST_COMMIT,
                commit_properties=CommitProperties(custom_metadata={"run_id": run.run_id, "stage": run.stage},
                                                   max_commit_retries=0 if conditions or on_snapshot_only else None),
            )
        except Exception:
            if counter["error"] is not None:   # the rows' own failure, not delta-rs's wrapping of it
                raise counter["error"] from None
            raise

    def _slice_bare(self, name: str, existing: DeltaTable, key: dict[str, Any]) -> bool:
        """Whether the process's snapshot `existing` holds no row of the slice at all, visible or not (a fresh
        iteration's slice, most often). Then a replace is an append that lands right on that snapshot: the same
        rows without the scan for the predicate's rows that delta-rs's overwrite plans (inside the loop about
        15 % of a data commit). Only on the process's snapshot, whose dataset is at hand; any other table is
        taken as not bare."""
        with _SNAPSHOT_LOCK:
            entry = _SNAPSHOTS.get(self._snapshot_key(name))
            if entry is None or entry.table is not existing:
                return False
            dataset = _entry_dataset(entry)
        return dataset.count_rows(filter=_key_expression(key)) == 0

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
                raise LakeError(f"{spec.name}: refused commit: the rows repeat {columns} "
                                f"{repeated.row(0)} ({repeated.height} rows)")
            if existing is None:
                return
            condition = _and(pc.field(columns[0]).isin(values[columns[0]].unique().to_list()),
                             self._visible(spec.name))
            if key:
                condition = condition & ~_key_expression(key)
            clash = pl.from_arrow(self._dataset_of(spec.name, existing).to_table(
                filter=condition, columns=list(dict.fromkeys([*columns, *key, "run_id"]))))
            clash = clash.join(values, on=columns, how="semi") if len(columns) > 1 else clash
            if clash.height:
                where = ", ".join(f"{k} {clash[k][0]}" for k in key) or "the table"
                raise LakeError(f"{spec.name}: refused commit: {clash.height} row(s) would repeat a {'/'.join(columns)} "
                                f"already there (e.g. {clash[columns[0]][0]} in {where}, run {clash['run_id'][0]}); "
                                f"run `rlvr doctor --lake {self.uri}` if that is unexpected")
        return check

    def _slice_empty(self, spec: TableSpec, key: dict[str, Any], run: Run) -> Condition:
        def check(existing: DeltaTable | None) -> None:
            if existing is None:
                return
            condition = _and(_key_expression(key), self._visible(spec.name)) & (pc.field("run_id") != run.run_id)
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

    # ---- runs ----------------------------------------------------------------------------
    @contextmanager
    def run(self, flow: str, stage: str, parameters: dict[str, Any], *, bank_version: int | None = None,
            iteration: int | None = None, prefect_flow_run_id: str | None = None) -> Iterator[Run]:
        """Record a stage run in `runs`: a `running` row first, then `completed` or `failed`. Its rows become
        visible to other readers when it completes; this process's record names it meanwhile, so a run
        whose process dies is found and marked `abandoned` (`reap`)."""
        run = Run(flow=flow, stage=stage, parameters=parameters, bank_version=bank_version,
                  iteration=iteration, prefect_flow_run_id=prefect_flow_run_id)
        mine = presence.presence(self.location)
        mine.add_run(run.run_id)                       # the process record names the run before `runs` does
        _ACTIVE_RUNS.add(run.run_id)
        try:
            self._write_run_row(run.row("running"), insert=True)
            faults.point(f"run-started:{stage}")
            try:
                yield run
            except BaseException as error:
                self._write_run_row(run.row("failed", utc_now(), f"{type(error).__name__}: {error}"[:4000]),
                                    only_if_running=True)
                raise
            faults.point(f"run-ending:{stage}")
            if not self._write_run_row(run.row("completed", utc_now()), only_if_running=True):
                raise LakeError(f"run {run.run_id} was marked abandoned while it worked (its process looked dead "
                                f"to another for over {presence.lease_timeout():.0f} s); its output stays invisible")
        finally:
            _ACTIVE_RUNS.discard(run.run_id)
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
            if self._write_run_row({**row, "status": "abandoned", "ended_at": utc_now(), "error": reason},
                                   only_if_running=True):
                abandoned.append(row["run_id"])
        for record in presence.process_records(self.location):
            if not presence.alive(record):
                presence.forget(self.location, record["process_id"])
        if grant is not None and grant.taken_from is not None:
            taken = Run(flow="lease", stage="takeover", parameters={
                "lease": grant.name, "epoch": grant.epoch, "from": presence.describe(grant.taken_from),
                "from_process": grant.taken_from.get("process_id"), "abandoned_runs": abandoned})
            self._write_run_row(taken.row("completed", utc_now()), insert=True)
        return abandoned

    def dead_runs(self) -> list[tuple[dict[str, Any], str]]:
        """`running` runs whose process is dead, each with why. A run no process record names (from an older
        version, or killed before its record was written) counts once it is older than the lease timeout."""
        records = presence.process_records(self.location)
        live = {record["process_id"] for record in records if presence.alive(record)}
        owner_of = {run_id: record for record in records if record["process_id"] not in live
                    for run_id in record.get("runs", [])}
        live_runs = {run_id for record in records if record["process_id"] in live
                     for run_id in record.get("runs", [])} | _ACTIVE_RUNS
        now, dead = utc_now(), []
        for row in self.read("runs", filter=pc.field("status") == "running").iter_rows(named=True):
            owner = owner_of.get(row["run_id"])
            age = (now - row["started_at"]).total_seconds()
            if row["run_id"] in live_runs or (owner is None and age < presence.lease_timeout()):
                continue
            who = f"its process ({presence.describe(owner)}) died" if owner else "no live process runs it"
            dead.append((row, f"abandoned: {who}"))
        return dead

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

    def _write_run_row(self, row: dict[str, Any], insert: bool = False, only_if_running: bool = False) -> bool:
        """Insert or update a run's row; `only_if_running` updates it only while its status is `running` (a run
        marked abandoned stays so). Returns whether a row was written."""
        data = pa.Table.from_pylist([row], schema=TABLES["runs"].schema)

        def write(table: DeltaTable | None) -> bool:
            if insert or table is None:
                write_deltalake(table if table is not None else self.location.table_uri("runs"), data, mode="append",
                                storage_options=self.location.storage_options(), writer_properties=PARQUET_WRITER,
                                post_commithook_properties=POST_COMMIT)
                return True
            # the run's row replaced in one commit that lands right on this snapshot (or is retried on a fresh
            # one), so the status read here still holds when it lands. Not a MERGE: delta-rs writes the file a
            # MERGE rewrites with string_view columns, which a filtered read of a compacted file cannot compare
            predicate = f"run_id = {sql_literal(row['run_id'])}"
            if only_if_running:
                status = runs_table.status_of(table, row["run_id"])
                status = status if status is not None else QueryBuilder().register("runs", table).execute(
                    f"select status from runs where {predicate}").read_all()["status"].to_pylist()
                if status != ["running"]:
                    return False
            write_deltalake(table, data, mode="overwrite", predicate=predicate,
                            storage_options=self.location.storage_options(), writer_properties=PARQUET_WRITER,
                            post_commithook_properties=POST_COMMIT,
                            commit_properties=CommitProperties(max_commit_retries=0))
            return True

        written = retry_on_conflict(lambda: self._on_snapshot("runs", write), f"record run {row['run_id']}")
        kept = _SNAPSHOTS.get(self._snapshot_key("runs"))     # counted on the snapshot as it is: no log lookups
        if kept is not None and len(kept.table.file_uris()) >= runs_table.COMPACT_FILES:
            self._on_snapshot("runs", runs_table.compact)
        return written

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
        runs = arrow_dataset(self.table("runs", lake_version)).to_table(columns=["status", "table_versions"])
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


def retry_on_conflict(commit, what: str, attempts: int = 30):
    """Delta's optimistic concurrency: a commit that lost a race is retried on a fresh snapshot."""
    for attempt in range(attempts):
        try:
            return commit()
        except CommitFailedError:
            time.sleep(random.uniform(0.02, 0.1) * min(attempt + 1, 10))
    raise LakeError(f"could not {what}: {attempts} commits in a row lost a race with concurrent writers")


def _and(left: pc.Expression | None, right: pc.Expression | None) -> pc.Expression | None:
    if left is None or right is None:
        return right if left is None else left
    return left & right


def _key_expression(key: dict[str, Any]) -> pc.Expression:
    expression = None
    for column, value in key.items():
        expression = _and(expression, pc.field(column) == value)
    return expression


def _key_predicate(key: dict[str, Any]) -> str:
    """The SQL predicate of a replaced slice: every key column equal to its value."""
    return " AND ".join(f"{column} = {sql_literal(value)}" for column, value in key.items())


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
