"""Sandboxed code executions per second on HumanEval's canonical solutions, against running each in a
bare subprocess with no isolation (`python -c prompt + solution + tests + check(entry_point)`), with
the same number of concurrent workers, in one run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from flows.display import console
from tasks.sandbox.client import Sandbox, isolation_mode

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = ("bench/sandbox_rate.py", "tasks/sandbox/")

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def load_problems() -> list[dict]:
    path = SHARED / "humaneval" / "test.jsonl"
    if path.exists():
        return [json.loads(line) for line in path.open()]
    return [
        {
            "prompt": f"def f{i}(x):\n",
            "canonical_solution": f"    return x + {i}\n",
            "entry_point": f"f{i}",
            "test": f"def check(candidate):\n    assert candidate(1) == {1 + i}\n",
        }
        for i in range(100)
    ]


def bare(problems: list[dict], workers: int) -> tuple[float, int]:
    def run(problem: dict) -> bool:
        program = (
            problem["prompt"]
            + problem["canonical_solution"]
            + "\n"
            + problem["test"]
            + f"\ncheck({problem['entry_point']})\n"
        )
        return subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=60).returncode == 0

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        passed = sum(pool.map(run, problems))
    return len(problems) / (time.perf_counter() - start), passed


def sandboxed(problems: list[dict], workers: int) -> tuple[float, int]:
    sandboxes = [Sandbox(worker=w) for w in range(workers)]
    for sandbox in sandboxes:
        sandbox.start()  # warm servers are part of the design, started before timing

    def run(index_problem: tuple[int, dict]) -> bool:
        index, problem = index_problem
        return (
            sandboxes[index % workers]
            .run_tests(
                problem["prompt"] + problem["canonical_solution"],
                problem["test"],
                problem["entry_point"],
                problem["prompt"],
            )
            .all_passed
        )

    try:
        start = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            passed = sum(pool.map(run, enumerate(problems)))
        return len(problems) / (time.perf_counter() - start), passed
    finally:
        for sandbox in sandboxes:
            sandbox.close()


def run_benchmark(workers: int = 2, repeats: int = 1) -> dict:
    problems = load_problems() * repeats
    baseline_rate, baseline_passed = bare(problems, workers)
    rate, passed = sandboxed(problems, workers)
    console.print(
        f"{len(problems)} HumanEval canonical solutions, {workers} concurrent workers, isolation: {isolation_mode()}"
    )
    console.print(f"bare subprocess, no isolation: {baseline_rate:7.1f} runs/s ({baseline_passed} passed)")
    console.print(f"sandbox, every isolation:      {rate:7.1f} runs/s ({passed} passed)")
    console.print(f"rate ×{rate / baseline_rate:.2f} of the bare subprocess (target ≥ 0.5)")
    return {
        "runs": len(problems),
        "baseline_rate": baseline_rate,
        "rate": rate,
        "passed": passed,
        "baseline_passed": baseline_passed,
        "ratio": rate / baseline_rate,
        "isolation": isolation_mode(),
    }
