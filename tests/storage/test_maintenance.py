"""`rlvr lake maintain`: small files compacted with the rows unchanged, logs checkpointed, files vacuumed past the
retention with time travel kept inside it, `rlvr doctor` reporting it; and maintenance running again and again
beside a live `rlvr run`, after which every row is there exactly once."""

import json
import subprocess
import threading
import time
from datetime import UTC

import polars as pl
import pyarrow.compute as pc
import pytest
import yaml
from conftest import BIN, ROOT
from helpers import BANK, RUN

from storage.lake import Lake
from storage.maintenance import MaintenanceConfig, layout, maintain


def groups_rows(iteration: int, n: int) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "iteration": [iteration] * n,
            "group_id": [f"g{iteration}-{i}" for i in range(n)],
            "problem_id": [f"p{i}" for i in range(n)],
            "n_samples": [4] * n,
            "kept": [True] * n,
        }
    )


def test_maintain_compacts_checkpoints_and_vacuums_keeping_time_travel(cli, tmp_path):
    lake_uri = str(tmp_path / "lake")
    lake = Lake.open(lake_uri)
    for commit in range(12):  # twelve small files of two iterations
        with lake.run("test", "write", {"commit": commit}) as run:
            lake.append("groups", groups_rows(commit % 2, 3 + commit), run)
    before = lake.read("groups").sort("run_id", "group_id", "iteration")
    from datetime import datetime

    time.sleep(1.1)
    moment = datetime.now(UTC).isoformat()  # the lake as it was before maintenance
    assert layout(lake, "groups").files == 12 and layout(lake, "groups").last_checkpoint is None

    kept = cli("lake", "maintain", "--lake", lake_uri, "--format", "json")
    assert kept.returncode == 0, kept.stderr
    by_table = {row["table"]: row for row in map(json.loads, kept.stdout.splitlines())}
    assert by_table["groups"]["files"] == "12 → 1" and by_table["groups"]["compaction"] == "done"  # across iterations
    assert by_table["groups"]["vacuumed"] == 0  # inside the week's retention: kept for time travel
    assert by_table["runs"]["compaction"] == "skipped"  # the runs table compacts itself
    assert lake.read("groups").sort("run_id", "group_id", "iteration").equals(before)
    assert layout(lake, "groups").last_checkpoint == lake.table("groups").version()
    as_of = cli("sql", "select count(*) as n from groups", "--as-of", moment, "--format", "csv", "--lake", lake_uri)
    assert as_of.returncode == 0 and as_of.stdout.split() == ["n", str(before.height)]

    doctor = cli("doctor", "--lake", lake_uri, "--format", "json")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    findings = {row["subject"]: row["finding"] for row in map(json.loads, doctor.stdout.splitlines())}
    assert findings["maintenance"].startswith("last maintained") and "groups" not in findings["layout"].split(";")[0]

    log = tmp_path / "lake" / "groups" / "_delta_log"
    assert len(list(log.glob("*.json"))) > 12  # a week's retention keeps every commit file
    gone = maintain(lake, MaintenanceConfig(retention_hours=0, tables=["groups"]))
    assert gone[0].vacuumed_files == 12 and lake.read("groups").sort("run_id", "group_id", "iteration").equals(before)
    assert gone[0].log_files == len(list(log.glob("*.json"))) == 1  # the checkpoint's commit: the rest expired
    assert (
        Lake.open(lake_uri).read("groups").sort("run_id", "group_id", "iteration").equals(before)
    )  # from a fresh open
    from flows.maintenance import lake_maintenance  # the scheduled deployment's flow

    ran = lake_maintenance({"tables": ["groups"]}, lake_uri)
    assert ran == [
        {
            "table": "groups",
            "files_before": 1,
            "files_after": 1,
            "compacted": "nothing to do",
            "checkpoint": lake.table("groups").version(),
            "vacuumed_files": 0,
            "log_files": 2,
            "notes": [],
        }
    ]  # the last checkpoint's commit and the retention's change
    refused = cli("lake", "maintain", "--table", "nope", "--lake", lake_uri)
    assert refused.returncode == 2 and "not in the lake's contract" in refused.stderr


