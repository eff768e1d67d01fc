"""The curation flow end to end on small files: quarantine, re-runs, versions, failures, lineage, Prefect."""

import asyncio
import csv
import json

import polars as pl
import pyarrow.compute as pc
import pytest
from conftest import run_cli

from storage.lineage import problem_lineage
from tasks.curation.readers import SourceReadError
from tasks.generators import regenerate

GSM8K_LINES = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
    "this line is not JSON",
    {"question": "A train travels 60 miles per hour for 2 hours. How far does it go?", "answer": "no final line"},
    {
        "question": "Sara reads 12 pages a day for 5 days. How many pages does she read?",
        "answer": "<<12*5=60>>\n#### 60",
    },
    {"answer": "#### 5"},
]


@pytest.fixture
def files(tmp_path):
    gsm8k = tmp_path / "gsm8k.jsonl"
    gsm8k.write_text("".join((json.dumps(line) if isinstance(line, dict) else line) + "\n" for line in GSM8K_LINES))
    math_eval = tmp_path / "math.parquet"
    pl.DataFrame(
        {
            "problem": ["Compute $\\frac{1}{2} + \\frac{1}{3}$.", "Find the area of a unit circle."],
            "solution": ["We get $\\boxed{\\frac{5}{6}}$.", "It is $\\boxed{\\pi}$."],
        }
    ).write_parquet(math_eval)
    return {"gsm8k": str(gsm8k), "math": str(math_eval), "missing": str(tmp_path / "nope.jsonl")}


def config(files, **extra):
    return {
        "sources": [
            {"kind": "gsm8k", "path": files["gsm8k"], "name": "toy-gsm8k"},
            {"kind": "math", "path": files["math"], "name": "toy-math", "split": "eval", "level": 3},
            {"kind": "generator", "generator": "level1", "count": 40, "seed": 5},
            {"kind": "gym", "dataset": "chain_sum", "count": 10, "seed": 1, "level": 1},
        ],
        **extra,
    }


@pytest.fixture
def curate(prefect_api):
    from flows.curation import curate_bank

    return curate_bank


def test_curation_writes_a_bank_version_with_quarantine(curate, files, lake, lake_uri, prefect_api):
    result = curate(config(files), lake_uri)
    assert result["bank_version"] == 1
    report = {row["source"]: row for row in result["sources"]}
    assert report["toy-gsm8k"] == {
        "source": "toy-gsm8k",
        "loaded": 5,
        "quarantined": 3,
        "exact_dup": 0,
        "near_dup": 0,
        "contaminated": 0,
        "kept": 2,
    }
    problems = lake.read("problems")
    assert problems.filter(pl.col("source") == "toy-gsm8k")["answer"].sort().to_list() == ["60", "7"]
    assert problems.filter(pl.col("source") == "toy-gsm8k")["steps"].to_list()[0] == ["3+4=7"]
    assert problems.filter(pl.col("source") == "toy-math").select("split", "level", "answer").sort("answer").rows() == [
        ("eval", 3, "\\frac{5}{6}"),
        ("eval", 3, "\\pi"),
    ]
    assert problems.filter(pl.col("source") == "gym:chain_sum")["verifier"].unique().to_list() == ["gym"]
    quarantine = lake.read("quarantine").sort("source_line")
    assert quarantine.select("source_line", "field").rows() == [(2, None), (3, "answer"), (5, "question")]
    assert quarantine["source_uri"].unique().to_list() == [files["gsm8k"]]
    assert "invalid JSON" in quarantine["reason"][0]
    runs = lake.read("runs")
    assert runs.select("flow", "stage", "bank_version", "status").rows() == [("curate-bank", "curate", 1, "completed")]
    assert set(problems["run_id"]) == set(quarantine["run_id"]) == {result["run_id"]}

    from prefect.client.orchestration import get_client

    async def flow_run_state(flow_run_id):
        async with get_client() as client:
            return (await client.read_flow_run(flow_run_id)).state.name

    assert asyncio.run(flow_run_state(runs["prefect_flow_run_id"][0])) == "Completed"


def test_rerunning_a_version_replaces_it_exactly(curate, files, lake, lake_uri):
    first = curate(config(files), lake_uri)
    second = curate(config(files, bank_version=1), lake_uri)
    problems = lake.read("problems")
    assert problems.height == sum(row["kept"] for row in first["sources"])
    assert problems["problem_id"].n_unique() == problems.height
    assert problems["run_id"].unique().to_list() == [second["run_id"]]
    assert lake.read("quarantine").height == 3
    assert lake.read("runs").sort("started_at")["run_id"].to_list() == [first["run_id"], second["run_id"]]


