"""`rlvr bench orchestration`: what Prefect and the command line cost around the work itself.

Three measurements, each in fresh processes on this machine:
- read-only commands (`sql`, `bank stats`, `lineage`, `doctor`, `policy list`) on a small lake: wall
  time per command (median of a few), next to a bare `python -c pass` and a process that only imports
  the libraries they read with; none of them starts a Prefect server (checked: no process of theirs
  outlives them, and the lake's Prefect home gets no temporary-server log);
- Prefect itself: the temporary server's start-up, then the cost of one stage-shaped subflow (a
  subflow with three tasks that do nothing) and of one task, medians over many, against the same
  functions called without Prefect;
- the loop: `rlvr run` of `configs/faults.yaml` into a fresh lake, its wall time against the summed
  durations of the stage runs it recorded in `runs` (the rest is start-up, orchestration and
  bookkeeping between stages).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

from bench.results import ALL_CODE

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = ("bench/orchestration.py", "configs/faults.yaml", *ALL_CODE)

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "faults.yaml"
BIN = Path(sys.executable).parent
READ_ONLY = [
    ("sql", ["sql", "select count(*) from problems"]),
    ("sql over a view", ["sql", "select * from solve_rate_by_level"]),
    ("bank stats", ["bank", "stats"]),
    ("lineage problem", ["lineage", "problem", "{problem_id}"]),
    ("doctor", ["doctor"]),
    ("policy list", ["policy", "list"]),
]
IMPORTS_ONLY = "import polars, pyarrow, duckdb, deltalake, typer, rich"

PREFECT_PROBE = r"""
import json, statistics, sys, time
started = time.perf_counter()
from flows.orchestration import ensure_api
ensure_api()
server_seconds = time.perf_counter() - started
from prefect import flow, task

@task
def nothing(x):
    return x

def stage_body(i):
    return [nothing(i), nothing(i + 1), nothing(i + 2)]

@flow
def stage(i):
    return stage_body(i)

@flow
def parent(n, timings):
    for i in range(n):
        began = time.perf_counter()
        stage(i)
        timings.append(time.perf_counter() - began)

@flow
def tasks_only(n, timings):
    for i in range(n):
        began = time.perf_counter()
        nothing(i)
        timings.append(time.perf_counter() - began)

def plain(fn, n):
    began = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - began) / n

n = int(sys.argv[1])
first = time.perf_counter(); parent(1, []); first_flow = time.perf_counter() - first
subflows, task_runs = [], []
parent(n, subflows)
tasks_only(n * 3, task_runs)
print(json.dumps({"server_start_s": server_seconds, "first_flow_s": first_flow,
                  "subflow_s": statistics.median(subflows), "task_s": statistics.median(task_runs),
                  "plain_stage_s": plain(lambda i: [nothing.fn(i), nothing.fn(i + 1), nothing.fn(i + 2)], n)}))
