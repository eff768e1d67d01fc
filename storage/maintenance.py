"""`rlvr lake maintain`: a lake that lives for months keeps its files few, its logs short and its disk bounded.

Each stage commit adds small files (an iteration writes a dozen commits), and each table's log grows by one
JSON file a commit; reads list and open them all. Maintenance, per table:

1. **Compact** small files into files of about `target_file_mb` (Delta's optimize: the same rows, rewritten, a
   commit that changes no data). It lands right on the snapshot it read or not at all (`max_commit_retries=0`):
   a commit by any other writer in between refuses it, and the next maintenance tries again. So a compaction
   never commits over a concurrent writer's rows, and a live loop beside it loses and duplicates nothing. The
   `runs` table is left to its own compaction (storage/runs_table.py), which its reads depend on.
2. **Checkpoint** the log at its current version: readers then start from one Parquet file, not every commit;
   commit files older than both the checkpoint and `retention_hours` are removed (the table's log retention is
   set to it), so a table's log holds the retention's commits, not the run's.
3. **Vacuum** files no version newer than `retention_hours` references: time travel (`rlvr sql --as-of`) keeps
   working inside the retention; before it, the versions' files are gone. A reader holding a snapshot older
   than the retention would lose its files, so keep the retention longer than any query or run step.

Each maintenance is a stage run of flow `lake-maintenance` (what it did in its parameters), so `rlvr doctor`
can say when the last one ran; it holds the lake's `maintenance` lease, not the loop's, so it runs beside a live
loop but never beside another maintenance. The loop never imports this module (`upkeep-beside-the-loop` contract).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field

import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import CommitProperties
from pydantic import BaseModel, Field

from storage.lake import Lake, retry_on_conflict
from storage.schemas import PARQUET_WRITER, TABLES

FLOW = "lake-maintenance"
LEASE = "maintenance"  # two maintenances of one lake never overlap
OWN_COMPACTION = ("runs",)  # compacted by its writers (storage/runs_table.py)
MB = 1024 * 1024


class MaintenanceConfig(BaseModel):
    """What `rlvr lake maintain` and the `lake-maintenance` deployment do."""

    model_config = {"extra": "forbid"}

    tables: list[str] | None = Field(None, description="tables to maintain (default: every table the lake has)")
    compact: bool = Field(True, description="rewrite small files into files of about target_file_mb")
    target_file_mb: float = Field(128.0, gt=0, description="size compaction aims for; smaller files count as small")
    small_file_mb: float = Field(8.0, gt=0, description="files under this size are small in `rlvr doctor`'s count")
    checkpoint: bool = Field(True, description="write a Delta checkpoint at each table's current version")
    vacuum: bool = Field(True, description="delete files no version inside the retention references")
    retention_hours: float = Field(
        168.0,
        ge=0,
        description="time travel is kept this far back (whole hours, "
        "rounded up); older versions' files are vacuumed (keep it longer than any query "
        "or run step)",
    )


@dataclass
class TableLayout:
    """A table's files as its current version names them."""

    table: str
    version: int
    files: int
    small_files: int  # small files that share a partition with another (compaction merges them)
    bytes: int
    last_checkpoint: int | None  # the version of the log's latest checkpoint, None without one


@dataclass
class TableMaintenance:
    table: str
    files_before: int
    files_after: int
    compacted: str = "skipped"  # done, nothing to do, refused (a concurrent commit), or skipped
    checkpoint: int | None = None
    vacuumed_files: int = 0
    log_files: int = 0  # commit files left in the log (those inside the retention)
    notes: list[str] = field(default_factory=list)


def layout(lake: Lake, name: str, small_file_mb: float = 8.0) -> TableLayout | None:
    table = lake.table(name)
    if table is None:
        return None
    actions = table.get_add_actions(flatten=True)
    sizes = actions.column("size_bytes").to_pylist() if actions.num_rows else []
    partitions = [c for c in actions.column_names if c.startswith("partition.")]
    small_by_partition = Counter(
        tuple(actions.column(c)[i].as_py() for c in partitions)
        for i, size in enumerate(sizes)
        if size < small_file_mb * MB
    )
    return TableLayout(
        name,
        table.version(),
        len(sizes),
        sum(n for n in small_by_partition.values() if n > 1),
        sum(sizes),
        last_checkpoint(lake, name),
    )


