"""`rlvr bench lake-scale`: what a long run's lake costs to write, query, store and keep in shape, and what
the benchmark itself holds in memory while it measures that.

The run is synthetic but written through the loop's own write paths (bench/lake_synthetic.py).

Measured:
- bookkeeping per iteration: what does not grow with the iteration's rows but may with the lake's age — the
  stage runs' start and end rows, the stage keys' reads (run ids, the bank and model versions, the batch), the
  advantage stage's reads (the iteration's scored rollouts, the last DBB state) and `iteration_row`; the
  median over the five iterations ending at each checkpoint (10, 100, 1,000, 2,000 and the last);
- the standard analytics as `rlvr sql` wall times (a process each, as a user runs them) and `rlvr lineage
  model-version` of the last version, before and after `rlvr lake maintain --retention-hours 0`; beside them a
  `select 1` (a process's start-up: the floor of every command) and the lineage walk in-process;
- bytes: the iteration tables' live files against the same rows written once as plain zstd Parquet;
- S3: a second lake on moto's server (loopback) for `s3_iterations` iterations, its requests counted from
  moto's access log per iteration;
- memory: this process's resident set at each checkpoint and after each step that follows the iterations
  (now and at its peak so far), and each child's peak (every `rlvr` command, the lineage walk, moto's server),
  as the kernel accounts it when the child is reaped.

Every step streams, so the benchmark's own memory stays flat in the lake's size (a run of 2,048,000 rollouts,
a 14 GB lake, was killed at 23.8 GB resident when the baseline and the count read whole tables): the rollouts'
count and tokens are summed batch by batch over the table's visible rows; the plain-Parquet baseline is
written batch by batch, a row group at a time (`plain_parquet`); moto's log is read on from where the last
iteration's count ended; the queries, the lineage walk and the final maintenance run in processes of their
own. Only small numbers a checkpoint or an iteration are kept.

Maintenance runs on a schedule, as the `lake-maintenance` deployment runs it beside a loop: after every
`maintain_every` iterations (in between, not timed as bookkeeping; its own times are reported), with the
retention given (the synthetic run lasts hours, not the weeks a real retention spans).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.lake_scale_s3 import s3_requests
from bench.lake_synthetic import GROUP_SIZE, seeded_lake, vocabulary, write_iteration
from bench.memory import MIB, Child, memory_now, run_child
from flows.display import console

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = (
    "bench/lake_scale.py",
    "bench/lake_scale_s3.py",
    "bench/lake_synthetic.py",
    "bench/memory.py",
    "storage/",
    "tasks/advantages/",
    "flows/stage_plans.py",
    "flows/loop_steps.py",
    "flows/cli/",
)

BIN = Path(sys.executable).parent
CHECKPOINTS = (10, 100, 1000, 2000)
WINDOW = 5  # iterations whose median bookkeeping a checkpoint reports
QUERIES = {
    "solve_rate_by_level": "select g.iteration, p.level, avg(g.solve_rate) as solve_rate from groups g join "
    "(select distinct problem_id, level from problems) p using (problem_id) group by all "
    "order by 1, 2",
    "filter_stats": "select * from filter_stats",
    "staleness_histogram": "select staleness, count(*) as rollouts from advantages group by 1 order by 1",
    "problem_history": "select r.iteration, count(*) as samples, avg(w.reward) as mean_reward from rollouts r join "
    "rewards w using (rollout_id) where r.problem_id = '{problem}' group by 1 order by 1",
    "tokens_by_model_version": "select model_version, count(*) as rollouts, sum(n_tokens) as tokens from rollouts "
    "group by 1 order by 1",
}
ITERATION_TABLES = ("rollouts", "rewards", "groups", "advantages", "batches", "dbb_state", "iteration_metrics")
BATCH_ROWS = 1024  # rows a scan hands over at once: about 15 MiB of rollouts at the default lengths
ROW_GROUP_BYTES = 128 * MIB  # the plain baseline's row groups, in Arrow bytes (Delta's compaction targets 128 MB)
ROW_GROUP_ROWS = 1024 * 1024  # pq.write_table's default row group


def cli(*arguments: str, lake_uri: str, env: dict | None = None) -> Child:
    """One `rlvr` command, its wall time and peak resident set (it must succeed)."""
    result = run_child([str(BIN / "rlvr"), *arguments, "--lake", lake_uri], env={**os.environ, **(env or {})})
    if result.returncode != 0:
        raise RuntimeError(f"rlvr {' '.join(arguments[:2])} failed: {result.stderr[-2000:]}")
    return result


def query_runs(lake_uri: str, problem: str, last_version: int) -> dict[str, Child]:
    """The standard queries, each an `rlvr sql` process, and `rlvr lineage model-version` of the last version."""
    runs = {
        name: cli("sql", "--format", "json", sql.format(problem=problem), lake_uri=lake_uri)
        for name, sql in QUERIES.items()
    }
    runs["lineage"] = cli("lineage", "model-version", str(last_version), lake_uri=lake_uri)
    return runs


LINEAGE_WALK = """
import sys, time
from storage.lake import Lake
from storage.lineage import model_version_lineage
lake = Lake.open(sys.argv[1])
started = time.perf_counter()
model_version_lineage(lake, int(sys.argv[2]))
print(time.perf_counter() - started)
"""


def lineage_in_process(lake_uri: str, last_version: int) -> Child:
    """The lineage walk itself, timed inside a fresh process (its imports and start-up not counted: the seconds
    are what it prints)."""
    result = run_child(
        [sys.executable, "-c", LINEAGE_WALK, lake_uri, str(last_version)], cwd=Path(__file__).resolve().parent.parent
    )
    if result.returncode != 0:
        raise RuntimeError(f"the lineage walk failed: {result.stderr[-2000:]}")
    result.seconds = float(result.stdout.split()[-1])
    return result


def batches(lake, name: str, columns: list[str] | None = None, batch_rows: int = BATCH_ROWS):
    """A table's rows, `batch_rows` at a time, one file after another: what is held is one file's read, never
    the table's. (A dataset scan reads files ahead of a slow consumer: writing the plain copy behind it, most of
    a twelve-file table was in memory at once.) Every run of the synthetic run completed, so these are the
    visible rows; a run left hidden is an error here, not rows to filter out."""
    hidden = lake.hidden_runs()
    if hidden:
        raise RuntimeError(f"{len(hidden)} runs never completed (the first: {sorted(hidden)[0]})")
    dataset = lake.dataset(name)
    for fragment in dataset.get_fragments():
        yield from fragment.to_batches(schema=dataset.schema, columns=columns, batch_size=batch_rows, batch_readahead=1)


def rollout_totals(lake) -> dict[str, int]:
    """Rollouts and response tokens in the lake, summed batch by batch."""
    import pyarrow.compute as pc

    rollouts = tokens = 0
    for batch in batches(lake, "rollouts", ["n_tokens"], batch_rows=64 * BATCH_ROWS):
        rollouts += batch.num_rows
        tokens += pc.sum(batch.column(0)).as_py() or 0
    return {"rollouts": rollouts, "tokens": tokens}


def plain_parquet(
    lake, name: str, path: Path, batch_rows: int = BATCH_ROWS, row_group_bytes: int = ROW_GROUP_BYTES
) -> int:
    """Writes a table's visible rows once as plain zstd Parquet and returns its bytes. Streamed: the batches
    of a row group are held until they reach `row_group_bytes` of Arrow data or `pq.write_table`'s default of
    1 Mi rows, then written as one row group; a table smaller than that is one row group, as `pq.write_table`
    would write it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = lake.dataset(name).schema
    pending, size, rows = [], 0, 0
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for batch in batches(lake, name, batch_rows=batch_rows):
            pending.append(batch)
            size, rows = size + batch.nbytes, rows + batch.num_rows
            if size >= row_group_bytes or rows >= ROW_GROUP_ROWS:
                writer.write_table(pa.Table.from_batches(pending, schema), row_group_size=rows)
                pending, size, rows = [], 0, 0
        if pending:
            writer.write_table(pa.Table.from_batches(pending, schema), row_group_size=rows)
    return path.stat().st_size