def test_a_new_version_keeps_the_old_and_drops_repeats(curate, files, lake, lake_uri):
    curate(config(files), lake_uri)
    before = lake.read("problems").sort("problem_id")
    second = curate(
        {
            "sources": [
                {"kind": "gsm8k", "path": files["gsm8k"], "name": "again"},
                {"kind": "generator", "generator": "level2", "count": 10, "seed": 9},
            ]
        },
        lake_uri,
    )
    assert second["bank_version"] == 2
    assert lake.read("problems", filter=pc.field("bank_version") == 1).sort("problem_id").equals(before)
    added = lake.read("problems", filter=pc.field("bank_version") == 2)
    assert added["source"].unique().to_list() == ["gen:level2"]
    dropped = lake.read("dropped_problems", filter=pc.field("bank_version") == 2)
    assert dropped["reason"].to_list() == ["exact_duplicate", "exact_duplicate"]
    assert set(dropped["duplicate_of"]) <= set(before["problem_id"])


def test_an_unreadable_file_fails_before_any_work(curate, files, lake, lake_uri):
    curate(config(files), lake_uri)
    before = lake.read("problems").height
    broken = {
        "sources": [
            {"kind": "generator", "generator": "level1", "count": 5},
            {"kind": "gsm8k", "path": files["missing"]},
        ]
    }
    with pytest.raises(SourceReadError, match="nope.jsonl"):
        curate(broken, lake_uri)
    assert lake.read("problems").height == before
    assert lake.read("runs")["status"].to_list() == ["completed"]


def test_a_failure_mid_run_is_recorded_and_the_bank_is_unchanged(curate, files, lake, lake_uri):
    curate(config(files), lake_uri)
    before = lake.read("problems").sort("problem_id")
    broken = {
        "sources": [
            {"kind": "generator", "generator": "level1", "count": 5},
            {"kind": "gym", "dataset": "chain_sum", "params": {"min_terms": 9, "max_terms": 2}},
        ]
    }
    with pytest.raises(ValueError, match="chain_sum"):
        curate(broken, lake_uri)
    assert lake.read("problems").sort("problem_id").equals(before)
    runs = lake.read("runs").sort("started_at")
    assert runs["status"].to_list() == ["completed", "failed"]
    assert "chain_sum" in runs["error"][1] and runs["bank_version"][1] is None  # failed before it took a version


def test_lineage_of_file_and_generated_problems(curate, files, lake, lake_uri):
    curate(config(files), lake_uri)
    problems = lake.read("problems")
    from_file = problems.filter(pl.col("answer") == "60").row(0, named=True)
    lineage = problem_lineage(lake, from_file["problem_id"])
    assert lineage["origin"] == {"kind": "file", "layout": "gsm8k", "file": files["gsm8k"], "line": 4}
    assert lineage["run"]["status"] == "completed" and lineage["problem"]["bank_version"] == 1
    generated = problems.filter(pl.col("source") == "gen:level1").row(0, named=True)
    origin = problem_lineage(lake, generated["problem_id"])["origin"]
    assert origin["kind"] == "generator" and origin["parameters"]["selector"] == "level1"
    assert regenerate(origin["generator"], origin["seed"]).prompt == generated["prompt"]
    gym = problem_lineage(lake, problems.filter(pl.col("source") == "gym:chain_sum")["problem_id"][0])["origin"]
    assert gym["parameters"]["dataset"] == "chain_sum" and gym["seed"] == 1


