"""`rlvr bench sandbox --hostile`: code verification under hostile load, through the real scoring path.

Rows (default 10,000) mix HumanEval's canonical solutions (honest) with the hostile programs of
`bench/hostile_programs.py` (forgeries, escapes, infinite loops, fork and memory bombs, floods), and
are scored by a `VerifierPool` of 2 worker processes, each with its own sandbox server, as
`rlvr verify` scores rollouts. Reported: the honest pass rate against what a bare `python -c` passes
(must be 100 %), the hostile rows' rewards (must all be 0), the peak memory of every process of the
run (workers and sandboxes, proportional set size) and the host's available memory, descriptors and
processes before and after, and the honest rows' throughput against an honest-only run of the same
pool on the same machine.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from bench.hostile_programs import HOSTILE, prepare
from bench.sandbox_rate import load_problems
from flows.display import console
from tasks.sandbox.client import isolation_mode
from tasks.sandbox.limits import SandboxLimits
from tasks.verification.engine import VerifierPool

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = (
    "bench/sandbox_hostile.py",
    "bench/hostile_programs.py",
    "bench/sandbox_rate.py",
    "tasks/sandbox/",
    "tasks/verifiers/",
)

LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=4, test_seconds=1.5, memory_mb=512, output_bytes=200_000)


def bare_passes(problems: list[dict], workers: int) -> set[str]:
    """Entry points whose canonical solution passes its tests in a bare subprocess (no isolation at all)."""

    def run(problem: dict) -> bool:
        program = (
            problem["prompt"]
            + problem["canonical_solution"]
            + "\n"
            + problem["test"]
            + f"\ncheck({problem['entry_point']})\n"
        )
        return subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=60).returncode == 0

    with ThreadPoolExecutor(workers) as pool:
        return {
            p["task_id"] if "task_id" in p else p["entry_point"]
            for p, ok in zip(problems, pool.map(run, problems))
            if ok
        }


def _context() -> dict:
    return {
        "secret": "s3cr3t-" + uuid.uuid4().hex,
        "hidden": "hidden-" + uuid.uuid4().hex[:12],
        "marker": "rlvr-bench-" + uuid.uuid4().hex[:8],
        "port": 9,
        "abstract": "rlvr-bench-none",
        "socket_path": "/nonexistent.sock",
        "secret_path": "/nonexistent",
        "readme_line": "# RLVR",
        "limits": LIMITS.to_dict(),
    }


def build_rows(problems: list[dict], count: int, hostile_share: float, seed: int = 0) -> list[tuple[dict, str, str]]:
    """(problem, response, kind) rows: kind is honest, or the hostile program's name."""
    rng = random.Random(seed)
    context, rows = _context(), []
    names = list(HOSTILE)
    for index in range(count):
        if rng.random() < hostile_share:
            name = names[index % len(names)]
            program, tests = prepare(name, context)
            rows.append(({"domain": "code", "prompt": "", "tests": tests, "entry_point": "solve"}, program, name))
        else:
            problem = problems[index % len(problems)]
            rows.append(
                (
                    {
                        "domain": "code",
                        "prompt": problem["prompt"],
                        "tests": problem["test"],
                        "entry_point": problem["entry_point"],
                        "id": problem.get("task_id", problem["entry_point"]),
                    },
                    problem["canonical_solution"],
                    "honest",
                )
            )
    return rows


class Sampler:
    """Samples, every 50 ms, the summed proportional memory of this process's descendants and the host's
    available memory; counts their processes and open descriptors on demand."""

    def __init__(self) -> None:
        self.peak_pss, self.lowest_available = 0, _available()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_pss = max(self.peak_pss, sum(_pss(pid) for pid in descendants(os.getpid())))
            self.lowest_available = min(self.lowest_available, _available())
            time.sleep(0.05)


