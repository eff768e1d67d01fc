"""Loading a source: column mappings, levels from data or ranges, gym domains, files on S3."""

import json

import polars as pl
import pytest

from tasks.curation.config import SourceConfig, ValidationConfig
from tasks.curation.gym import gym_domain
from tasks.curation.load import load_source


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_mapped_layout_with_levels_from_a_field(tmp_path):
    path = write_jsonl(
        tmp_path / "custom.jsonl",
        [
            {"q": "What is 6*7?", "gold": "42", "difficulty": "easy"},
            {"q": "Integrate x^2 from 0 to 3.", "gold": "9", "difficulty": "hard"},
            {"q": "Unknown difficulty here.", "gold": "1", "difficulty": "weird"},
        ],
    )
    source = SourceConfig(
        kind="mapped",
        path=path,
        columns={"prompt": "q", "answer": "gold"},
        domain="qa",
        level_field="difficulty",
        level_map={"easy": 1, "hard": 3},
    )
    loaded = load_source(source, ValidationConfig())
    assert loaded.problems.select("prompt", "level", "domain", "verifier").rows() == [
        ("What is 6*7?", 1, "qa", "qa"),
        ("Integrate x^2 from 0 to 3.", 3, "qa", "qa"),
    ]
    assert loaded.quarantined.select("source_line", "field").rows() == [(3, "difficulty")]
    assert json.loads(loaded.problems["metadata"][0]) == {"difficulty": "easy"}


@pytest.mark.parametrize(
    "kind, rows",
    [
        ("math", [{"problem": "x" * (10 + i), "answer": str(i)} for i in range(10)]),
        ("gsm8k", [{"question": "x" * (10 + i), "answer": f"#### {i}"} for i in range(10)]),
    ],
)
def test_level_range_splits_by_prompt_length_for_any_file(tmp_path, kind, rows):
    source = SourceConfig(kind=kind, path=write_jsonl(tmp_path / "m.jsonl", rows), level=(3, 4))
    levels = load_source(source, ValidationConfig()).problems.sort(pl.col("answer").cast(pl.Int64))["level"].to_list()
    assert levels == [3] * 5 + [4] * 5


def test_config_rules_for_levels_and_columns():
    with pytest.raises(ValueError, match="give procedural sources one level"):
        SourceConfig(kind="generator", level=(1, 2))
    with pytest.raises(ValueError, match="columns can map only"):
        SourceConfig(kind="mapped", path="x.jsonl", columns={"prompt": "q", "level": "lvl"})


def test_generator_rows_record_seed_and_parameters():
    loaded = load_source(SourceConfig(kind="generator", generator="level4", count=20, seed=11), ValidationConfig())
    problems = loaded.problems
    assert problems.height == 20 and problems["level"].unique().to_list() == [4]
    assert problems["seed"].null_count() == 0 and problems["source_line"].null_count() == 20
    params = json.loads(problems["params"][0])
    assert (
        params["selector"] == "level4"
        and params["source_seed"] == 11
        and params["generator"] == problems["source_uri"][0]
    )


def test_gym_domains_come_from_the_category():
    assert gym_domain("basic_arithmetic") == "math"
    assert gym_domain("knights_knaves") == "logic"
    assert gym_domain("bf") == "code"


def test_gym_rows_keep_what_rebuilds_them():
    loaded = load_source(
        SourceConfig(kind="gym", dataset="knights_knaves", count=5, seed=2, level=3), ValidationConfig()
    )
    row = loaded.problems.row(0, named=True)
    assert row["domain"] == "logic" and row["verifier"] == "gym" and row["level"] == 3
    assert json.loads(row["params"]) == {"dataset": "knights_knaves", "config": {}, "size": 5, "index": 0}
    assert json.loads(row["metadata"])["source_dataset"] == "knights_knaves"


def test_unknown_gym_dataset():
    with pytest.raises(ValueError, match="unknown reasoning-gym dataset"):
        load_source(SourceConfig(kind="gym", dataset="no_such_thing"), ValidationConfig())


def test_source_files_on_s3(s3_env, tmp_path):
    from storage.location import s3_filesystem

    local = write_jsonl(tmp_path / "g.jsonl", [{"question": "1+1?", "answer": "<<1+1=2>>\n#### 2"}])
    s3_filesystem().put(local, f"{s3_env}/sources/g.jsonl")
    frame = pl.DataFrame({"prompt": ["Add 2 and 3."], "answer": ["5"]})
    with s3_filesystem().open(f"{s3_env}/sources/m.parquet", "wb") as handle:
        frame.write_parquet(handle)
    gsm8k = load_source(SourceConfig(kind="gsm8k", path=f"s3://{s3_env}/sources/g.jsonl"), ValidationConfig())
    math = load_source(SourceConfig(kind="math", path=f"s3://{s3_env}/sources/m.parquet"), ValidationConfig())
    assert gsm8k.problems["answer"].to_list() == ["2"] and math.problems["answer"].to_list() == ["5"]


def test_preflight_refuses_unknown_procedural_sources_before_any_work():
    from tasks.curation.config import CurationConfig
    from tasks.curation.stage import preflight

    with pytest.raises(ValueError, match="unknown generator 'level7'"):
        preflight(CurationConfig(sources=[SourceConfig(kind="generator", generator="level7")]))
    with pytest.raises(ValueError, match="unknown reasoning-gym dataset"):
        preflight(CurationConfig(sources=[SourceConfig(kind="gym", dataset="nope")]))
    with pytest.raises(ValueError, match="share the names"):
        preflight(CurationConfig(sources=[SourceConfig(kind="generator"), SourceConfig(kind="generator")]))
