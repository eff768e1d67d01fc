"""Transactional, idempotent writes and run records, against a local folder and S3 (moto)."""

import json
import subprocess
import sys
import textwrap

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from helpers import batch_rows, quarantine_rows, write

from storage.lake import LakeError
from storage.schemas import QUARANTINE


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
