"""Reading the lake: each table's latest version kept per process (its Delta table, commit stamp and Arrow
dataset, shared by every `Lake` of a location), brought up to date with one look at the log, and small read
results kept per (table version, filter, columns). A table version is immutable, so what was built for it
holds until the next commit; a lake removed and made again is noticed by its commit files' stamps.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import unquote

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from storage import fragment_reads
from storage.arrow_reads import arrow_dataset
from storage.errors import LakeError
from storage.predicates import both
from storage.schemas import TABLES


class Snapshot:
    """A table as this process last saw it: the Delta table, its commit stamp, its Arrow dataset (version,
    dataset) and, for `runs`, the runs not completed at a version."""

    def __init__(self, table: DeltaTable, stamp: tuple):
        self.table, self.stamp = table, stamp
        self.dataset: tuple[int, Any] | None = None
        self.hidden: tuple[int, frozenset[str]] | None = None


SNAPSHOTS: dict[str, Snapshot] = {}
SNAPSHOT_LOCK = threading.RLock()


# The same slice is read again and again within an iteration (the latest model version, the iteration's
# groups, the bank's problems): a table version is immutable, so a small result is kept per (table, version,
# filter with the visibility rule, columns) and handed out again; a new commit is a new key, and so is a run
# completing, which changes the visibility rule (the filter is keyed exactly: fragment_reads.filter_key).
READ_CACHE_ENTRIES = 256
READ_CACHE_MAX_ROWS = 20_000
READS = fragment_reads.KeptTables(entries=READ_CACHE_ENTRIES)


def next_dataset(table: DeltaTable, previous: pads.FileSystemDataset | None) -> pads.FileSystemDataset:
    """The table's Arrow dataset, built from the previous version's where it can be. delta-rs writes each file's
    statistics into an expression, and the loop adds a file to most tables every iteration, so a full build
    grows with the run, and a table is read after each of its writes (`rlvr bench lake-scale`); files are immutable, so only the files that are new since `previous`
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
        fragments.update((path, footer_fragment(previous, path)) for path in new)
    elif new:
        values = {unquote(path.split("/", 1)[0].partition("=")[2]) for path in new}
        if any(not path.startswith(partitions[0] + "=") for path in new) or "__HIVE_DEFAULT_PARTITION__" in values:
            return arrow_dataset(table)
        built = arrow_dataset(table, file_pruning_predicate=[(partitions[0], "in", sorted(values))])
        fragments.update((fragment.path, fragment) for fragment in built.get_fragments())
    if any(path not in fragments for path in new):
        return arrow_dataset(table)
    return pads.FileSystemDataset([fragments[path] for path in paths], schema, previous.format, previous.filesystem)


def footer_fragment(dataset: pads.FileSystemDataset, path: str) -> pads.ParquetFileFragment:
    """A new file of an unpartitioned table as a fragment, bounded by its footer's statistics as delta-rs bounds
    a file by the log's (read once: the fragment is kept with the process's snapshot). The integer columns'
    bounds (iteration, model_version) let a read skip the file without looking at it; other filters fall to
    Arrow's own row-group statistics, which the footer read here also holds."""
    fragment = dataset.format.make_fragment(path, filesystem=dataset.filesystem)
    try:
        fragment.ensure_complete_metadata()
    except (OSError, pa.ArrowException):  # missing or unreadable: the read that opens it says the lake is damaged
        return fragment
    bounds = integer_bounds(fragment.metadata, dataset.schema)
    if bounds is None:
        return fragment
    bounded = dataset.format.make_fragment(path, filesystem=dataset.filesystem, partition_expression=bounds)
    bounded.ensure_complete_metadata()  # kept with the snapshot: its reads then open the file without its footer
    return bounded


def integer_bounds(metadata, schema: pa.Schema) -> pc.Expression | None:
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
        bounds = both(bounds, within)
    return bounds


def entry_dataset(entry: Snapshot) -> pads.FileSystemDataset:
    """A snapshot's Arrow dataset at its table's version, built once per version (under the snapshot lock)."""
    if entry.dataset is None or entry.dataset[0] != entry.table.version():
        entry.dataset = (entry.table.version(), next_dataset(entry.table, entry.dataset[1] if entry.dataset else None))
    return entry.dataset[1]


