"""Crash consistency: rows of a run that never completed are invisible to every reader (reads, SQL and its
views, training mixes, deduplication, lineage) and replaced by the next run of the stage; writes that must
not race are conditional commits; `rlvr doctor` sees and repairs what is left."""

import os
import signal
import subprocess
import sys
import textwrap
from datetime import UTC

import polars as pl
import pytest
from conftest import run_cli

from storage.catalog import open_catalog
from storage.lake import LakeError
from storage.lineage import problem_lineage
from storage.runs import Run

KILLED_CURATION = textwrap.dedent("""
    import sys
    import polars as pl
    from storage.lake import Lake
    lake = Lake.open(sys.argv[1])
    rows = pl.read_parquet(sys.argv[2])
    with lake.run("curate-bank", "curate", {}, bank_version=2) as run:
        lake.replace("problems", rows, {"bank_version": 2}, run)
""")


def noise_rows() -> pl.DataFrame:
    from datetime import datetime

    return pl.DataFrame(
        [
            {
                "verifier": "math",
                "verifier_version": "1",
                "rho0": 0.1,
                "rho1": 0.1,
                "n_wrong": 1,
                "n_correct": 1,
                "audit": "x",
                "created_at": datetime.now(UTC),
            }
        ]
    )


def curate_small(lake_uri, count=30, seed=1, generator="level1"):
    from storage.lake import Lake
    from tasks.curation.config import CurationConfig
    from tasks.curation.filter import deduplicate
    from tasks.curation.load import load_source
    from tasks.curation.stage import existing_bank, write_bank

    config = CurationConfig.model_validate(
        {"sources": [{"kind": "generator", "generator": generator, "count": count, "seed": seed}]}
    )
    lake = Lake.open(lake_uri)
    loaded = load_source(config.sources[0], config.validation)
    with lake.run("curate-bank", "curate", config.model_dump(mode="json"), bank_version=1) as run:
        kept, dropped = deduplicate(loaded.problems, existing_bank(lake, 1), config.dedup)
        write_bank(lake, run, 1, kept, loaded.quarantined, dropped)
    return lake


@pytest.fixture
def orphaned(lake_uri, tmp_path):
    """A bank version 1, then a curation of version 2 killed (SIGKILL) right after its problems commit."""
    lake = curate_small(lake_uri)
    extra = curate_small(str(tmp_path / "scratch"), count=20, seed=99, generator="level2").read("problems")
    extra.drop("run_id").with_columns(bank_version=pl.lit(2, pl.Int64)).write_parquet(tmp_path / "rows.parquet")
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_CURATION, lake_uri, str(tmp_path / "rows.parquet")],
        env={**os.environ, "PYTHONPATH": os.getcwd(), "RLVR_FAULT": "committed:curate:problems"},
    )
    assert killed.returncode == -signal.SIGKILL
    return lake, extra


def test_an_incomplete_run_is_invisible_to_every_reader(orphaned):
    from tasks.curation.config import MixConfig
    from tasks.curation.stage import draw_training_mix, existing_bank

    lake, extra = orphaned
    assert lake.read("problems", raw=True).height == 50  # the rows are in the table ...
    assert lake.read("problems").height == 30  # ... and no reader sees them
    assert open_catalog(lake).sql("select count(*) from problems").fetchall() == [(30,)]
    assert set(draw_training_mix(lake, 30, MixConfig())["problem_id"]).isdisjoint(extra["problem_id"])
    with pytest.raises(ValueError, match="holds only 30"):
        draw_training_mix(lake, 31, MixConfig())
    assert existing_bank(lake, 3).height == 30  # dedup does not count them
    assert problem_lineage(lake, extra["problem_id"][0]) is None
    assert lake.read("runs")["status"].to_list().count("running") == 1  # until someone notices its process died


def test_the_next_curation_replaces_an_orphan_slice_and_keeps_every_problem(orphaned, lake_uri, prefect_api):
    from flows.curation import curate_bank

    lake, extra = orphaned
    result = curate_bank({"sources": [{"kind": "generator", "generator": "level2", "count": 20, "seed": 99}]}, lake_uri)
    assert result["bank_version"] == 2  # the abandoned version is reused ...
    problems = lake.read("problems", raw=True)
    assert problems.height == 50 and problems["problem_id"].is_unique().all()  # ... and its orphan slice replaced
    assert set(lake.read("problems")["problem_id"]) >= set(extra["problem_id"])  # nothing kept as a "duplicate"
    statuses = dict(lake.read("runs").group_by("status").len().rows())
    assert statuses == {"completed": 2, "abandoned": 1}  # taking the bank lease reaped it