def test_a_compaction_never_lands_over_another_writers_commit(tmp_path):
    """The compaction reads a snapshot; another writer commits; the compaction is refused, and nothing is lost."""
    from storage.maintenance import _compact

    lake = Lake.open(str(tmp_path / "lake"))
    for commit in range(4):
        with lake.run("test", "write", {"commit": commit}) as run:
            lake.append("groups", groups_rows(0, 2), run)
    stale = lake.table("groups")  # what the compaction planned from
    with lake.run("test", "write", {"commit": "late"}) as run:
        lake.replace("groups", groups_rows(0, 1), {"iteration": 0}, run)  # removes every file it would merge
    assert _compact(stale, MaintenanceConfig()) == "refused: another writer committed meanwhile"
    assert lake.read("groups")["group_id"].to_list() == ["g0-0"]  # the replace stands; nothing came back
    assert _compact(lake.table("groups"), MaintenanceConfig()) == "nothing to do"


def test_the_log_retention_lands_after_another_writers_replace(tmp_path):
    """The retention's property change reads the whole table: a replace since its snapshot refused it, and the
    maintenance beside a live loop failed (CI). It is retried on a fresh snapshot; the replace stands."""
    from storage.maintenance import _keep_history_for

    lake = Lake.open(str(tmp_path / "lake"))
    for commit in range(3):
        with lake.run("test", "write", {"commit": commit}) as run:
            lake.append("groups", groups_rows(0, 2), run)
    stale = lake.table("groups")
    with lake.run("test", "write", {"commit": "late"}) as run:
        lake.replace("groups", groups_rows(0, 1), {"iteration": 0}, run)
    _keep_history_for(lake, "groups", 5, stale)
    assert lake.table("groups").metadata().configuration["delta.logRetentionDuration"] == "interval 5 hours"
    assert lake.read("groups")["group_id"].to_list() == ["g0-0"]


def test_expired_commit_files_are_removed_by_maintenance_not_by_every_commit(tmp_path):
    """delta-rs's default sweep after a commit lists the whole log to remove the commit files older than the
    retention (8 ms a commit at 900 files, growing with the log, ten commits a step to `runs`); the lake's
    commits leave that to `rlvr lake maintain`, which removes them after its own checkpoint."""
    from storage.maintenance import _keep_history_for

    lake = Lake.open(str(tmp_path / "lake"))
    for commit in range(3):
        with lake.run("test", "write", {"commit": commit}) as run:
            lake.append("groups", groups_rows(0, 2), run)
    _keep_history_for(lake, "groups", 0, lake.table("groups"))  # every commit file has expired at once
    lake.table("groups").create_checkpoint()
    time.sleep(1.1)  # older than the retention, by the log's clock
    for name in ("groups", "runs"):
        before = len(lake.commit_files(name))
        with lake.run("test", "write", {"commit": "after"}) as run:
            lake.replace("groups", groups_rows(0, 1), {"iteration": 0}, run)
        assert len(lake.commit_files(name)) >= before + 1  # nothing swept by the commits
    maintain(lake, MaintenanceConfig(tables=["groups"], retention_hours=0, compact=False, vacuum=False))
    assert len(lake.commit_files("groups")) == 1  # the new checkpoint's commit only
    assert lake.read("groups")["group_id"].to_list() == ["g0-0"]


