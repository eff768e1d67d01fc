"""`rlvr export`: the bank, a draw from it or a kept batch as verl's parquet, a TRL `datasets` folder and
OpenRLHF's jsonl, each read back with the loader the trainer uses (or against its documented fields where the
trainer does not install here), every row traceable to the lake; nothing is overwritten."""

import json

import polars as pl
import pytest
from conftest import run_cli

from tasks.interop.formats import ground_truth


@pytest.fixture(scope="module")
def bank_lake(tmp_path_factory):
    from flows.curation import curate_bank

    lake_uri = str(tmp_path_factory.mktemp("export") / "lake")
    curate_bank({"sources": [{"kind": "generator", "generator": "mix", "count": 40, "seed": 0}]}, lake_uri)
    return lake_uri


def bank(lake_uri) -> pl.DataFrame:
    from storage.lake import Lake

    return Lake.open(lake_uri).read("problems").sort("problem_id")


def test_verl_parquet_has_verls_fields_and_leads_back_to_the_bank(bank_lake, tmp_path):
    from datasets import load_dataset

    out = tmp_path / "train.parquet"
    result = run_cli("export", "--to", "verl", "--out", str(out), "--lake", bank_lake)
    assert result.returncode == 0, result.stderr
    rows = load_dataset("parquet", data_files=str(out), split="train")  # how verl's RLHFDataset reads it
    problems = bank(bank_lake)
    assert len(rows) == problems.height
    first, expected = rows[0], problems.row(0, named=True)
    assert first["prompt"] == [{"role": "user", "content": expected["prompt"]}]
    assert first["ability"] == expected["domain"] and first["data_source"] == expected["source"]
    assert first["reward_model"] == {"style": "rule", "ground_truth": expected["answer"]}
    assert first["extra_info"]["problem_id"] == expected["problem_id"]
    assert first["extra_info"]["bank_version"] == 1 and first["extra_info"]["split"] == "train"


def test_a_trl_folder_loads_with_datasets_and_its_columns_reach_reward_functions(bank_lake, tmp_path):
    from datasets import load_from_disk

    out = tmp_path / "trl"
    result = run_cli(
        "export",
        "--to",
        "trl",
        "--out",
        str(out),
        "--n",
        "10",
        "--levels",
        "0,100,0,0",
        "--lake",
        bank_lake,
        "--format",
        "json",
    )
    assert result.returncode == 0, result.stderr
    rows = load_from_disk(str(out))
    assert len(rows) == 10 and set(rows["level"]) == {2}
    assert {"prompt", "answer", "problem_id", "domain", "verifier"} <= set(rows.column_names)
    assert rows[0]["prompt"][0]["role"] == "user"
    plain = tmp_path / "trl-plain"
    assert run_cli("export", "--to", "trl", "--out", str(plain), "--no-chat", "--lake", bank_lake).returncode == 0
    assert isinstance(load_from_disk(str(plain))[0]["prompt"], str)


def test_openrlhf_jsonl_has_input_and_label(bank_lake, tmp_path):
    out = tmp_path / "prompts.jsonl"
    assert run_cli("export", "--to", "openrlhf", "--out", str(out), "--lake", bank_lake).returncode == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    problems = bank(bank_lake)
    assert [r["problem_id"] for r in rows] == problems["problem_id"].to_list()
    assert rows[0]["input"] == problems["prompt"][0] and rows[0]["label"] == problems["answer"][0]


def test_nothing_is_overwritten_and_bad_requests_say_why(bank_lake, tmp_path):
    out = tmp_path / "train.parquet"
    out.write_text("mine")
    result = run_cli("export", "--to", "verl", "--out", str(out), "--lake", bank_lake)
    assert result.returncode == 2 and "exists: nothing is overwritten" in result.stderr and out.read_text() == "mine"
    result = run_cli("export", "--to", "verl", "--out", str(tmp_path / "train.json"), "--lake", bank_lake)
    assert result.returncode == 2 and "a verl export is a .parquet file" in result.stderr
    result = run_cli(
        "export", "--to", "openrlhf", "--out", str(tmp_path / "b.jsonl"), "--batch", "7", "--lake", bank_lake
    )
    assert result.returncode == 2 and "iteration 7 has no kept groups" in result.stderr
    for command in (["export", "--to", "openrlhf", "--out", str(tmp_path / "c.jsonl"), "--n", "3"], ["bank", "sample"]):
        result = run_cli(*command, "--levels", "20,x,30,5", "--lake", bank_lake)
        assert result.returncode == 2 and "--levels '20,x,30,5': give the weights of levels 1,2,3,4" in result.stderr
    assert not list(tmp_path.glob(".*partial*"))


def test_code_problems_carry_their_tests_as_ground_truth():
    code = {"tests": "assert f(1) == 2", "entry_point": "f", "answer": None}
    assert json.loads(ground_truth(code)) == {"tests": "assert f(1) == 2", "entry_point": "f"}
    assert ground_truth({"tests": None, "answer": "42"}) == "42"


def test_a_kept_batch_exports_its_problems_with_iteration_and_solve_rate(prefect_api, tmp_path):
    from helpers import CONFIG, curated

    from flows.iteration import rl_iteration
    from storage.lake import Lake

    lake_uri = str(tmp_path / "lake")
    curated(lake_uri)
    rl_iteration(CONFIG, lake_uri=lake_uri)
    out = tmp_path / "batch.jsonl"
    result = run_cli("export", "--to", "openrlhf", "--out", str(out), "--batch", "1", "--lake", lake_uri)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    kept = Lake.open(lake_uri).read("groups").filter(pl.col("kept"))
    assert sorted(r["problem_id"] for r in rows) == sorted(kept["problem_id"].to_list())
    assert all(r["iteration"] == 1 and r["model_version"] == 0 and 0 < r["solve_rate"] < 1 for r in rows)