class SnapshotReads:
    """`Lake`'s reads: tables, visible rows, datasets, and the process's snapshot of each table (the location is
    `self.location`; which rows are visible is `Visibility`'s)."""

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
        return LakeError(
            f"table {name} in {self.uri} cannot be read ({first_line}); run `rlvr doctor --lake "
            f"{self.uri}` to see what is wrong"
        )

    def exists(self, name: str) -> bool:
        return self.table(name) is not None

    def existing_tables(self) -> list[str]:
        return [name for name in TABLES if self.exists(name)]

    def read(
        self,
        name: str,
        filter: pc.Expression | None = None,
        columns: list[str] | None = None,
        version: int | None = None,
        raw: bool = False,
    ) -> pl.DataFrame:
        """Visible rows of a table as a Polars frame (`raw`: every row, whoever wrote it); an empty frame
        with the contract's schema if absent."""
        snapshot = self._snapshot(name, version)
        if snapshot is None:
            empty = TABLES[name].schema.empty_table()
            return pl.from_arrow(empty.select(columns) if columns else empty)
        if not raw:
            filter = both(filter, self._visible(name))
        present = set(snapshot[1].schema.names)
        wanted = columns if columns is not None else TABLES[name].schema.names
        read = [c for c in wanted if c in present]
        stamp = snapshot[2]  # None when time-travelled: not cached
        table = self._snapshot_key(name)  # the location with its storage options (an endpoint)
        key = (table, stamp, fragment_reads.filter_key(filter), tuple(read))
        data = READS.get(key) if stamp is not None else None
        if data is None:
            try:
                data = (
                    snapshot[1].to_table(filter=filter, columns=read)
                    if stamp is None
                    else fragment_reads.scan(table, snapshot[1], filter, read)
                )  # the new files' parts only
            except (DeltaError, OSError) as error:  # a data file the log names is missing or unreadable
                raise self.damaged(name, error) from None
            if stamp is not None and data.num_rows <= READ_CACHE_MAX_ROWS:
                READS.put(key, data)
        for column in wanted:  # a column added to the contract after this table was written
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
        with SNAPSHOT_LOCK:
            entry = self._cached(name)
            if entry is None:
                return None
            return entry.table, entry_dataset(entry), entry.stamp

    def _dataset_of(self, name: str, table: DeltaTable) -> pads.FileSystemDataset:
        """`table`'s Arrow dataset: the process's, built on from its last, when `table` is the process's snapshot
        (a write's conditions check the table they commit on, most often that one); else built in full."""
        with SNAPSHOT_LOCK:
            entry = SNAPSHOTS.get(self._snapshot_key(name))
            return entry_dataset(entry) if entry is not None and entry.table is table else arrow_dataset(table)

    def _snapshot_key(self, name: str) -> str:
        return self.location.table_uri(name) + "|" + json.dumps(self.location.storage_options(), sort_keys=True)

    def _cached(self, name: str) -> Snapshot | None:
        """The process's snapshot of a table, up to date; reopened when the table at this location is no longer
        the one cached (its current commit file changed or vanished: a lake removed and made again)."""
        key = self._snapshot_key(name)
        entry = SNAPSHOTS.get(key)
        if entry is not None:
            try:
                if self._commit_stamp(name, entry.table.version()) != entry.stamp:
                    raise FileNotFoundError("replaced")
                if self._has_commit(name, entry.table.version() + 1):  # commits are numbered without gaps: one
                    entry.table.update_incremental()  # look, not a listing of the whole log
                    entry.stamp = self._commit_stamp(name, entry.table.version())
            except FileNotFoundError:
                SNAPSHOTS.pop(key, None)
                entry = None
            except (DeltaError, OSError) as error:
                SNAPSHOTS.pop(key, None)
                raise self.damaged(name, error) from None
        if entry is None:
            table = self.table(name)
            if table is None:
                return None
            entry = SNAPSHOTS[key] = Snapshot(table, self._commit_stamp(name, table.version()))
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
        log since its last checkpoint (up to 100 commit files), much of what a small write costs. A
        write that fails drops the snapshot, which is reopened from the log next time."""
        with SNAPSHOT_LOCK:
            entry = self._cached(name)
            try:
                before = entry.table.version() if entry is not None else None
                result = write(entry.table if entry is not None else None)
                if entry is not None and entry.table.version() == before + 1:
                    entry.stamp = self._commit_stamp(name, entry.table.version())  # delta-rs holds the new state
                elif entry is not None and entry.table.version() != before:  # another writer's commit landed
                    SNAPSHOTS.pop(self._snapshot_key(name), None)  # first: reopened from the log
            except BaseException:
                SNAPSHOTS.pop(self._snapshot_key(name), None)
                raise
            return result