def stored_bytes(
    lake, folder: Path, tables: tuple[str, ...] = ITERATION_TABLES, **streaming
) -> dict[str, dict[str, int]]:
    """Per iteration table: its live data files' bytes, its log's bytes, and the same rows written once as plain
    zstd Parquet (`plain_parquet`, with `streaming`'s batch and row-group sizes; the copy is removed once
    measured, so the disk holds one table's copy at a time)."""
    sizes = {}
    for name in tables:
        actions = lake.table(name).get_add_actions(flatten=True)
        log = Path(lake.log_path(name))  # a local lake: the log's files as they are on disk
        plain = folder / f"{name}.parquet"
        sizes[name] = {
            "delta_bytes": int(sum(actions.column("size_bytes").to_pylist())),
            "log_bytes": sum(f.stat().st_size for f in log.iterdir() if f.is_file()),
            "plain_bytes": plain_parquet(lake, name, plain, **streaming),
            "files": actions.num_rows,
        }
        plain.unlink()
    return sizes


def write_run(
    lake,
    bank,
    work: Path,
    iterations: int,
    rollouts: int,
    max_tokens: int,
    seed: int,
    maintain_every: int,
    retention_hours: float,
) -> tuple[list[dict], float, list[float]]:
    """The synthetic run's iterations, with the scheduled maintenance; returns the checkpoints (bookkeeping and
    row-write medians, this process's resident set then and at its peak so far), the seconds spent writing
    and each maintenance's seconds."""
    import numpy as np

    from storage.maintenance import MaintenanceConfig, maintain
    from storage.progress import track

    rng, words = np.random.default_rng(seed), vocabulary()
    checkpoints = sorted({c for c in CHECKPOINTS if c <= iterations} | {iterations})
    clocks, maintenances, memory = [], [], {}
    started = time.perf_counter()
    for iteration in track(range(1, iterations + 1), "lake-scale iterations", total=iterations):
        clocks.append(write_iteration(lake, bank, rng, iteration, rollouts, max_tokens, words, work))
        if maintain_every and iteration % maintain_every == 0:
            began = time.perf_counter()
            maintain(lake, MaintenanceConfig(retention_hours=retention_hours))
            maintenances.append(time.perf_counter() - began)
        if iteration in checkpoints:
            memory[iteration] = memory_now()
    write_seconds = time.perf_counter() - started - sum(maintenances)
    growth = []
    for checkpoint in checkpoints:
        window = clocks[max(0, checkpoint - WINDOW) : checkpoint]
        growth.append(
            {
                "iteration": checkpoint,
                "bookkeeping_seconds": statistics.median(c.bookkeeping for c in window),
                "write_seconds": statistics.median(c.writes for c in window),
                **memory[checkpoint],
            }
        )
    return growth, write_seconds, maintenances


