"""`rlvr import verl`: verl's rollout dumps (`<dir>/<step>.jsonl`, written as `ray_trainer._dump_generations`
writes them, scored by the platform's `compute_score`) into the lake under the trainer's run, each response traced
back to its problem and analysed by `rlvr analyze sampling`; a file imported before is skipped, a bad one refused naming file, line and field."""

import json

import polars as pl
import pyarrow.compute as pc
from conftest import run_cli

from flows.curation import curate_bank
from storage.lake import Lake
from tasks.interop.rewards import compute_score


def verl_dump(folder, rows, step, with_extras):
    """One step's dump: verl's fixed keys, and (with `with_extras`) every key the reward function returned."""
    folder.mkdir(exist_ok=True)
    lines = []
    for index, row in enumerate(rows):
        truth = row["reward_model"]["ground_truth"]
        output = f"Let me think.\n#### {truth if index < len(rows) // 2 else 'x'}"
        scored = compute_score(row["data_source"], output, truth, row["extra_info"])
        line = {
            "input": f"user\n{row['prompt'][0]['content']}\nassistant\n",
            "output": output,
            "gts": truth,
            "score": scored["score"],
            "step": step,
        }
        lines.append({**line, **(scored if with_extras else {})})
    (folder / f"{step}.jsonl").write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))


def test_verl_dumps_land_in_the_lake_once_with_their_problems(tmp_path):
    lake_uri = str(tmp_path / "lake")
    curate_bank({"sources": [{"kind": "generator", "generator": "mix", "count": 30, "seed": 1}]}, lake_uri)
    exported = tmp_path / "train.parquet"
    assert run_cli("export", "--to", "verl", "--out", str(exported), "--lake", lake_uri).returncode == 0
    rows = [row for row in pl.read_parquet(exported).to_dicts() if row["ability"] == "math"][:4]
    dumps = tmp_path / "rollout_data"
    verl_dump(dumps, rows * 2, 1, with_extras=True)  # 4 problems × 2 responses a step
    verl_dump(dumps, rows * 2, 2, with_extras=False)  # no problem_id: found by ground truth and prompt

    imported = run_cli(
        "import", "verl", str(dumps), "--run", "verl-1", "--model", "qwen-7b", "--lake", lake_uri, "--format", "json"
    )
    assert imported.returncode == 0, imported.stderr
    assert [json.loads(line)["rollouts"] for line in imported.stdout.splitlines()] == [8, 8]
    lake = Lake.open(lake_uri)
    rollouts = lake.read("rollouts")
    assert sorted(set(rollouts["iteration"])) == [1, 2] and rollouts.height == 16
    assert set(rollouts["problem_id"]) == {row["extra_info"]["problem_id"] for row in rows}
    rewards = lake.read("rewards")
    first = rewards.filter(pl.col("iteration") == 1)
    assert set(first["verifier"]) == {"math"} and first["correct"].sum() == 4 and first["reward"].sum() == 4.0
    second = rewards.filter(pl.col("iteration") == 2)
    assert set(second["verifier"]) == {"verl"} and second["correct"].null_count() == 8
    groups = lake.read("groups").sort("iteration")
    assert groups.height == 8 and set(groups.filter(pl.col("iteration") == 1)["solve_rate"]) == {0.5}
    assert groups.filter(pl.col("iteration") == 2)["solve_rate"].null_count() == 4  # no verdict, no solve rate
    assert set(groups.filter(pl.col("iteration") == 2)["mean_reward"]) == {0.5}
    versions = lake.read("model_versions").sort("model_version")
    assert versions["served_name"].to_list() == ["qwen-7b"] * 2 and versions["parent_version"].to_list() == [None, 0]

    analysis = run_cli("analyze", "sampling", "--iteration", "1", "--lake", lake_uri, "--format", "json")
    assert analysis.returncode == 0, analysis.stderr
    analysed = [json.loads(line) for line in analysis.stdout.splitlines()]
    assert len(analysed) == 4 and {(row["samples"], row["solve_rate"], row["zone"]) for row in analysed} == {
        (2, 0.5, "learning_zone")
    }

    again = run_cli("import", "verl", str(dumps), "--run", "verl-1", "--lake", lake_uri, "--format", "json")
    assert [json.loads(line)["status"] for line in again.stdout.splitlines()] == ["imported before"] * 2
    assert lake.read("rollouts").height == 16

    (dumps / "3.jsonl").write_text(
        json.dumps({"input": "q", "output": "a", "score": 1.0, "step": 3})
        + "\n"
        + json.dumps({"input": "q", "output": "a", "step": 3})
        + "\n"
    )
    bad = run_cli("import", "verl", str(dumps), "--run", "verl-1", "--lake", lake_uri)
    assert bad.returncode == 2 and "3.jsonl:2: field `score`" in bad.stderr
    assert lake.read("rollouts").height == 16

    validation = tmp_path / "validation_data"
    verl_dump(validation, rows, 2, with_extras=True)
    clash = run_cli("import", "verl", str(validation), "--run", "verl-1-validation", "--lake", lake_uri)
    assert clash.returncode == 2 and "holds rollouts of external:verl-1" in clash.stderr
    offset = run_cli(
        "import",
        "verl",
        str(validation),
        "--run",
        "verl-1-validation",
        "--iteration-offset",
        "1000",
        "--lake",
        lake_uri,
    )
    assert offset.returncode == 0, offset.stderr
    assert lake.read("rollouts", filter=pc.field("iteration") == 1002).height == 4
