"""`rlvr bench lake-scale` at a laptop's size, so that it cannot rot: a few iterations through the loop's write
paths, the standard queries through `rlvr sql`, maintenance, and a lake on moto's S3 server (its figures are
measured in the benchmark, not checked here)."""

import json
import subprocess

from conftest import BIN

KEYS = {"bookkeeping_growth", "max_query_seconds", "lineage_seconds", "bytes_ratio", "s3_requests_per_iteration"}


def test_the_lake_scale_benchmark_runs_through_the_loops_write_paths(tmp_path):
    result = subprocess.run([str(BIN / "rlvr"), "bench", "lake-scale", "--iterations", "3", "--rollouts", "32",
                             "--max-tokens", "256", "--s3-iterations", "2", "--maintain-every", "2", "--format", "json"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)["figures"]
    assert KEYS <= set(figures)
    assert figures["rollouts"] == 3 * 32 and figures["tokens"] > 0 and figures["iterations"] == 3
    assert [entry["iteration"] for entry in figures["bookkeeping"]] == [3]
    assert set(figures["queries_seconds"]) == {"solve_rate_by_level", "filter_stats", "staleness_histogram",
                                               "problem_history", "tokens_by_model_version", "lineage"}
    tables = figures["bytes"]
    assert set(tables) == {"rollouts", "rewards", "groups", "advantages", "batches", "dbb_state", "iteration_metrics"}
    assert all(entry["delta_bytes"] > 0 and entry["plain_bytes"] > 0 and entry["files"] == 2 for entry in tables.values())
    # two files a table before the last maintenance: iterations 1-2 compacted by the scheduled one, and 3
    assert figures["scheduled_maintenance"]["runs"] == 1                   # after iteration 2
    assert 0 < figures["lineage_in_process_seconds"] and 0 < figures["trivial_query_seconds"]
    assert figures["files_after_maintenance"] == dict.fromkeys(tables, 1)  # three iterations' files compacted as one
    s3 = figures["s3"]
    assert len(s3["requests"]) == 2 and all(count > 0 for count in s3["requests"])
    assert s3["requests_by_method"]["PUT"] > 0 and s3["requests_by_method"]["GET"] > 0
