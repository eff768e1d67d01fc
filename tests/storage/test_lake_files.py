"""The lake's files: `runs` compacted as it grows, iteration tables one slice an iteration (and older lakes'
partitions kept), a replace of a bare slice as an append on the snapshot it checked, and reads that open only
the files new since the last read."""

from __future__ import annotations

from datetime import UTC

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from helpers import batch_rows, write


def test_runs_are_compacted_into_one_file_without_losing_or_repeating_a_row(lake, monkeypatch):
    """`runs` grows by a file per row written; COMPACT_FILES small files are rewritten as one with the same rows.
    A rewrite planned on a stale snapshot is refused, and delta-rs refuses an update read before a rewrite
    (the lake then retries it on a fresh snapshot): no run row is lost or doubled."""
    from deltalake import CommitProperties, DeltaTable, write_deltalake
    from deltalake.exceptions import CommitFailedError

    from storage import runs_table as runs_module

    def runs_table() -> DeltaTable:
        return DeltaTable(lake.location.table_uri("runs"), storage_options=lake.location.storage_options())

    monkeypatch.setattr(runs_module, "COMPACT_FILES", 3)
    runs = [write(lake, version, ["s"]) for version in range(3)]  # the third run's start row makes 3 files
    assert len(runs_table().file_uris()) == 1
    assert any(info.get("stage") == "compact-runs" for info in runs_table().history())
    assert sorted(lake.read("runs")["run_id"]) == sorted(run.run_id for run in runs)
    assert set(lake.read("runs")["status"]) == {"completed"}

    monkeypatch.setattr(runs_module, "COMPACT_FILES", 1)
    stale = runs_table()
    runs.append(write(lake, 3, ["s"]))  # commits after `stale` was read (and compacts again)
    version = runs_table().version()
    runs_module.compact(stale)  # a rewrite of what `stale` holds: refused
    assert runs_table().version() == version
    assert sorted(lake.read("runs")["run_id"]) == sorted(run.run_id for run in runs)

    stale = runs_table()
    runs_module.compact(runs_table())  # a rewrite lands after `stale` was read
    update = pa.Table.from_pylist([runs[0].row("failed")], schema=pa.schema(stale.schema().to_arrow()))
    with pytest.raises(CommitFailedError):  # a run row's update, as the lake makes it, on `stale`
        write_deltalake(
            stale,
            update,
            mode="overwrite",
            predicate=f"run_id = '{runs[0].run_id}'",
            storage_options=lake.location.storage_options(),
            commit_properties=CommitProperties(max_commit_retries=0),
        )
    assert lake.read("runs").height == 4 and set(lake.read("runs")["status"]) == {"completed"}
    first = lake.read("runs", filter=pc.field("run_id") == runs[1].run_id)  # a filtered read of the compacted file
    assert first.height == 1 and first["bank_version"][0] == 1


def test_a_runs_file_that_holds_enough_rows_is_no_longer_rewritten(lake, monkeypatch):
    """A compaction rewrites only small files of finished runs: once a file holds SETTLED_ROWS rows it stays as
    it is (a rewrite costs at most that many rows however long the lake has lived), and a running run's file
    is left to its end (else the end would rewrite the bigger file). No row is lost or repeated."""
    from storage import runs_table as runs_module

    monkeypatch.setattr(runs_module, "COMPACT_FILES", 3)
    monkeypatch.setattr(runs_module, "SETTLED_ROWS", 4)

    def files() -> dict[str, int]:
        actions = pa.table(lake.table("runs").get_add_actions(flatten=True))
        return dict(zip(actions["path"].to_pylist(), actions["num_records"].to_pylist()))

    runs = [write(lake, version, ["s"]) for version in range(5)]
    settled = {path for path, rows in files().items() if rows >= 4}
    assert settled  # five runs' small files were rewritten into one
    runs += [write(lake, version, ["s"]) for version in range(5, 14)]
    assert settled <= set(files()), "a file that held SETTLED_ROWS rows was rewritten"
    assert len(runs_module.small_files(lake.table("runs"))) < 3
    stored = lake.read("runs")
    assert sorted(stored["run_id"]) == sorted(run.run_id for run in runs) and set(stored["status"]) == {"completed"}
    assert any(info.get("stage") == "compact-runs" for info in lake.table("runs").history())


