"""`rlvr bench lake-scale` at a laptop's size, so that it cannot rot: a few iterations through the loop's write
paths, the standard queries through `rlvr sql`, maintenance, and a lake on moto's S3 server (its figures are
measured in the benchmark, not checked here); and the steps after the iterations, which must hold a file at a
time and never the lake (at two million rollouts, reading tables whole got the benchmark killed)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from conftest import BIN, ROOT

from bench.lake_scale import plain_parquet
from bench.lake_scale_s3 import RequestLog
from bench.lake_synthetic import synthetic_iteration, vocabulary
from storage.lake import Lake

KEYS = {"bookkeeping_growth", "max_query_seconds", "lineage_seconds", "bytes_ratio", "s3_requests_per_iteration"}


def test_the_lake_scale_benchmark_runs_through_the_loops_write_paths(tmp_path):
    result = subprocess.run(
        [
            str(BIN / "rlvr"),
            "bench",
            "lake-scale",
            "--iterations",
            "3",
            "--rollouts",
            "32",
            "--max-tokens",
            "256",
            "--s3-iterations",
            "2",
            "--maintain-every",
            "2",
            "--format",
            "json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)["figures"]
    assert KEYS <= set(figures)
    assert figures["rollouts"] == 3 * 32 and figures["tokens"] > 0 and figures["iterations"] == 3
    assert [entry["iteration"] for entry in figures["bookkeeping"]] == [3]
    assert set(figures["queries_seconds"]) == {
        "solve_rate_by_level",
        "filter_stats",
        "staleness_histogram",
        "problem_history",
        "tokens_by_model_version",
        "lineage",
    }
    tables = figures["bytes"]
    assert set(tables) == {"rollouts", "rewards", "groups", "advantages", "batches", "dbb_state", "iteration_metrics"}
    assert all(
        entry["delta_bytes"] > 0 and entry["plain_bytes"] > 0 and entry["files"] == 2 for entry in tables.values()
    )
    # two files a table before the last maintenance: iterations 1-2 compacted by the scheduled one, and 3
    assert figures["scheduled_maintenance"]["runs"] == 1  # after iteration 2
    assert 0 < figures["lineage_in_process_seconds"] and 0 < figures["trivial_query_seconds"]
    assert figures["files_after_maintenance"] == dict.fromkeys(tables, 1)  # three iterations' files compacted as one
    s3 = figures["s3"]
    assert len(s3["requests"]) == 2 and all(count > 0 for count in s3["requests"])
    assert s3["requests_by_method"]["PUT"] > 0 and s3["requests_by_method"]["GET"] > 0
    # memory: this process at each checkpoint and after each step, each command's peak, moto's
    assert all(entry["rss_mb"] > 0 and entry["peak_rss_mb"] >= entry["rss_mb"] for entry in figures["bookkeeping"])
    assert list(figures["rss_after"]) == ["iterations", "count", "bytes", "end", "s3"]
    assert (
        figures["peak_rss_mb"] >= figures["rss_after"]["end"]["peak_rss_mb"] >= figures["bookkeeping"][0]["peak_rss_mb"]
    )
    peaks = figures["queries_peak_rss_mb"]
    assert figures["query_peak_rss_mb"] == max(peaks[name] for name in peaks if name != "lineage") > 0
    assert set(figures["queries_peak_rss_mb"]) == set(figures["queries_seconds"])
    assert figures["child_peak_rss_mb"]["maintenance"] > 0 and s3["server_peak_rss_mb"] > 0


# The steps after the iterations, in a fresh process: what Arrow's memory pool held at its peak (the pool counts
# every buffer a scan, a decode or the Parquet writer allocates), with the copy's and the count's results.
MEASURE = """
import json, sys
from pathlib import Path
import pyarrow as pa
from bench.lake_scale import rollout_totals, stored_bytes
from storage.lake import Lake
lake = Lake.open(sys.argv[1])
sizes = stored_bytes(lake, Path(sys.argv[2]), tables=("rollouts",), batch_rows=64, row_group_bytes=1 << 20)
print(json.dumps({"peak_mb": pa.default_memory_pool().max_memory() / 2**20, **sizes["rollouts"], **rollout_totals(lake)}))
"""


def write_rollouts(lake, iterations: range, rng, words) -> int:
    """Iterations of 256 rollouts (16 groups of 16) of the benchmark's own synthetic rows, up to 16,384 tokens
    long (about 14 KB a row in Arrow); returns their tokens."""
    bank = pl.DataFrame({"problem_id": [f"p{i}" for i in range(64)], "solve_rate": [0.5] * 64})
    tokens = 0
    for iteration in iterations:
        rows, _ = synthetic_iteration(rng, bank, iteration, 256, 16384, words)
        with lake.run("rl-iteration", "rollout", {}, iteration=iteration) as run:
            lake.replace("rollouts", rows, {"iteration": iteration}, run)
        tokens += rows["n_tokens"].sum()
    return tokens


def after_the_iterations(lake_uri: str, folder: Path) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, lake_uri, str(folder)], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.mark.slow  # a fresh process over two lakes of 3 and 24 iterations
def test_the_steps_after_the_iterations_hold_a_file_at_a_time_not_the_lake(tmp_path):
    """The plain-Parquet baseline and the rollouts' count, on a lake of 3 iterations and then of 24: the peak of
    Arrow's memory pool stays flat, where reading the table whole (the benchmark before: 23.8 GB resident at two
    million rollouts, killed) grows with it (here about 33 → 111 MiB read whole, 28 → 33 MiB streamed). The pool's own
    account, not the process's resident set: it counts buffers, so neither a loaded machine nor what the
    interpreter and its imports hold moves it, and the two peaks differ only by what the lake's size adds."""
    lake_uri = str(tmp_path / "lake")
    lake, rng, words = Lake.open(lake_uri), np.random.default_rng(0), vocabulary()
    tokens = write_rollouts(lake, range(1, 4), rng, words)
    small = after_the_iterations(lake_uri, tmp_path)
    tokens += write_rollouts(lake, range(4, 25), rng, words)
    large = after_the_iterations(lake_uri, tmp_path)
    assert (small["rollouts"], large["rollouts"]) == (3 * 256, 24 * 256)
    assert large["tokens"] == tokens and large["files"] == 24
    whole_mb = lake.dataset("rollouts").to_table().nbytes / 2**20
    assert large["peak_mb"] < 1.6 * small["peak_mb"]  # 8× the rows, the same peak
    assert large["peak_mb"] < whole_mb / 2  # the table was never held at once
    # the copy holds the same rows, as zstd Parquet: within a tenth of Delta's own bytes for them
    assert 0.9 < large["plain_bytes"] / large["delta_bytes"] < 1.1
    assert not list(tmp_path.glob("*.parquet"))  # each copy removed once measured


