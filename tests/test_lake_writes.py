"""Transactional, idempotent writes and run records, against a local folder and S3 (moto)."""

import json
import subprocess
import sys
import textwrap
from datetime import UTC

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from storage.lake import LakeError
from storage.schemas import QUARANTINE


def quarantine_rows(version: int, sources: list[str]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "bank_version": [version] * len(sources),
            "source": sources,
            "source_uri": ["file.jsonl"] * len(sources),
            "source_line": list(range(1, len(sources) + 1)),
            "reason": ["bad"] * len(sources),
        }
    )


def write(lake, version, sources, **run_kwargs):
    with lake.run("test-flow", "test-stage", {"sources": sources}, bank_version=version, **run_kwargs) as run:
        lake.replace("quarantine", quarantine_rows(version, sources), {"bank_version": version}, run)
    return run


def test_replace_is_idempotent_and_touches_only_its_key(lake):
    write(lake, 1, ["a", "b"])
    write(lake, 2, ["c"])
    write(lake, 1, ["a", "b"])
    write(lake, 1, ["a", "b"])
    table = lake.read("quarantine").sort("bank_version", "source")
    assert table.select("bank_version", "source").rows() == [(1, "a"), (1, "b"), (2, "c")]


def test_every_read_goes_through_arrows_own_filesystem_not_a_python_one(lake):
    """delta-rs's default dataset reads through a Python filesystem, whose handles Arrow's threads may free while
    Python shuts down: an abort at exit (storage/arrow_reads.py). Latest, time-travelled and SQL reads alike."""
    import pyarrow.fs as pa_fs

    from storage.catalog import open_catalog

    write(lake, 1, ["a", "b"])
    write(lake, 2, ["c"])
    datasets = [lake.dataset("quarantine"), lake._snapshot("quarantine", version=0)[1]]
    for dataset in datasets:
        assert isinstance(dataset.filesystem, pa_fs.SubTreeFileSystem), dataset.filesystem
        assert isinstance(dataset.filesystem.base_fs, (pa_fs.LocalFileSystem, pa_fs.S3FileSystem))
        assert all(isinstance(fragment.filesystem, pa_fs.SubTreeFileSystem) for fragment in dataset.get_fragments())
    assert datasets[1].to_table().num_rows == 2  # version 0: the first write only
    catalog = open_catalog(lake)
    assert catalog.execute("select count(*) from quarantine").fetchone()[0] == 3
    catalog.close()


def test_every_row_carries_the_run_that_wrote_it(lake):
    first = write(lake, 1, ["a"])
    second = write(lake, 2, ["b"])
    rows = dict(lake.read("quarantine").select("source", "run_id").rows())
    assert rows == {"a": first.run_id, "b": second.run_id}
    runs = lake.read("runs").sort("started_at")
    assert runs["run_id"].to_list() == [first.run_id, second.run_id]
    assert runs["status"].to_list() == ["completed", "completed"]
    recorded = json.loads(runs["table_versions"][1])
    assert recorded == {"quarantine": lake.table("quarantine").version()}
    assert json.loads(runs["rows_written"][0]) == {"quarantine": 1}
    assert runs["code_version"][0]
    assert json.loads(runs["parameters"][0]) == {"sources": ["a"]}
    assert runs["ended_at"][0] >= runs["started_at"][0]


def test_an_exception_mid_write_leaves_the_old_table(lake):
    write(lake, 1, ["kept"])
    version_before = lake.table("quarantine").version()

    def batches_then_failure():
        yield quarantine_rows(1, ["new1", "new2"]).to_arrow().to_batches()[0]
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        with lake.run("test-flow", "test-stage", {}, bank_version=1) as run:
            lake.replace("quarantine", batches_then_failure(), {"bank_version": 1}, run)
    assert lake.table("quarantine").version() == version_before
    assert lake.read("quarantine")["source"].to_list() == ["kept"]
    failed = lake.read("runs").filter(pl.col("status") == "failed")
    assert failed.height == 1 and "disk on fire" in failed["error"][0]