def test_cli_quick_sources_without_a_prefect_server(files, tmp_path):
    """A temporary Prefect server (no PREFECT_API_URL), quick `--source` syntax, then stats and sample."""
    lake = str(tmp_path / "cli-lake")
    result = run_cli(
        "curate",
        "--source",
        f"gsm8k:{files['gsm8k']}",
        "--source",
        "gen:level2:30",
        "--eval-source",
        f"math:{files['math']}",
        "--lake",
        lake,
    )
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr  # a normal exit is quiet
    assert "Traceback" not in output and "CancelledError" not in output and "Starting temporary server" not in output
    assert "bank version 1" in result.stdout and "3 quarantined" in result.stdout
    stats = run_cli("bank", "stats", "--lake", lake)
    assert "gen:level2" in stats.stdout and "GSM8K answer has no '#### N' final line" in stats.stdout
    sample = run_cli(
        "bank", "sample", "--n", "10", "--levels", "0,100,0,0", "--lake", lake, "--out", str(tmp_path / "mix.jsonl")
    )
    assert sample.returncode == 0, sample.stderr
    drawn = pl.read_ndjson(tmp_path / "mix.jsonl")
    assert drawn.height == 10 and drawn["level"].unique().to_list() == [2]
    shown = run_cli("bank", "sample", "--n", "5", "--levels", "0,100,0,0", "--lake", lake)
    assert "first 5" in shown.stdout and "first 10" not in shown.stdout
    # --format: stdout holds only rows (CSV blocks or JSON lines naming their table), notes go to stderr
    as_json = run_cli("bank", "stats", "--format", "json", "--lake", lake)
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert as_json.returncode == 0 and rows and all("table" in row for row in rows)
    assert "gen:level2" in {row["source"] for row in rows if row["table"] == "by source"}
    assert {"by source", "by domain", "by level", "quarantine reasons"} <= {row["table"] for row in rows}
    assert "by source" in as_json.stderr  # the titles, for people
    as_csv = run_cli("bank", "sample", "--n", "5", "--levels", "0,100,0,0", "--format", "csv", "--lake", lake)
    blocks = as_csv.stdout.strip().split("\n\n")
    assert [block.splitlines()[0] for block in blocks] == ["# drawn", "# first"]
    drawn_rows = list(csv.DictReader(blocks[1].splitlines()[1:]))
    assert len(drawn_rows) == 5 and {row["level"] for row in drawn_rows} == {"2"}
    assert "first 5" in as_csv.stderr and "first 5" not in as_csv.stdout
    missing = run_cli("curate", "--source", f"gsm8k:{files['missing']}", "--lake", lake)
    assert missing.returncode == 1
    assert missing.stderr.strip().startswith("error: cannot read source file") and "Traceback" not in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1 and "nope.jsonl" in missing.stderr
    bad_spec = run_cli("curate", "--source", "nonsense", "--lake", lake)
    assert bad_spec.returncode == 2 and "KIND:PATH_OR_NAME" in bad_spec.stderr


def test_a_failed_problems_write_puts_the_other_slices_back(lake):
    from helpers import candidates

    from tasks.curation.stage import write_bank

    kept = candidates([{"problem_id": "p1", "prompt": "What is 1+1?", "answer": "2"}])
    quarantine = pl.DataFrame(
        {
            "source": ["s"],
            "source_uri": ["f"],
            "source_line": [3],
            "field": ["answer"],
            "reason": ["old reason"],
            "raw": ["{}"],
        }
    )
    dropped = pl.DataFrame(
        schema={
            "problem_id": pl.String,
            "source": pl.String,
            "source_uri": pl.String,
            "source_line": pl.Int64,
            "seed": pl.Int64,
            "reason": pl.String,
            "duplicate_of": pl.String,
            "similarity": pl.Float64,
            "prompt": pl.String,
        }
    )
    with lake.run("curate-bank", "curate", {}, bank_version=1) as run:
        write_bank(lake, run, 1, kept, quarantine, dropped)
    original_replace = lake.replace

    def failing_replace(name, rows, key, run):
        if name == "problems":
            raise OSError("storage went away")
        return original_replace(name, rows, key, run)

    lake.replace = failing_replace
    with pytest.raises(OSError, match="storage went away"):
        with lake.run("curate-bank", "curate", {}, bank_version=1) as run:
            write_bank(lake, run, 1, kept, quarantine.with_columns(reason=pl.lit("new reason")), dropped)
    assert lake.read("quarantine")["reason"].to_list() == ["old reason"]
    assert lake.read("problems")["problem_id"].to_list() == ["p1"]