def after_the_run(lake, lake_uri: str, problem: str, work: Path) -> dict:
    """What is measured once the iterations are written, each step streamed or in a process of its own; with
    this process's resident set after each step (`rss_after`)."""
    from storage.registry import latest_version

    rss_after = {"iterations": memory_now()}
    totals = rollout_totals(lake)
    rss_after["count"] = memory_now()
    last = latest_version(lake)
    queries = query_runs(lake_uri, problem, last)
    startup = cli("sql", "--format", "json", "select 1 as one", lake_uri=lake_uri)
    lineage_walk = lineage_in_process(lake_uri, last)
    sizes = stored_bytes(lake, work)
    rss_after["bytes"] = memory_now()
    maintenance = cli("lake", "maintain", "--retention-hours", "0", lake_uri=lake_uri)
    queries_after = query_runs(lake_uri, problem, last)
    files_after = {name: len(lake.table(name).file_uris()) for name in ITERATION_TABLES}
    rss_after["end"] = memory_now()
    children = {
        "select_1": startup.peak_rss_mb,
        "lineage_walk": lineage_walk.peak_rss_mb,
        "maintenance": maintenance.peak_rss_mb,
    }
    return {
        **totals,
        "queries": queries,
        "queries_after": queries_after,
        "startup": startup.seconds,
        "lineage_walk": lineage_walk.seconds,
        "sizes": sizes,
        "maintenance": maintenance.seconds,
        "files_after": files_after,
        "rss_after": rss_after,
        "children": children,
    }


