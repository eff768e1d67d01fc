"""The full bank from ../shared/datasets plus 100,000 procedural problems, from the command line.

Skipped where ../shared is absent (a user's fresh clone); CI has it beside the clone.
"""

import json

import polars as pl
import pytest
from conftest import run_cli

EXPECTED_ROWS = {
    "gsm8k-train": 7473,
    "gsm8k-test": 1319,
    "math500": 500,
    "aime24": 30,
    "humaneval": 164,
    "gen:mix": 100_000,
    "gym:propositional_logic": 500,
    "gym:knights_knaves": 500,
}


@pytest.fixture(scope="module")
def curated(tmp_path_factory):
    from conftest import SHARED_DATASETS

    if not SHARED_DATASETS.exists():
        pytest.skip("../shared/datasets is not present")
    lake = str(tmp_path_factory.mktemp("shared") / "lake")
    result = run_cli("curate", "--config", "configs/bank.yaml", "--lake", lake)
    assert result.returncode == 0, result.stderr[-3000:]
    return lake, result


def sql(lake, query):
    result = run_cli("sql", query, "--format", "json", "--lake", lake)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_every_row_is_accounted_for(curated):
    lake, _ = curated
    kept = {r["source"]: r["n"] for r in sql(lake, "select source, count(*) as n from problems group by 1")}
    quarantined = {r["source"]: r["n"] for r in sql(lake, "select source, count(*) as n from quarantine group by 1")}
    dropped = {r["source"]: r["n"] for r in sql(lake, "select source, count(*) as n from dropped_problems group by 1")}
    for source, rows in EXPECTED_ROWS.items():
        assert kept.get(source, 0) + quarantined.get(source, 0) + dropped.get(source, 0) == rows, source


def test_real_sets_survive_whole(curated):
    lake, _ = curated
    counts = {r["source"]: r["n"] for r in sql(lake, "select source, count(*) as n from problems group by 1")}
    # eval sets are never deduplicated away; HumanEval and these sets parse completely
    assert counts["gsm8k-test"] == 1319 and counts["math500"] == 500 and counts["aime24"] == 30
    assert counts["humaneval"] == 164
    assert counts["gsm8k-train"] >= 7400  # a handful dropped as near-duplicates or test leaks
    assert counts["gen:mix"] > 85_000  # exact repeats of small parameter spaces dropped
    levels = {
        (r["source"], r["level"])
        for r in sql(
            lake, "select distinct source, level from problems where source in ('gsm8k-train', 'math500', 'aime24')"
        )
    }
    assert levels == {("gsm8k-train", 1), ("math500", 2), ("math500", 3), ("aime24", 3)}
    splits = {r["source"]: r["split"] for r in sql(lake, "select distinct source, split from problems")}
    assert splits["gsm8k-test"] == splits["math500"] == splits["aime24"] == "eval" and splits["gsm8k-train"] == "train"
    domains = {r["domain"] for r in sql(lake, "select distinct domain from problems")}
    assert domains == {"math", "code", "logic"}


def test_no_duplicate_ids_and_dropped_ids_are_queryable(curated):
    lake, _ = curated
    assert sql(lake, "select count(*) - count(distinct problem_id) as d from problems") == [{"d": 0}]
    reasons = {r["reason"] for r in sql(lake, "select distinct reason from dropped_problems")}
    assert "exact_duplicate" in reasons
    orphans = sql(
        lake,
        "select count(*) as n from dropped_problems d left join problems p on d.duplicate_of = p.problem_id "
        "where d.reason != 'contaminated' and p.problem_id is null",
    )
    assert orphans == [{"n": 0}]


def test_lineage_points_at_the_source_line(curated, shared_datasets):
    lake, _ = curated
    row = sql(
        lake,
        "select problem_id, source_line, prompt from problems where source = 'gsm8k-train' "
        "order by source_line desc limit 1",
    )[0]
    line = (shared_datasets / "gsm8k" / "train.jsonl").read_text().splitlines()[row["source_line"] - 1]
    assert json.loads(line)["question"].strip() == row["prompt"]
    shown = run_cli("lineage", "problem", row["problem_id"], "--lake", lake)
    assert f"train.jsonl line {row['source_line']}" in shown.stdout and "bank version  1" in shown.stdout


def test_stats_command(curated):
    lake, _ = curated
    shown = run_cli("bank", "stats", "--lake", lake)
    assert shown.returncode == 0
    for title in ("by source", "by domain", "by level", "quarantine reasons", "dropped"):
        assert title in shown.stdout
    assert "gsm8k-train" in shown.stdout and "humaneval" in shown.stdout


def test_default_training_mix_from_the_real_bank(curated, tmp_path):
    lake, _ = curated
    out = tmp_path / "mix.parquet"
    result = run_cli("bank", "sample", "--n", "1000", "--seed", "3", "--out", str(out), "--lake", lake)
    assert result.returncode == 0, result.stderr
    drawn = pl.read_parquet(out)
    assert dict(drawn.group_by("level").len().iter_rows()) == {1: 200, 2: 450, 3: 300, 4: 50}
    assert drawn["split"].unique().to_list() == ["train"]