def descendants(root: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents.setdefault(int(fields[1]), []).append(int(entry))
    found, frontier = [], list(parents.get(root, []))
    while frontier:
        pid = frontier.pop()
        found.append(pid)
        frontier.extend(parents.get(pid, []))
    return found


def footprint() -> dict:
    pids = descendants(os.getpid())
    fds = 0
    for pid in pids:
        try:
            fds += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
    return {"processes": len(pids), "open_fds": fds, "own_fds": len(os.listdir("/proc/self/fd"))}


def _pss(pid: int) -> int:
    try:
        for line in open(f"/proc/{pid}/smaps_rollup"):
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _available() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def score(rows: list[tuple[dict, str, str]], workers: int) -> tuple[list, float, dict, dict, Sampler]:
    pool = VerifierPool(workers=workers, item_timeout=60, options={"code": {"limits": LIMITS.to_dict()}})
    pool.start()
    honest = next(row for row in rows if row[2] == "honest")  # every worker's sandbox started, warm
    warm = list(pool.score([(honest[0], honest[1], None)] * (workers * pool.chunk_size)))
    assert warm
    before = footprint()
    started = time.perf_counter()
    with Sampler() as sampler:
        results = sorted(
            pool.score([(problem, response, None) for problem, response, _ in rows]), key=lambda s: s.index
        )
    seconds = time.perf_counter() - started
    after = footprint()
    pool.close()
    return results, seconds, before, after, sampler


def run_benchmark(count: int = 10_000, hostile_share: float = 0.1, workers: int = 2) -> dict:
    problems = load_problems()
    passing = bare_passes(problems, workers)
    rows = build_rows(problems, count, hostile_share)
    honest = [row for row in rows if row[2] == "honest"]
    console.print(
        f"{len(rows):,} rows ({len(honest):,} honest HumanEval solutions, {len(rows) - len(honest):,} hostile "
        f"programs of {len(HOSTILE)} kinds), {workers} verification workers, isolation: {isolation_mode()}"
    )
    available_before = _available()
    results, seconds, before, after, sampler = score(rows, workers)
    honest_results = [(row, result) for row, result in zip(rows, results) if row[2] == "honest"]
    expected = [r for row, r in honest_results if row[0]["id"] in passing]
    honest_passed = sum(1 for r in expected if r.reward == 1.0)
    hostile = [(row[2], r) for row, r in zip(rows, results) if row[2] != "honest"]
    hostile_scored = sorted({name for name, r in hostile if r.reward != 0.0})
    crashed = sum(1 for _, r in zip(rows, results) if r.details.get("status") == "crashed")
    baseline_results, baseline_seconds, *_ = score(honest, workers)
    baseline_passed = sum(1 for row, r in zip(honest, baseline_results) if row[0]["id"] in passing and r.reward == 1.0)
    mixed_rate, honest_rate = len(honest) / seconds, len(honest) / baseline_seconds
    summary = {
        "rows": len(rows),
        "honest": len(honest),
        "hostile": len(hostile),
        "bare_python_passes": len(passing),
        "of_problems": len(problems),
        "honest_pass_rate_vs_bare": honest_passed / max(1, len(expected)),
        "honest_only_pass_rate_vs_bare": baseline_passed / max(1, len(expected)),
        "hostile_rows_rewarded": len([1 for _, r in hostile if r.reward != 0.0]),
        "hostile_kinds_rewarded": hostile_scored,
        "crashed": crashed,
        "seconds": seconds,
        "honest_only_seconds": baseline_seconds,
        "peak_memory_mb": sampler.peak_pss / 2**20,
        "host_available_drop_mb": (available_before - sampler.lowest_available) / 2**20,
        "before": before,
        "after": after,
        "honest_rows_per_s": mixed_rate,
        "honest_only_rows_per_s": honest_rate,
    }
    console.print(
        f"honest: {honest_passed:,} of {len(expected):,} that bare Python passes "
        f"({summary['honest_pass_rate_vs_bare']:.1%}; target 100 %); honest-only run: {baseline_passed:,}"
    )
    console.print(
        f"hostile: {summary['hostile_rows_rewarded']} of {len(hostile):,} rows rewarded (target 0)"
        f"{': ' + ', '.join(hostile_scored) if hostile_scored else ''}; sandbox crashes: {crashed}"
    )
    console.print(
        f"memory: peak {summary['peak_memory_mb']:,.0f} MB over every worker and sandbox process (PSS); host "
        f"available memory fell by at most {summary['host_available_drop_mb']:,.0f} MB"
    )
    console.print(
        f"processes {before['processes']} → {after['processes']}, their descriptors {before['open_fds']} → "
        f"{after['open_fds']}, this process's {before['own_fds']} → {after['own_fds']}"
    )
    console.print(
        f"throughput: {len(rows) / seconds:.1f} rows/s mixed ({seconds:.0f} s); honest rows {mixed_rate:.1f}/s "
        f"among hostile ones against {honest_rate:.1f}/s alone (×{mixed_rate / honest_rate:.2f})"
    )
    console.print(json.dumps(summary))
    return summary
