"""`rlvr lineage model-version`: the chain of versions with what each one's batches held, computed by one join
over the chain (the same output as the per-version filtering it replaced, 1a9b9f9), so its work does not grow
as versions × rollouts."""

import json
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pytest

from storage.lake import Lake
from storage.lineage import _chain_batches, model_version_lineage

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def write(lake: Lake, table: str, rows: dict, key: dict) -> str:
    with lake.run("test", f"write-{table}", {}) as run:
        lake.replace(table, pl.DataFrame(rows), key, run)
    return run.run_id


def batch(lake: Lake, iteration: int, batches: dict[str, list[str]]) -> str:
    ids = [(name, rollout) for name, rollouts in batches.items() for rollout in rollouts]
    return write(
        lake,
        "batches",
        {
            "batch_id": [b for b, _ in ids],
            "iteration": [iteration] * len(ids),
            "rollout_id": [r for _, r in ids],
            "group_id": ["g"] * len(ids),
            "advantage": [0.5] * len(ids),
            "weight": [1.0] * len(ids),
        },
        {"iteration": iteration},
    )


@pytest.fixture
def chain(tmp_path):
    """Versions 0 (base) to 5, each trained at its iteration on batch b<i> of the four rollouts r<i>-0..3 (problem
    p((i + k) % 6), sampled by version i - 1; iteration 3's last two by version 1, lagging). Version 2's batch also
    names r2-gone, a rollout no longer stored; version 4 consumed b4 and b9 (a batch of iteration 9, which no
    version trained at); version 5's batch was replaced since. Problems p0-p3 are of bank version 1, p4-p5 of 2.
    Returns the lake and the run ids of each iteration's rollouts and batches."""
    lake = Lake.open(str(tmp_path / "lake"))
    for bank, ids in ((1, ["p0", "p1", "p2", "p3"]), (2, ["p4", "p5"])):
        write(
            lake,
            "problems",
            {
                "problem_id": ids,
                "bank_version": [bank] * len(ids),
                "source": ["s"] * len(ids),
                "source_kind": ["generator"] * len(ids),
                "source_uri": ["mix"] * len(ids),
                "split": ["train"] * len(ids),
                "domain": ["math"] * len(ids),
                "level": [1] * len(ids),
                "prompt": ids,
                "verifier": ["math"] * len(ids),
            },
            {"bank_version": bank},
        )
    sampled_runs, batch_runs = {}, {}
    for iteration in (1, 2, 3, 4, 5, 9):
        sampler = {3: [2, 2, 1, 1], 9: [3] * 4}.get(iteration, [iteration - 1] * 4)
        sampled_runs[iteration] = write(
            lake,
            "rollouts",
            {
                "rollout_id": [f"r{iteration}-{k}" for k in range(4)],
                "iteration": [iteration] * 4,
                "problem_id": [f"p{(iteration + k) % 6}" for k in range(4)],
                "group_id": ["g"] * 4,
                "sample_idx": list(range(4)),
                "model_version": sampler,
                "response": ["#### 1"] * 4,
            },
            {"iteration": iteration},
        )
        rollouts = [f"r{iteration}-{k}" for k in range(4)] + (["r2-gone"] if iteration == 2 else [])
        batch_runs[iteration] = batch(lake, iteration, {f"b{iteration}": rollouts})
    batch(lake, 5, {"b5-again": ["r5-0"]})  # iteration 5's advantages re-run after training
    for version in range(6):
        write(
            lake,
            "model_versions",
            {
                "model_version": [version],
                "parent_version": [version - 1 if version else None],
                "kind": ["rl" if version else "base"],
                "checkpoint_uri": [f"/ckpt/v{version}"],
                "iteration": [version or None],
                "metrics": [json.dumps({"loss": version / 10}) if version else None],
                "batch_ids": [{0: None, 4: ["b4", "b9"]}.get(version, [f"b{version}"])],
                "created_at": [NOW],
            },
            {"model_version": version},
        )
    return lake, sampled_runs, batch_runs


