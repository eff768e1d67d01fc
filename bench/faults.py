"""`rlvr bench faults`: kill -9 the main job and curation at named points, run writers side by side,
then check what the lake promises.

Each case runs the real command line in fresh processes on `configs/faults.yaml` (a tiny run:
warm-up, two iterations), each command with its own temporary Prefect server, on a local folder
and on S3 (moto's server on loopback):
- a kill at a fault point (`RLVR_FAULT`, `storage/faults.py`), then the same command again;
- two `rlvr run` (the second with `--wait`) or two `rlvr curate` of overlapping sources at once.
Afterwards: `rlvr doctor` reports a healthy lake, every iteration has exactly one trained version on
the main line, no `problem_id` repeats, no visible row comes from a run that did not complete, no
process the case started is left (the temporary Prefect servers included), and the metrics equal
those of an unkilled run of the same config. One row per case: fault → outcome.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from bench.moto import start_moto
from bench.results import ALL_CODE

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = ("bench/faults.py", "configs/faults.yaml", *ALL_CODE)

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "faults.yaml"
BIN = Path(sys.executable).parent
RUN_POINTS = [  # ≥ 10 points of `rlvr run`, from curation to the last record
    "lease-taken:loop",
    "committed:curate:problems",
    "checkpoint-saved:warmup",
    "committed:warmup:model_versions",
    "committed:rollout:rollouts",
    "committed:verify:rewards",
    "committed:advantages:batches",
    "checkpoint-saved:train",
    "committed:train:model_versions",
    "run-ending:train@2",
    "committed:evaluate:evaluations@2",
    "committed:record:iteration_metrics@2",
    "run-started:rollout@2",
]
CURATE_POINTS = ["run-started:curate", "lease-taken:bank", "committed:curate:quarantine", "committed:curate:problems"]
CURATE_SOURCES = ["--source", "gen:level3:3000", "--source", "gen:level2:2000"]
OVERLAPPING = ["--source", "gen:level3:4000", "--source", "gen:level2:1000"]
METRIC_COLUMNS = [
    "iteration",
    "model_version",
    "trained_version",
    "rounds",
    "groups",
    "groups_kept",
    "mean_reward",
    "loss",
    "eval_solve_rate",
]


@dataclass
class Outcome:
    case: str
    lake: str
    killed: str = ""  # how the first command ended
    checks: dict[str, bool] = field(default_factory=dict)
    seconds: float = 0.0
    note: str = ""

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(self.checks.values())


class Bench:
    """One benchmark session: a private PREFECT_HOME and cache, a tag that marks every process it starts."""

    def __init__(self, work: Path, s3_endpoint: str | None = None, prefect_api: str | None = None):
        self.work = work
        self.tag = uuid.uuid4().hex
        self.env = {
            **os.environ,
            "PREFECT_HOME": str(work / "prefect"),
            "RLVR_CACHE": str(work / "cache"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "RLVR_BENCH_TAG": self.tag,
            "COLUMNS": "200",
        }
        for name in ("PREFECT_API_URL", "RLVR_LAKE", "RLVR_FAULT"):
            self.env.pop(name, None)
        if prefect_api:  # the test suite's shared server: no temporary server per command
            self.env["PREFECT_API_URL"] = prefect_api
        self.s3_endpoint = s3_endpoint
        if s3_endpoint:
            self.env.update(
                {
                    "AWS_ENDPOINT_URL": s3_endpoint,
                    "AWS_ACCESS_KEY_ID": "bench",
                    "AWS_SECRET_ACCESS_KEY": "bench",
                    "AWS_REGION": "eu-west-1",
                    "AWS_ALLOW_HTTP": "true",
                }
            )

    def lake(self, kind: str, name: str) -> str:
        if kind == "local":
            return str(self.work / "lakes" / name)
        from storage.location import s3_filesystem

        bucket = "faults-" + uuid.uuid4().hex[:10]
        os.environ.update({k: v for k, v in self.env.items() if k.startswith("AWS_")})
        s3_filesystem().mkdir(bucket)
        return f"s3://{bucket}/{name}"

    def rlvr(self, *args: str, fault: str | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
        env = {**self.env, **({"RLVR_FAULT": fault} if fault else {})}
        return subprocess.run([str(BIN / "rlvr"), *args], env=env, capture_output=True, text=True, timeout=timeout)

    def start(self, *args: str, hold_at: str | None = None) -> subprocess.Popen:
        """Start a command; with `hold_at`, it waits at that fault point until `release` (see storage/faults.py)."""
        env, hold = dict(self.env), None
        if hold_at:
            hold = self.work / f"hold-{uuid.uuid4().hex}"
            env |= {"RLVR_FAULT": hold_at, "RLVR_FAULT_HOLD": str(hold)}
        process = subprocess.Popen(
            [str(BIN / "rlvr"), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        process.hold = hold
        return process

    def held(self, process: subprocess.Popen, timeout: float = 300.0) -> bool:
        """Whether `process` (started with `hold_at`) reached its point and is waiting there."""
        reached = Path(f"{process.hold}.reached")
        deadline = time.monotonic() + timeout
        while not reached.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def release(self, process: subprocess.Popen) -> None:
        process.hold.write_text("go")

    def leftovers(self, wait: float = 10.0) -> list[str]:
        """Processes this session started that are still alive (a parent-death signal takes a moment)."""
        deadline = time.monotonic() + wait
        while True:
            alive = tagged_processes(self.tag)
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.2)


def tagged_processes(tag: str) -> list[str]:
    """Command lines of live processes whose environment holds RLVR_BENCH_TAG=tag (Linux /proc)."""
    found = []
    marker = f"RLVR_BENCH_TAG={tag}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if marker not in handle.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                found.append(f"{pid}: " + handle.read().replace(b"\0", b" ").decode(errors="replace")[:120])
        except OSError:
            continue
    return found


# ---- what the lake must look like afterwards ----------------------------------------------------------------
def lake_checks(bench: Bench, lake_uri: str, iterations: int | None) -> dict[str, bool]:
    from storage.lake import Lake

    doctor = bench.rlvr("doctor", "--lake", lake_uri)
    lake = Lake.open(lake_uri)
    checks = {"doctor healthy": doctor.returncode == 0}
    problems = lake.read("problems", columns=["problem_id"])["problem_id"]
    checks["no repeated problem_id"] = problems.len() > 0 and problems.is_unique().all()
    runs = lake.read("runs", columns=["run_id", "status"])
    unfinished = set(runs.filter(pl.col("status") != "completed")["run_id"])
    from storage.catalog import open_catalog

    catalog = open_catalog(lake)
    tables = [
        name
        for (name,) in catalog.sql("show tables").fetchall()
        if name != "runs" and "run_id" in [c for (c, *_rest) in catalog.sql(f"describe {name}").fetchall()]
    ]
    seen = {run_id for name in tables for (run_id,) in catalog.sql(f"select distinct run_id from {name}").fetchall()}
    checks["no visible row of an unfinished run"] = not (seen & unfinished)
    if iterations is not None:
        trained = lake.read("model_versions").filter(pl.col("kind") == "rl")
        checks["one trained version per iteration"] = sorted(trained["iteration"].to_list()) == list(
            range(1, iterations + 1)
        )
    return checks


def metrics(lake_uri: str) -> pl.DataFrame:
    from storage.lake import Lake

    return Lake.open(lake_uri).read("iteration_metrics").select(METRIC_COLUMNS).sort("iteration")


# ---- the cases ----------------------------------------------------------------------------------------------
def baseline(bench: Bench, kind: str) -> pl.DataFrame:
    lake_uri = bench.lake(kind, "baseline")
    result = bench.rlvr("run", "--config", str(CONFIG), "--lake", lake_uri)
    if result.returncode != 0:
        raise RuntimeError(f"the unkilled baseline run failed: {result.stderr[-2000:]}")
    return metrics(lake_uri)


def killed_run(bench: Bench, kind: str, point: str, expected: pl.DataFrame) -> Outcome:
    started = time.monotonic()
    lake_uri = bench.lake(kind, "run-" + point.replace(":", "-").replace("@", "-"))
    outcome = Outcome(f"kill -9 rlvr run at {point}", kind)
    first = bench.rlvr("run", "--config", str(CONFIG), "--lake", lake_uri, fault=point)
    outcome.killed = "SIGKILL" if first.returncode == -signal.SIGKILL else f"exit {first.returncode}"
    outcome.checks["killed at the point"] = first.returncode == -signal.SIGKILL
    outcome.checks["nothing left running"] = not bench.leftovers()
    resumed = bench.rlvr("run", "--config", str(CONFIG), "--lake", lake_uri)
    outcome.checks["resumed"] = resumed.returncode == 0
    if resumed.returncode != 0:
        outcome.note = resumed.stderr.strip().splitlines()[-1][:200] if resumed.stderr.strip() else ""
    outcome.checks |= lake_checks(bench, lake_uri, len(expected) - 1)
    outcome.checks["metrics equal the unkilled run's"] = metrics(lake_uri).equals(expected)
    outcome.checks["nothing left running"] &= not bench.leftovers()
    outcome.seconds = time.monotonic() - started
    return outcome


def killed_curation(bench: Bench, kind: str, point: str, expected: set[str]) -> Outcome:
    started = time.monotonic()
    lake_uri = bench.lake(kind, "curate-" + point.replace(":", "-"))
    outcome = Outcome(f"kill -9 rlvr curate at {point}", kind)
    first = bench.rlvr("curate", *CURATE_SOURCES, "--lake", lake_uri, fault=point)
    outcome.killed = "SIGKILL" if first.returncode == -signal.SIGKILL else f"exit {first.returncode}"
    outcome.checks["killed at the point"] = first.returncode == -signal.SIGKILL
    outcome.checks["nothing left running"] = not bench.leftovers()
    again = bench.rlvr("curate", *CURATE_SOURCES, "--lake", lake_uri)
    outcome.checks["re-run kept every problem"] = again.returncode == 0 and _problem_ids(lake_uri) == expected
    outcome.checks |= lake_checks(bench, lake_uri, None)
    outcome.seconds = time.monotonic() - started
    return outcome


def concurrent_runs(bench: Bench, kind: str, expected: pl.DataFrame) -> Outcome:
    started = time.monotonic()
    lake_uri = bench.lake(kind, "two-runs")
    outcome = Outcome("two rlvr run at once (the second with --wait)", kind)
    first = bench.start("run", "--config", str(CONFIG), "--lake", lake_uri, hold_at="lease-taken:loop")
    outcome.checks["the first took the loop lease"] = bench.held(first)
    refused = bench.rlvr("run", "--config", str(CONFIG), "--lake", lake_uri)
    second = bench.start("run", "--config", str(CONFIG), "--lake", lake_uri, "--wait")
    bench.release(first)
    for process in (first, second):  # read their output as they go: a full pipe would stall them
        process.communicate(timeout=900)
    codes = [first.returncode, second.returncode]
    outcome.killed = f"exits {codes}, a third without --wait: {refused.returncode}"
    outcome.checks["a third writer refused at once, naming the holder"] = (
        refused.returncode == 1 and "lease is held by" in refused.stderr and f"pid {first.pid}" in refused.stderr
    )
    outcome.checks["both finished"] = codes == [0, 0]
    outcome.checks |= lake_checks(bench, lake_uri, len(expected) - 1)
    outcome.checks["metrics equal the unkilled run's"] = metrics(lake_uri).equals(expected)
    outcome.checks["nothing left running"] = not bench.leftovers()
    outcome.seconds = time.monotonic() - started
    return outcome


def concurrent_curations(bench: Bench, kind: str, count: int = 3) -> Outcome:
    started = time.monotonic()
    lake_uri = bench.lake(kind, "curations")
    outcome = Outcome(f"{count} rlvr curate of overlapping sources at once", kind)
    processes = [
        bench.start("curate", *(CURATE_SOURCES if i % 2 else OVERLAPPING), "--lake", lake_uri) for i in range(count)
    ]
    finished = [process.communicate(timeout=900) for process in processes]
    codes = [process.returncode for process in processes]
    outcome.killed = f"exits {codes}"
    failed = [err.strip().splitlines()[-1] for (_, err), code in zip(finished, codes) if code != 0 and err.strip()]
    outcome.note = "; ".join(failed)[:300]
    from storage.lake import Lake

    lake = Lake.open(lake_uri)
    versions = lake.read("runs").filter(pl.col("stage") == "curate")["bank_version"].to_list()
    outcome.checks["all finished, each its own bank version"] = codes == [0] * count and sorted(versions) == list(
        range(1, count + 1)
    )
    expected = _generated_ids(bench, kind, [CURATE_SOURCES, OVERLAPPING])
    outcome.checks["each problem exactly once"] = _problem_ids(lake_uri) == expected
    outcome.checks |= lake_checks(bench, lake_uri, None)
    outcome.checks["nothing left running"] = not bench.leftovers()
    outcome.seconds = time.monotonic() - started
    return outcome


def _problem_ids(lake_uri: str) -> set[str]:
    from storage.lake import Lake

    ids = Lake.open(lake_uri).read("problems", columns=["problem_id"])["problem_id"]
    return set(ids) if ids.is_unique().all() else set()


def _generated_ids(bench: Bench, kind: str, source_lists: list[list[str]]) -> set[str]:
    """The problems the sources make, curated one after another into a lake of their own."""
    lake_uri = bench.lake(kind, "reference-" + uuid.uuid4().hex[:6])
    for sources in source_lists:
        if bench.rlvr("curate", *sources, "--lake", lake_uri).returncode != 0:
            raise RuntimeError("the reference curation failed")
    return _problem_ids(lake_uri)


# ---- running it ---------------------------------------------------------------------------------------------
def run_cases(
    lakes: list[str], run_points: list[str], curate_points: list[str], concurrency: bool, report=print
) -> list[Outcome]:
    work = Path(tempfile.mkdtemp(prefix="rlvr-faults-"))
    moto, endpoint = start_moto() if "s3" in lakes else (None, None)
    bench = Bench(work, endpoint)
    outcomes: list[Outcome] = []
    try:
        for kind in lakes:
            expected = baseline(bench, kind) if run_points or concurrency else None
            expected_ids = _generated_ids(bench, kind, [CURATE_SOURCES]) if curate_points else set()
            cases = [lambda p=p, kind=kind, expected=expected: killed_run(bench, kind, p, expected) for p in run_points]
            cases += [
                lambda p=p, kind=kind, expected_ids=expected_ids: killed_curation(bench, kind, p, expected_ids)
                for p in curate_points
            ]
            if concurrency:
                cases += [
                    lambda kind=kind, expected=expected: concurrent_runs(bench, kind, expected),
                    lambda kind=kind: concurrent_curations(bench, kind),
                ]
            for case in cases:
                outcomes.append(case())
                report(outcomes[-1])
    finally:
        if moto is not None:
            moto.terminate()
            moto.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return outcomes


def run_benchmark(
    lakes: list[str],
    run_points: list[str] | None = None,
    curate_points: list[str] | None = None,
    concurrency: bool = True,
) -> list[Outcome]:
    from rich.console import Console
    from rich.table import Table

    console = Console(emoji=False)  # fault points such as committed:train:... are not emoji codes
    run_points = RUN_POINTS if run_points is None else run_points
    curate_points = CURATE_POINTS if curate_points is None else curate_points

    def report(outcome: Outcome) -> None:
        failed = [name for name, ok in outcome.checks.items() if not ok]
        console.print(
            f"{'ok  ' if outcome.passed else 'FAIL'} {outcome.lake:5} {outcome.case} "
            f"({outcome.seconds:.0f} s){': ' + ', '.join(failed) if failed else ''}"
            f"{' — ' + outcome.note if outcome.note else ''}",
            highlight=False,
        )

    outcomes = run_cases(lakes, run_points, curate_points, concurrency, report)
    table = Table(title="fault → outcome", title_justify="left")
    for column in ("lake", "fault", "first command", "checks passed", "outcome", "s"):
        table.add_column(column, overflow="fold")
    for outcome in outcomes:
        failed = [name for name, ok in outcome.checks.items() if not ok]
        table.add_row(
            outcome.lake,
            outcome.case,
            outcome.killed,
            f"{sum(outcome.checks.values())}/{len(outcome.checks)}",
            "ok" if outcome.passed else "FAILED: " + ", ".join(failed),
            f"{outcome.seconds:.0f}",
        )
    console.print(table)
    console.print(json.dumps({"cases": len(outcomes), "passed": sum(o.passed for o in outcomes)}))
    return outcomes