def test_the_plain_copy_is_the_tables_rows_in_row_groups_of_bounded_size(tmp_path):
    lake = Lake.open(str(tmp_path / "lake"))
    write_rollouts(lake, range(1, 3), np.random.default_rng(1), vocabulary())
    plain = tmp_path / "plain.parquet"
    size = plain_parquet(lake, "rollouts", plain, batch_rows=64, row_group_bytes=1)
    copy = pq.ParquetFile(plain)
    assert size == plain.stat().st_size
    assert copy.read().equals(lake.dataset("rollouts").to_table())
    # every batch passes a row group of 1 byte: two files of 256 rows, in batches of 64, are 8 row groups of 64
    assert [copy.metadata.row_group(i).num_rows for i in range(copy.metadata.num_row_groups)] == [64] * 8


def test_a_table_under_the_row_group_size_is_one_row_group_as_pq_write_table_writes_it(tmp_path):
    lake = Lake.open(str(tmp_path / "lake"))
    write_rollouts(lake, range(1, 2), np.random.default_rng(2), vocabulary())
    streamed, whole = tmp_path / "streamed.parquet", tmp_path / "whole.parquet"
    plain_parquet(lake, "rollouts", streamed, batch_rows=64)
    pq.write_table(lake.dataset("rollouts").to_table(), whole, compression="zstd")
    assert pq.ParquetFile(streamed).metadata.num_row_groups == 1
    assert streamed.stat().st_size == whole.stat().st_size


def test_the_request_log_counts_each_complete_line_once(tmp_path):
    path = tmp_path / "moto.log"
    path.write_text(
        '127.0.0.1 - - "GET /lake HTTP/1.1" 200 -\n127.0.0.1 - - "PUT /lake/a HTTP/1.1" 200 -\n127.0.0.1 - - "HEAD /la'
    )
    log = RequestLog(path)
    assert log.new_requests() == ["GET", "PUT"]
    with path.open("a") as handle:  # the half-written line completes, another follows
        handle.write('ke/a HTTP/1.1" 200 -\n127.0.0.1 - - "DELETE /lake/a HTTP/1.1" 204 -\n')
    assert log.new_requests() == ["HEAD", "DELETE"]
    assert log.new_requests() == []
