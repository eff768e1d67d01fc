"""`rlvr bench sandbox --files`: file-level unittest suites in the sandbox against bare `python -m unittest`
on the same files in a temporary folder (no isolation), each shipped file-level problem's reference
solution, the same number of concurrent workers on both sides, in one run. Target: ≤ 1.5× the bare time.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from flows.display import console
from tasks.sandbox.client import Sandbox, isolation_mode
from tasks.workspaces.check import run_local
from tasks.workspaces.problem import load_problems
from tasks.workspaces.verifier import WORKSPACE_LIMITS

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = ("bench/sandbox_files.py", "tasks/sandbox/", "tasks/workspaces/", "tasks/workspaces/verifier.py")


def run_benchmark(workers: int = 2, repeats: int = 1, level: str = "file") -> dict:
    problems = load_problems(level) * repeats
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        bare_passed = sum(ok for ok, _ in pool.map(lambda p: run_local(p, p.reference), problems))
    bare_seconds = time.perf_counter() - start
    sandboxes = [Sandbox(worker=w, limits=WORKSPACE_LIMITS) for w in range(workers)]
    for sandbox in sandboxes:
        sandbox.start()  # warm servers are part of the design, started before timing

    def sandboxed(index_problem) -> bool:
        index, problem = index_problem
        return sandboxes[index % workers].run_suite({**problem.given, **problem.reference}, problem.tests).all_passed

    try:
        start = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            passed = sum(pool.map(sandboxed, enumerate(problems)))
        seconds = time.perf_counter() - start
    finally:
        for sandbox in sandboxes:
            sandbox.close()
    console.print(
        f"{len(problems)} {level}-level suites (reference solutions), {workers} concurrent workers, "
        f"isolation: {isolation_mode()}"
    )
    console.print(f"bare python -m unittest, no isolation: {bare_seconds:6.2f} s ({bare_passed} passed)")
    console.print(f"sandbox, tests and workspace apart:    {seconds:6.2f} s ({passed} passed)")
    console.print(f"time ×{seconds / bare_seconds:.2f} of bare unittest (target ≤ 1.5)")
    return {
        "suites": len(problems),
        "bare_seconds": bare_seconds,
        "seconds": seconds,
        "passed": passed,
        "bare_passed": bare_passed,
        "ratio": seconds / bare_seconds,
        "isolation": isolation_mode(),
    }