def test_doctor_reports_then_repairs_without_touching_committed_rows(orphaned, lake_uri):
    lake, _ = orphaned
    report = run_cli("doctor", "--lake", lake_uri)
    assert report.returncode == 1, report.stdout
    assert "still `running`" in report.stdout and "never" in report.stdout and "doctor --repair" in report.stderr
    committed = lake.read("problems").sort("problem_id")
    repaired = run_cli("doctor", "--lake", lake_uri, "--repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "done: mark it abandoned" in repaired.stdout and "done: delete them" in repaired.stdout
    assert lake.read("problems", raw=True).sort("problem_id").equals(committed)
    again = run_cli("doctor", "--lake", lake_uri)
    assert again.returncode == 0 and "the lake is healthy" in again.stdout


def test_problem_ids_are_unique_by_conditional_commit(lake):
    from tasks.curation.stage import write_bank

    bank = lake.read("problems") if lake.exists("problems") else None
    assert bank is None
    problems = curate_small(lake.uri).read("problems")
    with pytest.raises(LakeError, match="refused commit: 30 row\\(s\\) would repeat a problem_id already there"):
        with lake.run("curate-bank", "curate", {}, bank_version=2) as run:
            write_bank(
                lake,
                run,
                2,
                problems.drop("run_id").with_columns(similarity_checks=pl.lit(False)),
                pl.DataFrame(),
                pl.DataFrame(),
            )
    with pytest.raises(LakeError, match="the rows repeat"):
        with lake.run("curate-bank", "curate", {}, bank_version=3) as run:
            lake.replace(
                "problems",
                pl.concat([problems.head(2), problems.head(1)])
                .drop("run_id")
                .with_columns(bank_version=pl.lit(3, pl.Int64)),
                {"bank_version": 3},
                run,
            )
    assert lake.read("problems", raw=True).height == 30


def test_a_model_version_number_is_taken_once_and_checkpoints_never_overwritten(lake, tmp_path):
    from storage.registry import claim_checkpoint, register

    with lake.run("test", "register", {}) as run:
        register(lake, run, 0, uri="somewhere", kind="base")
    with pytest.raises(LakeError, match="model_version = 0 is already taken by run"):
        with lake.run("test", "register", {}) as run:
            register(lake, run, 0, uri="elsewhere", kind="base")
    first = claim_checkpoint(lake, 1)
    second = claim_checkpoint(lake, 1)  # the first is claimed by a live process: a new folder
    assert first.endswith("v00001") and second.endswith("v00001-2")


def test_a_lost_registry_commit_never_lets_a_checkpoint_be_overwritten(lake, lake_uri, prefect_api):
    """Deleting the last `model_versions` commit: the number comes back, the folder does not; doctor says why."""
    from conftest import register_random_version

    from storage.registry import claim_checkpoint
    from tasks.rollout.base_policy import BasePolicyConfig, ensure_base_policy

    ensure_base_policy(
        lake,
        BasePolicyConfig(
            tiny={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}, tokenizer_corpus=50
        ),
    )
    register_random_version(lake, 1, seed=1)
    fs = lake.location.filesystem
    log = lake.location.table_uri("model_versions").removeprefix("s3://") + "/_delta_log"
    newest = sorted(p for p in fs.ls(log, detail=False) if p.endswith(".json"))[-1]
    fs.rm(newest)
    assert lake.read("model_versions")["model_version"].to_list() == [0]
    checkpoint = lake.location.path("models", "v00001").removeprefix("s3://")
    before = fs.cat_file(f"{checkpoint}/model.safetensors")
    assert claim_checkpoint(lake, 1).endswith("v00001-2")
    assert fs.cat_file(f"{checkpoint}/model.safetensors") == before
    report = run_cli("doctor", "--lake", lake_uri, env={k: v for k, v in os.environ.items() if k.startswith("AWS_")})
    assert (
        report.returncode == 1
        and "model_versions" in report.stdout
        and "commits of completed runs were lost"
        in (report.stdout.replace("\n", " ").replace("│", " ").replace("  ", " ") or "")
    )


def test_a_damaged_table_fails_alone_and_names_itself(tmp_path):
    lake = curate_small(str(tmp_path / "lake"))
    with lake.run("test", "noise", {}) as run:
        lake.append("verifier_noise", noise_rows(), run)
    log = tmp_path / "lake" / "problems" / "_delta_log" / "00000000000000000000.json"
    log.write_text("x")
    other = run_cli("sql", "select count(*) as n from verifier_noise", "--format", "csv", "--lake", str(lake.uri))
    assert other.returncode == 0 and other.stdout.split() == ["n", "1"]  # a query that needs only other tables
    listing = run_cli("sql", "show tables", "--format", "csv", "--lake", str(lake.uri))  # opens every table
    assert listing.returncode == 0 and "verifier_noise" in listing.stdout.split()
    assert "problems" not in listing.stdout.split()
    assert "table problems" in listing.stderr and "rlvr doctor" in listing.stderr
    broken = run_cli("sql", "select count(*) from problems", "--lake", str(lake.uri))
    assert broken.returncode == 1 and "table problems" in broken.stderr and "rlvr doctor" in broken.stderr
    doctor = run_cli("doctor", "--lake", str(lake.uri))
    assert doctor.returncode == 1 and "its log cannot be read" in doctor.stdout


def test_rows_of_a_run_in_progress_are_visible_to_itself_only(lake):
    with lake.run("test", "noise", {}) as run:
        lake.append("verifier_noise", noise_rows(), run)
        assert lake.read("verifier_noise").height == 1
        other = Run("test", "other", {})
        lake._write_run_row(other.row("running"), insert=True)
        lake.append("verifier_noise", noise_rows(), other)
        assert lake.read("verifier_noise").height == 1  # the other run's row is not ours to see
    assert lake.read("verifier_noise").height == 1 and lake.read("verifier_noise", raw=True).height == 2