def test_maintenance_beside_a_live_loop_loses_and_duplicates_nothing(prefect_api, tmp_path):
    lake_uri = str(tmp_path / "lake")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"bank": BANK, **RUN, "loop": {"iterations": 4}}))
    env = {"PREFECT_API_URL": prefect_api, "COLUMNS": "200"}
    import os

    seeded = Lake.open(lake_uri)  # small files in the partitions the loop replaces:
    for commit in range(12):  # compactions of them race the loop's own writes
        with seeded.run("test", "seed", {"commit": commit}) as run:
            seeded.append(
                "groups", groups_rows(1 + commit % 4, 2).with_columns(pl.col("group_id") + f"-seed{commit}"), run
            )
    loop = subprocess.Popen(
        [str(BIN / "rlvr"), "run", "--config", str(config), "--lake", lake_uri],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **env},
    )
    outcomes, errors = [], []

    def maintain_until_done() -> None:
        lake = Lake.open(lake_uri)
        while loop.poll() is None:
            if not lake.exists("rollouts"):
                time.sleep(0.5)
                continue
            try:
                outcomes.extend(r.compacted for r in maintain(lake, MaintenanceConfig(target_file_mb=64)))
            except Exception as error:  # noqa: BLE001 - collected, asserted below
                errors.append(repr(error))

    maintainer = threading.Thread(target=maintain_until_done)
    maintainer.start()
    output, _ = loop.communicate(timeout=900)
    maintainer.join()
    assert loop.returncode == 0, output
    assert not errors, errors
    print("compactions beside the loop:", {o: outcomes.count(o) for o in set(outcomes)})
    assert "done" in outcomes, outcomes  # it compacted while the loop wrote

    lake = Lake.open(lake_uri)
    maintain(lake, MaintenanceConfig())  # and once more, quiet
    rollouts = lake.read("rollouts")
    assert rollouts["rollout_id"].is_unique().all()
    for iteration in range(1, 5):
        mine = rollouts.filter(pl.col("iteration") == iteration)
        groups = lake.read("groups", filter=pc.field("iteration") == iteration)
        assert not groups["group_id"].str.contains("seed").any()  # the loop's replace stands: no seed came back
        assert mine.height == groups["n_samples"].sum() > 0
        rewards = lake.read("rewards", filter=pc.field("iteration") == iteration)
        assert rewards.height == mine.height and set(rewards["rollout_id"]) == set(mine["rollout_id"])
        advantages = lake.read("advantages", filter=pc.field("iteration") == iteration)
        assert advantages["rollout_id"].is_unique().all() and set(advantages["rollout_id"]) <= set(mine["rollout_id"])
        batch = lake.read("batches", filter=pc.field("iteration") == iteration)
        assert batch["rollout_id"].is_unique().all() and set(batch["rollout_id"]) <= set(mine["rollout_id"])
    assert lake.read("iteration_metrics")["iteration"].sort().to_list() == [1, 2, 3, 4]
    assert lake.read("model_versions")["model_version"].sort().to_list() == [0, 1, 2, 3, 4]
    doctor = subprocess.run(
        [str(BIN / "rlvr"), "doctor", "--lake", lake_uri],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    assert doctor.returncode == 0, doctor.stdout


@pytest.mark.parametrize("iteration", [1, 3], ids=["slice-with-rows", "new-slice"])
def test_a_replace_planned_before_a_compaction_commits_after_it_losing_and_doubling_nothing(
    tmp_path, monkeypatch, iteration
):
    """The race the other way round: a writer's snapshot is taken, a compaction (`rlvr lake maintain`, in another
    process) commits, then the writer's replace commits, planned on the snapshot the compaction moved past. The
    replaced slice holds exactly the new rows and every other row is there once (iterations 1 and 2 each had
    three small files, which the compaction merges; slice 3 was empty, so its replace is an append that must
    land right on its snapshot). Today delta-rs refuses the stale commit and the lake retries it on a fresh
    snapshot; the test holds the outcome, whatever the mechanism."""
    from deltalake import DeltaTable
    from helpers import OtherProcess

    import storage.writes as writes_module

    lake_uri = str(tmp_path / "lake")
    lake = Lake.open(lake_uri)
    for commit in range(6):
        with lake.run("test", "seed", {"commit": commit}) as run:
            lake.append("groups", groups_rows(1 + commit % 2, 2).with_columns(pl.col("group_id") + f"-{commit}"), run)
    seeded = lake.read("groups").sort("iteration", "group_id")
    new = groups_rows(iteration, 3).with_columns(pl.col("group_id") + "-new")
    other = OtherProcess()
    other(do="open", lake=lake_uri)
    raced, original = [], writes_module.write_deltalake

    def compaction_first(target, *args, **kwargs):
        if not raced and isinstance(target, DeltaTable) and target.table_uri.rstrip("/").endswith("groups"):
            planned_on = target.version()
            raced.append(other(do="compact", tables=["groups"])["compacted"])
            assert DeltaTable(target.table_uri).version() == planned_on + 1  # the compaction landed after it
            assert target.version() == planned_on  # and the writer's snapshot is older
        return original(target, *args, **kwargs)

    try:
        lake.read("groups")  # the writer's snapshot, up to date
        monkeypatch.setattr(writes_module, "write_deltalake", compaction_first)
        with lake.run("test", "replace", {}) as run:
            lake.replace("groups", new, {"iteration": iteration}, run)
    finally:
        other.close()
    assert raced == [["done"]]
    fresh = pl.from_arrow(DeltaTable(lake.location.table_uri("groups")).to_pyarrow_table())  # no cache of this process
    columns = ["iteration", "group_id", "problem_id", "n_samples", "kept"]
    for rows in (fresh, lake.read("groups")):
        assert rows["group_id"].is_unique().all()
        assert (
            rows.filter(pl.col("iteration") == iteration)
            .select(columns)
            .sort("group_id")
            .equals(new.select(columns).sort("group_id"))
        )
        kept = rows.filter(pl.col("iteration") != iteration).sort("iteration", "group_id")
        assert kept.equals(seeded.filter(pl.col("iteration") != iteration).select(kept.columns))
    assert layout(lake, "groups").files <= 2  # the compacted file, and the replace's own