def test_run_statuses_read_off_the_files_agree_with_the_table(lake, monkeypatch):
    """Before each update of a run's row the lake checks its status, and every read hides the runs not
    completed; both are read off the files' statistics (a run's row written as a file of its own, a compacted
    file of completed runs) and the kept contents of the other files, not by a query. They agree with a query
    of the table throughout: running, failed, rolled-back and completed runs, compacted or not."""
    from deltalake import QueryBuilder

    from storage import runs_table as runs_module
    from storage.runs import utc_now

    monkeypatch.setattr(runs_module, "COMPACT_FILES", 3)
    read_files = []
    monkeypatch.setattr(
        runs_module,
        "_read_statuses",
        lambda table, paths, read=runs_module._read_statuses: read_files.extend(paths) or read(table, paths),
    )

    def check() -> None:
        table = lake.table("runs")
        stored = QueryBuilder().register("runs", table).execute("select run_id, status from runs").read_all()
        rows = dict(zip(stored["run_id"].to_pylist(), stored["status"].to_pylist()))
        assert runs_module.not_completed(table) == {run_id for run_id, status in rows.items() if status != "completed"}
        for run_id, status in rows.items():
            assert runs_module.status_of(table, run_id) == [status], run_id
        assert runs_module.status_of(table, "20000101T000000-00000000") == []

    started = utc_now()
    for version in range(4):
        write(lake, version, ["s"], iteration=1)
        check()
    with lake.run("test-flow", "test-stage", {}, bank_version=9):  # in progress: its own file says `running`
        check()
    with pytest.raises(RuntimeError):
        with lake.run("test-flow", "test-stage", {}, bank_version=10):
            raise RuntimeError("a stage failed")
    check()
    assert lake.mark_runs(1, {"test-stage"}, since=started, status="rolled_back")  # rows in a compacted file
    check()
    for version in range(11, 15):
        write(lake, version, ["s"])
        check()
    assert read_files  # some answers came from a compacted file's contents


def groups_of(iteration: int, names: list[str]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "iteration": [iteration] * len(names),
            "group_id": names,
            "problem_id": names,
            "n_samples": [4] * len(names),
            "kept": [True] * len(names),
        }
    )


def replace_groups(lake, iteration: int, names: list[str]) -> None:
    with lake.run("test-flow", "test-stage", {}, iteration=iteration) as run:
        lake.replace("groups", groups_of(iteration, names), {"iteration": iteration}, run)


def test_an_iteration_table_is_one_slice_an_iteration_in_files_compaction_merges(lake):
    """Iteration tables are not partitioned: maintenance compacts many iterations into one file, and a replace of
    an old iteration then swaps exactly its rows out of that file."""
    from storage.maintenance import MaintenanceConfig, maintain

    for iteration in (1, 2, 3):
        replace_groups(lake, iteration, [f"g{iteration}-a", f"g{iteration}-b"])
    assert lake.table("groups").metadata().partition_columns == [] and len(lake.table("groups").file_uris()) == 3
    maintain(lake, MaintenanceConfig(tables=["groups"]))
    assert len(lake.table("groups").file_uris()) == 1
    replace_groups(lake, 2, ["g2-again"])
    assert sorted(lake.read("groups")["group_id"]) == ["g1-a", "g1-b", "g2-again", "g3-a", "g3-b"]
    with lake.run("test-flow", "test-stage", {}, iteration=3) as run:
        lake.clear("groups", {"iteration": 3}, run)
    assert sorted(lake.read("groups")["group_id"]) == ["g1-a", "g1-b", "g2-again"]


def test_a_lake_whose_iteration_tables_were_made_partitioned_keeps_them_so(lake):
    """A lake written before the iteration tables lost their partitions: each write follows the table's own."""
    from deltalake import write_deltalake

    from storage.schemas import TABLES

    write_deltalake(
        lake.location.table_uri("groups"),
        TABLES["groups"].schema.empty_table(),
        partition_by=["iteration"],
        storage_options=lake.location.storage_options(),
    )
    for iteration, names in ((1, ["a"]), (2, ["b", "c"]), (1, ["d"])):
        replace_groups(lake, iteration, names)
    table = lake.table("groups")
    assert table.metadata().partition_columns == ["iteration"]
    assert all("iteration=" in uri for uri in table.file_uris())
    assert sorted(lake.read("groups").select("iteration", "group_id").rows()) == [(1, "d"), (2, "b"), (2, "c")]


def test_a_partitioned_table_written_before_a_column_was_added_takes_replaces_with_it(lake):
    """An older lake's `iteration_metrics`: partitioned by iteration, without `mean_self_certainty`. A replace adds
    the column (schema merge) and swaps exactly its slice."""
    from datetime import datetime

    from deltalake import write_deltalake

    from storage.schemas import TABLES

    older = pa.schema([f for f in TABLES["iteration_metrics"].schema if f.name != "mean_self_certainty"])
    now = datetime.now(UTC)
    rows = [
        {**dict.fromkeys(older.names), "iteration": i, "model_version": 0, "run_id": "before", "created_at": now}
        for i in (1, 2)
    ]
    write_deltalake(
        lake.location.table_uri("iteration_metrics"),
        pa.Table.from_pylist(rows, schema=older),
        partition_by=["iteration"],
        storage_options=lake.location.storage_options(),
    )
    with lake.run("test-flow", "test-stage", {}, iteration=2) as run:
        lake.replace(
            "iteration_metrics",
            pl.DataFrame([{"iteration": 2, "model_version": 1, "created_at": now, "mean_self_certainty": 0.7}]),
            {"iteration": 2},
            run,
        )
    read = lake.read("iteration_metrics", raw=True).sort("iteration")
    assert read.select("iteration", "model_version", "mean_self_certainty").rows() == [(1, 0, None), (2, 1, 0.7)]
    assert lake.table("iteration_metrics").metadata().partition_columns == ["iteration"]