def test_a_killed_process_mid_write_leaves_the_old_table(lake, lake_uri):
    if not lake.exists("quarantine"):
        write(lake, 1, ["kept"])
    script = textwrap.dedent(f"""
        import os
        import polars as pl
        from storage.lake import Lake
        lake = Lake.open({lake_uri!r})
        rows = pl.DataFrame({{"bank_version": [1], "source": ["new"], "source_uri": ["f"], "reason": ["r"]}})
        def batches():
            yield rows.to_arrow().to_batches()[0]
            os._exit(9)          # the process dies with a data file written and no commit
        with lake.run("test-flow", "test-stage", {{}}, bank_version=1) as run:
            lake.replace("quarantine", batches(), {{"bank_version": 1}}, run)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 9, result.stderr
    assert lake.read("quarantine")["source"].to_list() == ["kept"]
    assert sorted(set(lake.read("runs")["status"].to_list())) == ["completed", "running"]


def test_rows_outside_the_replaced_key_are_refused(lake):
    with pytest.raises(LakeError, match="outside the replaced slice"):
        with lake.run("f", "s", {}) as run:
            lake.replace("quarantine", quarantine_rows(2, ["x"]), {"bank_version": 1}, run)
    assert not lake.exists("quarantine")


def test_schema_is_enforced(lake):
    with lake.run("f", "s", {}) as run:
        with pytest.raises(LakeError, match="required column 'reason'"):
            lake.replace("quarantine", quarantine_rows(1, ["x"]).drop("reason"), {"bank_version": 1}, run)
        with pytest.raises(LakeError, match="not in the table's schema"):
            lake.replace("quarantine", quarantine_rows(1, ["x"]).with_columns(surprise=1), {"bank_version": 1}, run)
        with pytest.raises(LakeError, match="must include the slice columns"):
            lake.replace("quarantine", quarantine_rows(1, ["x"]), {"source": "x"}, run)
    assert not lake.exists("quarantine")
    written = lake.table("runs")
    assert written is not None


def test_written_schema_is_the_contract(lake):
    write(lake, 1, ["a"])
    written = pa.schema(lake.table("quarantine").schema().to_arrow())
    assert [(f.name, f.type) for f in written] == [(f.name, f.type) for f in QUARANTINE.schema]
    assert lake.read("quarantine").schema["source_line"] == pl.Int64


def test_lake_versions_give_consistent_snapshots(lake):
    write(lake, 1, ["a"])
    after_first = lake.runs_version()
    write(lake, 2, ["b"])
    versions = lake.versions_as_of(after_first)
    assert lake.read("quarantine", version=versions["quarantine"])["source"].to_list() == ["a"]
    with pytest.raises(LakeError, match="does not exist"):
        lake.versions_as_of(999)


def test_reading_a_missing_table_gives_the_contract_schema(lake):
    frame = lake.read("problems")
    assert frame.is_empty() and "problem_id" in frame.columns


@pytest.mark.parametrize("compact_at", [None, 2], ids=["runs-never-compacted", "runs-compacted-at-every-write"])
def test_concurrent_writers_all_commit_and_close_their_runs(lake_uri, lake, compact_at, monkeypatch):
    """Five processes race to write their slices and run rows; with `runs` compacted at every write too
    (a rewrite racing the others' updates), each run keeps exactly one row and ends completed."""
    if compact_at:
        monkeypatch.setattr("storage.runs_table.COMPACT_FILES", compact_at)
    script = textwrap.dedent(f"""
        import sys
        import polars as pl
        import storage.lake
        from storage.lake import Lake
        if {compact_at!r}:
            storage.runs_table.COMPACT_FILES = {compact_at!r}
        version = int(sys.argv[1])
        lake = Lake.open({lake_uri!r})
        rows = pl.DataFrame({{"bank_version": [version] * 3, "source": ["s"] * 3, "source_uri": ["f"] * 3, "reason": ["r"] * 3}})
        with lake.run("test-flow", "test-stage", {{}}, bank_version=version) as run:
            lake.replace("quarantine", rows, {{"bank_version": version}}, run)
    """)
    write(lake, 0, ["seed"])  # the tables exist before the race
    processes = [
        subprocess.Popen([sys.executable, "-c", script, str(v)], stderr=subprocess.PIPE, text=True) for v in range(1, 6)
    ]
    for process in processes:
        assert process.wait(240) == 0, process.stderr.read()
    runs = lake.read("runs")
    assert runs.height == 6 and set(runs["status"]) == {"completed"}, runs.select("run_id", "status")
    if compact_at:  # the rewrites happened, and left one file behind at times
        assert any(info.get("stage") == "compact-runs" for info in lake.table("runs").history())
    assert sorted(lake.read("quarantine")["bank_version"].unique().to_list()) == [0, 1, 2, 3, 4, 5]
    for row in runs.iter_rows(named=True):  # each run recorded the version of its own commit
        version = json.loads(row["table_versions"])["quarantine"]
        snapshot = lake.read("quarantine", version=version)
        assert row["bank_version"] in snapshot["bank_version"].to_list()


def test_every_lake_of_a_process_shares_one_up_to_date_snapshot_and_a_remade_lake_is_read_anew(lake, lake_uri):
    """Reads are served from one process-wide snapshot per table (each stage opens its own `Lake`): a write
    through one `Lake` is seen by another at once, repeated reads of a slice are answered from memory, and a
    lake removed and made again at the same location (same table versions) is never read from the old one."""
    from storage.lake import Lake

    other = Lake.open(lake_uri)
    write(lake, 1, ["a", "b"])
    assert sorted(other.read("quarantine")["source"]) == ["a", "b"]
    write(other, 2, ["c"])
    assert sorted(lake.read("quarantine")["source"]) == ["a", "b", "c"]
    assert lake.read("quarantine").equals(other.read("quarantine"))  # a second read of the same slice
    fs = lake.location.filesystem
    fs.rm(lake_uri.removeprefix("s3://"), recursive=True)
    remade = Lake.open(lake_uri)
    write(remade, 1, ["x"])
    write(remade, 2, ["y"])  # the same table versions as before, other rows
    assert sorted(lake.read("quarantine")["source"]) == ["x", "y"]
    assert lake.read("runs").height == 2


def test_a_table_read_after_each_write_holds_what_a_fresh_open_reads_in_the_same_order(lake, monkeypatch):
    """The process's dataset of a partitioned table is built from the previous version's (only new files are
    built anew, see `_next_dataset`): after replaces, a clear, an append into an existing partition and a
    replace that removes a file, every read equals a fresh full build's, row for row and in order."""
    from deltalake import DeltaTable

    full_builds = []
    monkeypatch.setattr(
        DeltaTable,
        "to_pyarrow_dataset",
        lambda self, *a, _original=DeltaTable.to_pyarrow_dataset, **k: (
            full_builds.append(bool(k.get("file_pruning_predicate"))) or _original(self, *a, **k)
        ),
    )

    def fresh() -> pl.DataFrame:
        table = DeltaTable(lake.location.table_uri("quarantine"), storage_options=lake.location.storage_options())
        return pl.from_arrow(table.to_pyarrow_table())

    steps = [
        lambda run, v=version: lake.replace("quarantine", quarantine_rows(v, [f"v{v}"]), {"bank_version": v}, run)
        for version in range(1, 6)
    ]
    steps += [
        lambda run: lake.clear("quarantine", {"bank_version": 2}, run),
        lambda run: lake.append("quarantine", quarantine_rows(4, ["extra-a", "extra-b"]), run),
        lambda run: lake.replace("quarantine", quarantine_rows(4, ["again"]), {"bank_version": 4}, run),
        lambda run: lake.replace("quarantine", quarantine_rows(7, ["late"]), {"bank_version": 7}, run),
    ]
    for step in steps:
        with lake.run("test-flow", "test-stage", {}) as run:
            step(run)
        assert lake.read("quarantine", raw=True).equals(fresh())
    assert sorted(lake.read("quarantine")["source"]) == ["again", "late", "v1", "v3", "v5"]
    assert full_builds.count(True) >= 5  # most versions were built from the one before


def batch_rows(iteration: int, count: int, tag: str = "") -> pl.DataFrame:
    return pl.DataFrame(
        {
            "batch_id": [f"b{iteration}{tag}"] * count,
            "iteration": [iteration] * count,
            "rollout_id": [f"r{iteration}{tag}-{i}" for i in range(count)],
            "group_id": ["g"] * count,
            "advantage": [0.5] * count,
            "weight": [1.0] * count,
        }
    )


def test_an_unpartitioned_table_read_after_each_write_is_built_from_its_new_files_only(lake, monkeypatch):
    """The iteration tables are unpartitioned and gain a file a step: the process's dataset is built from the
    previous version's plus the new files' footers (`_footer_fragment`), never again in full (a full build costs
    ~1 ms a file, 30-60 ms a table at 50 steps). After replaces, a clear and an append, every read, whole or
    filtered by iteration or by run, equals a fresh full build's, row for row and in order."""
    from deltalake import DeltaTable

    full_builds, original = [], DeltaTable.to_pyarrow_dataset
    monkeypatch.setattr(
        DeltaTable, "to_pyarrow_dataset", lambda self, *a, **k: full_builds.append(1) or original(self, *a, **k)
    )

    def fresh(filter=None) -> pl.DataFrame:  # a full build of the table as it is, not counted
        table = DeltaTable(lake.location.table_uri("batches"), storage_options=lake.location.storage_options())
        return pl.from_arrow(original(table).to_table(filter=filter))

    steps = [
        lambda run, i=iteration: lake.replace("batches", batch_rows(i, i), {"iteration": i}, run)
        for iteration in range(1, 6)
    ]
    steps += [
        lambda run: lake.clear("batches", {"iteration": 2}, run),
        lambda run: lake.append("batches", batch_rows(4, 2, "extra"), run),
        lambda run: lake.replace("batches", batch_rows(3, 1, "again"), {"iteration": 3}, run),
    ]
    runs = []
    for step in steps:
        with lake.run("test-flow", "test-stage", {}) as run:
            step(run)
        runs.append(run.run_id)
        assert lake.read("batches", raw=True).equals(fresh())
        for iteration in range(6):
            this = pc.field("iteration") == iteration
            assert lake.read("batches", filter=this, raw=True).equals(fresh(this))
        by_run = pc.field("run_id").isin(runs[-2:])
        assert lake.read("batches", filter=by_run, raw=True).equals(fresh(by_run))
    assert len(full_builds) == 1  # the first read's; every later version built on it
    assert lake.read("batches").group_by("iteration").len().sort("iteration").rows() == [(1, 1), (3, 1), (4, 6), (5, 5)]


def test_a_lost_data_file_of_an_unpartitioned_table_is_reported_as_damage(lake):
    """A file the log names but storage lost: the footer read of a new file does not fail the snapshot; the
    read that needs the file says which table is damaged."""
    with lake.run("test-flow", "test-stage", {}) as run:
        lake.replace("batches", batch_rows(1, 2), {"iteration": 1}, run)
    assert lake.read("batches").height == 2
    with lake.run("test-flow", "test-stage", {}) as run:
        lake.replace("batches", batch_rows(2, 3), {"iteration": 2}, run)
    table = lake.table("batches")
    newest = sorted(pa.table(table.get_add_actions(flatten=True)).to_pylist(), key=lambda add: add["modification_time"])
    fs = lake.location.filesystem
    fs.rm(lake.location.table_uri("batches").removeprefix("s3://").removeprefix("file://") + "/" + newest[-1]["path"])
    with pytest.raises(LakeError, match="batches"):
        lake.read("batches")


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