"""


def _env(work: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "PREFECT_HOME": str(work / "prefect"),
        "RLVR_CACHE": str(work / "cache"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "COLUMNS": "200",
    }
    for name in ("PREFECT_API_URL", "RLVR_LAKE", "RLVR_FAULT"):
        env.pop(name, None)
    return env


def _timed(command: list[str], env: dict[str, str], repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        seconds.append(time.perf_counter() - began)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()[-500:]}")
    return statistics.median(seconds)


def loop_overhead(work: Path, env: dict[str, str]) -> dict[str, float]:
    from storage.lake import Lake

    lake_uri = str(work / "lake")
    began = time.perf_counter()
    result = subprocess.run(
        [str(BIN / "rlvr"), "run", "--config", str(CONFIG), "--lake", lake_uri], env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - began
    if result.returncode != 0:
        raise RuntimeError(f"rlvr run failed: {result.stderr.strip()[-1000:]}")
    runs = Lake.open(lake_uri).read("runs").filter(pl.col("status") == "completed")
    stages = runs.with_columns(seconds=(pl.col("ended_at") - pl.col("started_at")).dt.total_microseconds() / 1e6)
    by_stage = stages.group_by("stage").agg(pl.col("seconds").sum(), pl.len().alias("runs")).sort("stage")
    inside = float(by_stage["seconds"].sum())
    return {
        "wall_s": wall,
        "inside_stage_runs_s": inside,
        "outside_share": 1 - inside / wall,
        "stage_runs": int(by_stage["runs"].sum()),
        "lake": lake_uri,
    }


def run_benchmark(repeats: int = 3, subflows: int = 20) -> dict:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    work = Path(tempfile.mkdtemp(prefix="rlvr-bench-orchestration-"))
    env = _env(work)
    rlvr = str(BIN / "rlvr")

    console.print("the loop: rlvr run --config configs/faults.yaml into a fresh lake ...")
    loop = loop_overhead(work, env)
    lake = ["--lake", loop["lake"]]
    from storage.lake import Lake

    problem_id = Lake.open(loop["lake"]).read("problems", columns=["problem_id"])["problem_id"][0]
    log = Path(env["PREFECT_HOME"]) / "rlvr-temporary-server.log"
    log_size = log.stat().st_size if log.exists() else 0

    baseline = _timed([sys.executable, "-c", "pass"], env, repeats)
    imports = _timed([sys.executable, "-c", IMPORTS_ONLY], env, repeats)
    table = Table(title="read-only commands (median wall time, fresh process each)", title_justify="left")
    for column in ("command", "seconds", "× bare python", "− library imports (s)"):
        table.add_column(column)
    table.add_row("python -c pass", f"{baseline:.2f}", "1.0", "")
    table.add_row(f"python -c '{IMPORTS_ONLY}'", f"{imports:.2f}", f"{imports / baseline:.1f}", "0.00")
    read_only = {}
    for name, arguments in READ_ONLY:
        command = [rlvr, *[a.format(problem_id=problem_id) for a in arguments], *lake]
        read_only[name] = _timed(command, env, repeats)
        table.add_row(
            f"rlvr {name}",
            f"{read_only[name]:.2f}",
            f"{read_only[name] / baseline:.1f}",
            f"{read_only[name] - imports:+.2f}",
        )
    console.print(table)
    no_server = (log.stat().st_size if log.exists() else 0) == log_size
    console.print(f"temporary Prefect servers started by the read-only commands: {'none' if no_server else 'SOME'}")

    probe = subprocess.run(
        [sys.executable, "-c", PREFECT_PROBE, str(subflows)],
        env=env,
        capture_output=True,
        text=True,
        cwd=str(Path(__file__).resolve().parents[1]),
    )
    if probe.returncode != 0:
        raise RuntimeError(f"the Prefect probe failed: {probe.stderr.strip()[-1000:]}")
    prefect = json.loads(probe.stdout.strip().splitlines()[-1])
    table = Table(title=f"Prefect (temporary server; medians over {subflows} subflows)", title_justify="left")
    table.add_column("what")
    table.add_column("seconds")
    table.add_row("temporary server start-up (until it answers)", f"{prefect['server_start_s']:.2f}")
    table.add_row("first flow of a process", f"{prefect['first_flow_s']:.2f}")
    table.add_row("one stage-shaped subflow (3 no-op tasks)", f"{prefect['subflow_s']:.3f}")
    table.add_row("one no-op task run", f"{prefect['task_s']:.4f}")
    table.add_row("the same stage body without Prefect", f"{prefect['plain_stage_s']:.6f}")
    console.print(table)
    console.print(
        f"the loop (warm-up + 2 iterations): {loop['wall_s']:.1f} s wall, {loop['inside_stage_runs_s']:.1f} s "
        f"inside its {loop['stage_runs']} stage runs; {loop['outside_share']:.0%} outside them (process "
        "start-up, the temporary server, flow and task runs, bookkeeping)"
    )
    summary = {
        "read_only_s": read_only,
        "python_s": baseline,
        "imports_s": imports,
        "no_server": no_server,
        "prefect": prefect,
        "loop": {k: v for k, v in loop.items() if k != "lake"},
    }
    console.print(json.dumps(summary))
    return summary