def _operations(lake, name: str) -> list[str]:
    """Each commit of a table, oldest first: its operation and (for a write) its mode."""
    history = reversed(lake.table(name).history())
    return [f"{commit['operation']}:{commit.get('operationParameters', {}).get('mode', '')}" for commit in history]


def test_a_replace_of_a_bare_slice_is_an_append_that_lands_on_the_snapshot_it_checked(lake):
    """A fresh iteration's slice holds no row: its replace commits as an append (without the scan for the
    predicate's rows an overwrite plans); a slice that holds rows, visible or not, is overwritten as before."""
    for iteration in (1, 2):
        with lake.run("test-flow", "test-stage", {}) as run:
            lake.replace("batches", batch_rows(iteration, 2), {"iteration": iteration}, run)
    with lake.run("test-flow", "test-stage", {}) as run:
        lake.replace("batches", batch_rows(1, 3, "again"), {"iteration": 1}, run)
    assert _operations(lake, "batches") == ["WRITE:Append", "WRITE:Append", "WRITE:Overwrite"]
    assert lake.read("batches").group_by("iteration").len().sort("iteration").rows() == [(1, 3), (2, 2)]


def test_a_bare_slice_filled_by_another_writer_meanwhile_is_replaced_not_doubled(lake):
    """The append lands right on the snapshot whose slice was bare, or not at all: when another process's
    commit filled the slice in between, the replace is retried on a fresh snapshot as an overwrite, so the
    slice ends with this replace's rows only."""
    from deltalake import DeltaTable, write_deltalake

    with lake.run("test-flow", "test-stage", {}) as run:
        lake.replace("batches", batch_rows(1, 2), {"iteration": 1}, run)
    lake.read("batches")  # the process's snapshot, at version 0
    with lake.run("test-flow", "test-stage", {}) as other:
        rows = lake._snapshot("batches")[1].to_table().slice(0, 1)
    rows = rows.set_column(rows.schema.get_field_index("iteration"), "iteration", pa.array([2], pa.int64()))
    rows = rows.set_column(rows.schema.get_field_index("run_id"), "run_id", pa.array([other.run_id]))
    behind = DeltaTable(lake.location.table_uri("batches"), storage_options=lake.location.storage_options())
    write_deltalake(behind, rows, mode="append")  # behind the process snapshot's back
    with lake.run("test-flow", "test-stage", {}) as run:
        lake.replace("batches", batch_rows(2, 3, "mine"), {"iteration": 2}, run)
    assert _operations(lake, "batches") == ["WRITE:Append", "WRITE:Append", "WRITE:Overwrite"]
    slice_ = lake.read("batches", filter=pc.field("iteration") == 2)
    assert slice_.height == 3 and set(slice_["run_id"]) == {run.run_id}


def test_a_read_after_a_write_opens_only_the_files_new_since_the_last_read(lake, monkeypatch):
    """A table read whole after each of its writes (the latest model version, the recorded iterations) opened
    every file each time, so the read grew with the run; each file's part is read once per filter and kept
    (storage/fragment_reads.py). A run that fails after writing changes the visibility rule, so its rows are
    not served from a part read while it ran."""
    from storage import fragment_reads

    fragment_reads.forget()
    opened, original = [], fragment_reads._PARTS.put
    monkeypatch.setattr(fragment_reads._PARTS, "put", lambda key, part: opened.append(key[1]) or original(key, part))
    for iteration in range(1, 6):
        with lake.run("test-flow", "test-stage", {}) as run:
            lake.replace("batches", batch_rows(iteration, 2), {"iteration": iteration}, run)
        assert sorted(lake.read("batches", columns=["iteration"])["iteration"]) == sorted(
            [*range(1, iteration + 1)] * 2
        )
    assert len(opened) == 5 == len(set(opened))  # each file once, though read 1 + 2 + ... + 5 times
    with pytest.raises(RuntimeError), lake.run("test-flow", "test-stage", {}) as run:
        lake.replace("batches", batch_rows(6, 2), {"iteration": 6}, run)
        assert lake.read("batches", columns=["iteration"]).height == 12  # its own rows, while it runs
        raise RuntimeError("the stage fails after its write")
    assert lake.read("batches", columns=["iteration"]).height == 10
