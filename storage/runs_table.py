"""Keeping the `runs` table cheap to write and read as it grows.

`runs` gains a file per row written (a run's start, then its end replaces that row's file), and delta-rs
pays for each file of a table on every write, read and snapshot (an append, a conditional replace, building
an Arrow dataset: `rlvr bench lake-scale`). A loop writes ten rows an iteration. So the
small files are rewritten as one as soon as there are COMPACT_FILES of them; a file holding SETTLED_ROWS
rows is left as it is from then on, so that a rewrite never costs more than that many rows however long
the lake has lived.

Runs' statuses are read off the files' statistics where those tell them (a run's row is first written as a
file of its own; a compacted file of completed runs says so in its range of statuses), and from the other
files' contents, read once and kept (a file never changes): the status check before each update of a run's
row, and the set of runs whose rows readers must not see, cost no query of the table each.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from storage.arrow_reads import arrow_dataset
from storage.errors import LakeError
from storage.schemas import PARQUET_WRITER, POST_COMMIT

COMPACT_FILES = 16  # this many small files of `runs` are rewritten as one
SETTLED_ROWS = 2048  # a file with this many rows is no longer rewritten


def sql_literal(value: Any) -> str:
    """A string or number as a delta-rs (DataFusion) SQL literal."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise LakeError(f"unsupported key value {value!r}")
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def run_ids_predicate(run_ids: list[str]) -> str:
    """The delta-rs predicate that picks the rows of these runs."""
    return "run_id IN (" + ", ".join(sql_literal(run_id) for run_id in run_ids) + ")"


_FILE_STATUSES: OrderedDict[tuple[str, str], dict[str, str]] = OrderedDict()  # (table, file) -> {run: status}
_FILE_STATUSES_LOCK = threading.Lock()
FILES_KEPT = 64

COLUMNS = ["path", "num_records", "min.run_id", "max.run_id", "min.status", "max.status"]


def _files(table: DeltaTable) -> list[tuple] | None:
    """(path, rows, lowest and highest run id, lowest and highest status) of each file, in the log's order;
    None when the log holds no statistics."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if not set(COLUMNS) <= set(actions.column_names):
        return [] if actions.num_rows == 0 else None
    return list(zip(*(actions[column].to_pylist() for column in COLUMNS)))


def _one_run(file: tuple) -> tuple[str, str] | None:
    """(run id, status) of a file that holds one run's row, told exactly by its statistics (a truncated
    statistic is not: its lowest and highest values differ)."""
    _, rows, low_id, high_id, low_status, high_status = file
    if rows == 1 and low_id is not None and low_id == high_id and low_status is not None and low_status == high_status:
        return low_id, low_status
    return None


def _read_statuses(table: DeltaTable, paths: list[str]) -> list[dict[str, str]] | None:
    """{run id: status} of each of these files, read once and kept (a file never changes); None when the
    table's dataset does not name a file as its log does."""
    with _FILE_STATUSES_LOCK:
        missing = {path for path in paths if (table.table_uri, path) not in _FILE_STATUSES}
        if missing:
            for fragment in arrow_dataset(table).get_fragments():
                if fragment.path in missing:
                    rows = fragment.to_table(columns=["run_id", "status"])
                    _FILE_STATUSES[(table.table_uri, fragment.path)] = dict(
                        zip(rows["run_id"].to_pylist(), rows["status"].to_pylist())
                    )
        found = [_FILE_STATUSES.get((table.table_uri, path)) for path in paths]
        while len(_FILE_STATUSES) > FILES_KEPT:
            _FILE_STATUSES.popitem(last=False)
    return None if any(statuses is None for statuses in found) else found


def _held(table: DeltaTable, files: list[tuple]) -> list[dict[str, str]] | None:
    """{run id: status} of each of these files: off its statistics for a file of one run, else its kept
    contents; None when the files cannot tell."""
    ones = [_one_run(file) for file in files]
    contents = _read_statuses(table, [file[0] for file, one in zip(files, ones) if one is None])
    if contents is None:
        return None
    read = iter(contents)
    return [{one[0]: one[1]} if one is not None else next(read) for one in ones]


def status_of(table: DeltaTable, run_id: str) -> list[str] | None:
    """The statuses of the run's rows (one, for a run that exists), from the files that can hold it; None
    when the files cannot tell."""
    files = _files(table)
    held = (
        None
        if files is None
        else _held(
            table, [file for file in files if file[2] is None or file[3] is None or file[2] <= run_id <= file[3]]
        )
    )
    return None if held is None else [runs[run_id] for runs in held if run_id in runs]


def not_completed(table: DeltaTable) -> frozenset[str] | None:
    """Every run whose status is not `completed`, from the files that do not say they hold completed runs
    only; None when the files cannot tell."""
    files = _files(table)
    held = None if files is None else _held(table, [file for file in files if not file[4] == file[5] == "completed"])
    return (
        None
        if held is None
        else frozenset(run_id for runs in held for run_id, status in runs.items() if status != "completed")
    )


def small_files(table: DeltaTable) -> list[str]:
    """The files (as the table's log names them) with fewer than SETTLED_ROWS rows, but for the file of a run
    still running: that run's end replaces it (rewritten into a bigger file, the end would rewrite that one)."""
    return [
        file[0]
        for file in _files(table) or []
        if (file[1] is None or file[1] < SETTLED_ROWS) and (_one_run(file) or ("", ""))[1] != "running"
    ]


def compact(table: DeltaTable | None) -> None:
    """Rewrite the small files of finished runs as one, once there are COMPACT_FILES of them. The rewrite
    replaces exactly the rows of those files (by run id: a run has one row) and lands right on the snapshot
    they were read from or not at all: a commit by any other writer in between refuses it, and it is tried
    again at a later write; so is every update of a run's row planned before it landed. It is a data-changing
    overwrite, not delta-rs's `optimize.compact`: delta-rs 1.6 let a concurrent MERGE commit over a
    compaction that removed the file it read (a run's row then appeared twice)."""
    if table is None:
        return
    small = set(small_files(table))
    if len(small) < COMPACT_FILES:
        return
    dataset = arrow_dataset(table)
    fragments = [fragment for fragment in dataset.get_fragments() if fragment.path in small]
    if len(fragments) != len(small):  # the dataset does not name the files as the log does
        return
    rows = pads.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem).to_table()
    landing = CommitProperties(custom_metadata={"stage": "compact-runs"}, max_commit_retries=0)
    try:
        write_deltalake(
            table,
            rows,
            mode="overwrite",
            predicate=run_ids_predicate(rows["run_id"].to_pylist()),
            commit_properties=landing,
            writer_properties=PARQUET_WRITER,
            post_commithook_properties=POST_COMMIT,
        )
    except CommitFailedError:
        pass