def run_benchmark(
    iterations: int = 2000,
    rollouts: int = 8192,
    max_tokens: int = 16384,
    problems: int = 0,
    s3_iterations: int = 20,
    seed: int = 0,
    maintain_every: int = 10,
    retention_hours: float = 0.0,
) -> dict:
    problems = problems or max(400, 4 * rollouts // GROUP_SIZE)
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-lake-scale-") as folder:
        work = Path(folder)
        lake_uri = str(work / "lake")
        lake, bank = seeded_lake(lake_uri, problems, seed)
        growth, write_seconds, maintenances = write_run(
            lake, bank, work, iterations, rollouts, max_tokens, seed, maintain_every, retention_hours
        )
        after = after_the_run(lake, lake_uri, bank["problem_id"][0], work)
        expected = iterations * min(max(1, rollouts // GROUP_SIZE), bank.height) * GROUP_SIZE
        if after["rollouts"] != expected:
            raise RuntimeError(f"{expected:,} rollouts were written but {after['rollouts']:,} are in the lake")
        s3 = s3_requests(s3_iterations, rollouts, max_tokens, problems, seed, work) if s3_iterations else None
        after["rss_after"]["s3"] = memory_now()
    scheduled = {
        "every": maintain_every,
        "retention_hours": retention_hours,
        "runs": len(maintenances),
        "first_seconds": maintenances[0] if maintenances else None,
        "last_seconds": maintenances[-1] if maintenances else None,
        "total_seconds": sum(maintenances),
    }
    figures = figures_of(iterations, bank.height, write_seconds, growth, scheduled, after, s3)
    report(figures)
    return figures


def figures_of(
    iterations: int,
    problems: int,
    write_seconds: float,
    growth: list[dict],
    scheduled: dict,
    after: dict,
    s3: dict | None,
) -> dict:
    stored = after["rollouts"]
    delta = sum(entry["delta_bytes"] + entry["log_bytes"] for entry in after["sizes"].values())
    plain = sum(entry["plain_bytes"] for entry in after["sizes"].values())
    queries, queries_after = after["queries"], after["queries_after"]
    seconds = {name: run.seconds for name, run in queries.items()}
    seconds_after = {name: run.seconds for name, run in queries_after.items()}
    peak = memory_now()["peak_rss_mb"]
    query_peaks = {name: max(run.peak_rss_mb, queries_after[name].peak_rss_mb) for name, run in queries.items()}
    return {
        "iterations": iterations,
        "rollouts_per_iteration": stored // iterations,
        "rollouts": stored,
        "tokens": after["tokens"],
        "mean_response_tokens": after["tokens"] / stored,
        "problems": problems,
        "write_seconds": write_seconds,
        "bookkeeping": growth,
        "bookkeeping_growth": growth[-1]["bookkeeping_seconds"] / growth[0]["bookkeeping_seconds"],
        "queries_seconds": seconds,
        "queries_seconds_after_maintenance": seconds_after,
        "max_query_seconds": max(v for k, v in seconds.items() if k != "lineage"),
        "max_query_seconds_after_maintenance": max(v for k, v in seconds_after.items() if k != "lineage"),
        "lineage_seconds": seconds["lineage"],
        "lineage_in_process_seconds": after["lineage_walk"],
        "trivial_query_seconds": after["startup"],
        "bytes": after["sizes"],
        "maintenance_seconds": after["maintenance"],
        "files_after_maintenance": after["files_after"],
        "scheduled_maintenance": scheduled,
        "bytes_per_rollout": delta / stored,
        "plain_bytes_per_rollout": plain / stored,
        "bytes_ratio": delta / plain,
        "s3": s3,
        "s3_requests_per_iteration": s3["requests_per_iteration"] if s3 else None,
        # memory, MiB: this process's peak over the whole run (the S3 part included) and, up to the end of the
        # local lake's steps, against its peak at the first checkpoint (`peak_rss_growth`: 1 is flat in the
        # lake's size); each command's peak as the kernel accounts for the child, a query's the larger of its runs
        "peak_rss_mb": peak,
        "peak_rss_growth": after["rss_after"]["end"]["peak_rss_mb"] / growth[0]["peak_rss_mb"],
        "rss_after": after["rss_after"],
        "query_peak_rss_mb": max(v for k, v in query_peaks.items() if k != "lineage"),
        "queries_peak_rss_mb": query_peaks,
        "child_peak_rss_mb": after["children"],
    }


def report(figures: dict) -> None:
    growth = ", ".join(f"iteration {g['iteration']}: {g['bookkeeping_seconds']:.2f} s" for g in figures["bookkeeping"])
    console.print(
        f"{figures['iterations']} iterations × {figures['rollouts_per_iteration']} rollouts "
        f"({figures['rollouts']:,} rollouts, {figures['tokens']:,} tokens, mean "
        f"{figures['mean_response_tokens']:.0f} a response) written in {figures['write_seconds']:.0f} s"
    )
    console.print(f"bookkeeping per iteration: {growth} (×{figures['bookkeeping_growth']:.2f})")
    scheduled = figures["scheduled_maintenance"]
    if scheduled["runs"]:
        console.print(
            f"maintenance every {scheduled['every']} iterations: {scheduled['runs']} runs, the first "
            f"{scheduled['first_seconds']:.2f} s, the last {scheduled['last_seconds']:.2f} s"
        )
    console.print(
        "rlvr sql: "
        + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in figures["queries_seconds"].items())
        + f"; after maintenance, the slowest {figures['max_query_seconds_after_maintenance']:.2f} s; "
        f"`select 1` {figures['trivial_query_seconds']:.2f} s; the lineage walk in-process "
        f"{figures['lineage_in_process_seconds']:.2f} s"
    )
    console.print(
        f"storage: {figures['bytes_per_rollout']:,.0f} bytes a rollout, plain zstd Parquet "
        f"{figures['plain_bytes_per_rollout']:,.0f} (×{figures['bytes_ratio']:.2f})"
    )
    memory = ", ".join(f"iteration {g['iteration']}: {g['peak_rss_mb']:,.0f}" for g in figures["bookkeeping"])
    console.print(
        f"peak resident set: {memory}, after every step {figures['rss_after']['end']['peak_rss_mb']:,.0f} MiB "
        f"(×{figures['peak_rss_growth']:.2f}), with S3 {figures['peak_rss_mb']:,.0f} MiB; `rlvr sql` at "
        f"most {figures['query_peak_rss_mb']:,.0f} MiB, `rlvr lake maintain` "
        f"{figures['child_peak_rss_mb']['maintenance']:,.0f} MiB"
    )
    if figures["s3"]:
        console.print(
            f"S3: {figures['s3_requests_per_iteration']:.0f} requests an iteration (first "
            f"{figures['s3']['first_iteration_requests']}), {json.dumps(figures['s3']['requests_by_method'])}, "
            f"moto's server at most {figures['s3']['server_peak_rss_mb'] or 0:,.0f} MiB"
        )