def last_checkpoint(lake: Lake, name: str) -> int | None:
    path = lake.log_path(name, "_last_checkpoint")
    try:
        with lake.location.filesystem.open(path, "rb") as handle:
            return int(json.loads(handle.read())["version"])
    except (FileNotFoundError, KeyError, ValueError):
        return None


def last_maintenance(lake: Lake) -> dict | None:
    """The latest completed maintenance run: when it ended and what it did."""
    if not lake.exists("runs"):
        return None
    runs = lake.read(
        "runs",
        filter=(pc.field("flow") == FLOW) & (pc.field("status") == "completed"),
        columns=["run_id", "ended_at", "parameters"],
    )
    return None if runs.is_empty() else runs.sort("ended_at").row(-1, named=True)


def maintain_table(lake: Lake, name: str, config: MaintenanceConfig) -> TableMaintenance:
    table = lake.table(name)
    before = len(table.file_uris())
    done = TableMaintenance(name, before, before)
    if config.compact and name not in OWN_COMPACTION:
        done.compacted = _compact(table, config)
        table = lake.table(name)
    if config.vacuum:  # first: its own commits (VACUUM START, END) then checkpointed too
        try:
            done.vacuumed_files = len(
                table.vacuum(
                    retention_hours=math.ceil(config.retention_hours), dry_run=False, enforce_retention_duration=False
                )
            )
        except DeltaError as error:  # e.g. a writer's commit raced the vacuum's own; next time
            done.notes.append(f"vacuum: {error}")
        table = lake.table(name)
    if config.checkpoint:
        _keep_history_for(lake, name, config.retention_hours, table)
        table = lake.table(name)
        table.create_checkpoint()
        done.checkpoint = table.version()
        table.cleanup_metadata()
    done.log_files = len(lake.commit_files(name))
    done.files_after = len(lake.table(name).file_uris())
    return done


def _keep_history_for(lake: Lake, name: str, retention_hours: float, snapshot: DeltaTable) -> None:
    """Make the table's log retention the maintenance's: `cleanup_metadata` then removes the commit files older
    than the latest checkpoint and than this. Delta's default (30 days) kept a commit file for every write of a
    month: `runs` takes ten commits an iteration, and delta-rs lists the log on each write, so every write slowed
    as the log grew (`rlvr bench lake-scale`). Only the log's: the removed files' retention, which `vacuum`
    without an explicit one (`rlvr doctor --repair`) reads, stays Delta's week, so a short maintenance
    retention never lets another vacuum delete a live writer's files.

    The property change reads the whole table, so a live loop's replace of any partition since `snapshot`
    refuses it; it is retried on a fresh snapshot (it changes no data, so landing later is safe)."""
    interval = f"interval {math.ceil(retention_hours)} hours"
    snapshots = iter([snapshot])

    def set_once() -> None:
        table = next(snapshots, None) or lake.table(name)
        if table.metadata().configuration.get("delta.logRetentionDuration") != interval:
            table.alter.set_table_properties(
                {"delta.logRetentionDuration": interval},
                raise_if_not_exists=False,
                commit_properties=CommitProperties(custom_metadata={"stage": "lake-maintenance"}),
            )

    retry_on_conflict(set_once, f"set the log retention of table {name}")


def _compact(table: DeltaTable, config: MaintenanceConfig) -> str:
    try:
        metrics = table.optimize.compact(
            target_size=int(config.target_file_mb * MB),  # one commit, all partitions
            writer_properties=PARQUET_WRITER,
            commit_properties=CommitProperties(custom_metadata={"stage": "lake-maintenance"}, max_commit_retries=0),
        )
    except CommitFailedError:
        return "refused: another writer committed meanwhile"
    return "done" if metrics.get("numFilesRemoved", 0) else "nothing to do"


def maintain(lake: Lake, config: MaintenanceConfig, progress=None) -> list[TableMaintenance]:
    """Maintain each table (see the module's docstring), as one stage run of flow `lake-maintenance`."""
    names = config.tables or [name for name in TABLES if lake.exists(name)]
    unknown = sorted(set(names) - set(TABLES))
    if unknown:
        raise ValueError(f"tables {unknown} are not in the lake's contract (known: {sorted(TABLES)})")
    results = []
    with lake.lease(LEASE), lake.run(FLOW, "maintain", config.model_dump(mode="json")) as run:
        for name in names:
            if lake.exists(name):
                results.append(maintain_table(lake, name, config))
            if progress is not None:
                progress(name)
        run.parameters["results"] = [asdict(result) for result in results]  # recorded as the run completes
    return results