def per_version_lineage(lake: Lake, version: int) -> list[dict[str, Any]]:
    """The function as it was before 1a9b9f9: each version's batches, rollouts and problems filtered apart."""
    versions = {row["model_version"]: row for row in lake.read("model_versions").iter_rows(named=True)}
    rows, current = [], version
    while current is not None and current in versions:
        rows.append(versions[current])
        current = versions[current]["parent_version"]
    batches, rollouts, problems = _chain_batches(lake, rows)
    chain = []
    for row in rows:
        entry = {
            key: row[key]
            for key in (
                "model_version",
                "parent_version",
                "kind",
                "iteration",
                "checkpoint_uri",
                "batch_ids",
                "run_id",
                "created_at",
            )
        }
        entry["metrics"] = json.loads(row["metrics"] or "{}")
        batch = batches.filter(pl.col("batch_id").is_in(row["batch_ids"])) if row["batch_ids"] else None
        if batch is not None and batch.is_empty():
            entry["replaced_batches"] = list(row["batch_ids"])
        elif batch is not None:
            sampled = rollouts.filter(pl.col("rollout_id").is_in(batch["rollout_id"].implode()))
            banked = problems.filter(pl.col("problem_id").is_in(sampled["problem_id"].unique().implode()))
            entry |= {
                "rollouts": batch.height,
                "problems": sampled["problem_id"].n_unique(),
                "sampled_by": sorted(set(sampled["model_version"].to_list())),
                "bank_versions": sorted(set(banked["bank_version"].to_list())),
                "runs": sorted(set(batch["run_id"].to_list()) | set(sampled["run_id"].to_list())),
            }
        chain.append(entry)
    return chain


def test_the_chain_is_what_the_per_version_filtering_gave(chain):
    lake, sampled_runs, batch_runs = chain
    result = model_version_lineage(lake, 5)
    assert result == per_version_lineage(lake, 5)
    by_version = {entry["model_version"]: entry for entry in result}
    assert [entry["model_version"] for entry in result] == [5, 4, 3, 2, 1, 0]
    assert by_version[5]["replaced_batches"] == ["b5"] and "rollouts" not in by_version[5]
    # version 4: b4 (r4-0..3: p4 p5 p0 p1) and b9 (r9-0..3: p3 p4 p5 p0), sampled by versions 3 and 3
    assert {k: by_version[4][k] for k in ("rollouts", "problems", "sampled_by", "bank_versions")} == {
        "rollouts": 8,
        "problems": 5,
        "sampled_by": [3],
        "bank_versions": [1, 2],
    }
    assert by_version[4]["runs"] == sorted([batch_runs[4], batch_runs[9], sampled_runs[4], sampled_runs[9]])
    assert by_version[3]["sampled_by"] == [1, 2] and by_version[3]["problems"] == 4  # p3 p4 p5 p0
    assert by_version[2]["rollouts"] == 5 and by_version[2]["problems"] == 4  # r2-gone: counted, no problem
    assert by_version[1]["metrics"] == {"loss": 0.1} and by_version[1]["bank_versions"] == [1, 2]  # p1-p3, p4
    assert "rollouts" not in by_version[0] and by_version[0]["metrics"] == {}


def test_the_work_does_not_grow_with_the_versions(chain, monkeypatch):
    """The chain is summarised by one join and one grouping: walking back 5 versions filters frames as often
    as walking back 2 (the per-version code filtered each version's batches, rollouts and problems)."""
    lake, _, _ = chain
    calls, original = [], pl.DataFrame.filter
    monkeypatch.setattr(pl.DataFrame, "filter", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))

    def filters(version: int, lineage) -> int:
        calls.clear()
        lineage(lake, version)
        return len(calls)

    assert filters(5, model_version_lineage) == filters(2, model_version_lineage)
    assert filters(5, per_version_lineage) > filters(2, per_version_lineage)  # what the test tells apart