def test_recurating_a_version_that_later_versions_depend_on_needs_force(curate, files, lake, lake_uri):
    curate({"sources": [{"kind": "generator", "generator": "level1", "count": 20, "seed": 1}]}, lake_uri)
    curate({"sources": [{"kind": "generator", "generator": "level1", "count": 40, "seed": 1}]}, lake_uri)
    assert lake.read("dropped_problems")["reason"].to_list() == ["exact_duplicate"] * 20
    with pytest.raises(ValueError, match="later versions \\[2\\]"):
        curate({"bank_version": 1, "sources": [{"kind": "generator", "generator": "level2", "count": 5}]}, lake_uri)
    assert lake.read("problems").height == 40
    rerun_latest = curate(
        {"bank_version": 2, "sources": [{"kind": "generator", "generator": "level1", "count": 40, "seed": 1}]}, lake_uri
    )
    assert rerun_latest["bank_version"] == 2 and lake.read("problems").height == 40


def test_a_failed_or_abandoned_version_number_is_reused_and_its_slice_replaced(curate, lake, lake_uri):
    from storage.runs import Run

    curate({"sources": [{"kind": "generator", "generator": "level1", "count": 10, "seed": 1}]}, lake_uri)
    orphan = Run(flow="curate-bank", stage="curate", parameters={}, bank_version=2)  # a curation killed after
    lake._write_run_row(orphan.row("abandoned"), insert=True)  # its problems commit
    lake.replace(
        "problems",
        lake.read("problems").with_columns(bank_version=pl.lit(2, pl.Int64), problem_id=pl.col("problem_id") + "x"),
        {"bank_version": 2},
        orphan,
    )
    assert lake.read("problems").height == 10 and lake.read("problems", raw=True).height == 20
    result = curate({"sources": [{"kind": "generator", "generator": "level2", "count": 5, "seed": 1}]}, lake_uri)
    assert result["bank_version"] == 2
    assert lake.read("problems", raw=True).height == 15 and lake.read("problems")["problem_id"].is_unique().all()


def test_code_problems_whose_reference_fails_are_quarantined(curate, tmp_path, lake, lake_uri):
    rows = [
        {
            "task_id": "T/0",
            "prompt": "def add(a, b):\n",
            "canonical_solution": "    return a + b\n",
            "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
            "entry_point": "add",
        },
        {
            "task_id": "T/1",
            "prompt": "def sub(a, b):\n",
            "canonical_solution": "    return a + b\n",
            "test": "def check(candidate):\n    assert candidate(3, 2) == 1\n",
            "entry_point": "sub",
        },
    ]
    path = tmp_path / "code.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = curate({"sources": [{"kind": "humaneval", "path": str(path), "name": "toy-code"}]}, lake_uri)
    assert result["sources"][0]["kept"] == 1 and result["sources"][0]["quarantined"] == 1
    quarantine = lake.read("quarantine")
    assert quarantine.select("source_line", "field").rows() == [(2, "canonical_solution")]
    assert "reference solution fails its own tests (0/1 passed" in quarantine["reason"][0]


def test_lineage_prints_a_problem_dropped_twice_alike_once(capsys):
    from flows import display

    drop = {
        "bank_version": 2,
        "reason": "exact_duplicate",
        "duplicate_of": "abc",
        "similarity": 1.0,
        "source": "gen:level1",
        "source_uri": "arith_chain",
        "source_line": None,
        "run_id": "r1",
    }
    display.print_lineage({"problem_id": "xyz", "dropped": [drop, dict(drop)]})
    printed = capsys.readouterr().out
    assert printed.count("dropped       from bank version 2") == 1 and "×2" in printed


def test_lineage_of_a_kept_problem_counts_its_dropped_copies_instead_of_calling_it_dropped(
    curate, lake, lake_uri, capsys
):
    """Issue 37: a copy of a bank problem has its content-hash id, so its drop read "dropped from bank version 1 as
    exact_duplicate of" the problem itself. Two sources drawing the same problems: the copies are counted."""
    from flows import display
    from storage.lineage import problem_lineage

    source = {"kind": "generator", "generator": "level1", "count": 5, "seed": 1}
    curate({"sources": [{**source, "name": "first"}, {**source, "name": "again"}]}, lake_uri)
    problem_id = lake.read("problems").sort("problem_id")["problem_id"][0]
    lineage = problem_lineage(lake, problem_id)
    assert lineage["problem"] and [drop["duplicate_of"] for drop in lineage["dropped"]] == [problem_id]
    display.print_lineage(lineage)
    printed = " ".join(capsys.readouterr().out.split())
    assert "dropped from bank version" not in printed
    assert "copies 1 other copy of this problem left out of bank version 1 as exact duplicates of it (again:" in printed
