"""`rlvr bench startup`: how long the command line takes to start, against an earlier commit's.

`rlvr --help` and `rlvr sql "select 1 as one"` (over an empty lake: the catalog opens, the query runs) in fresh
processes, alternating between this checkout and a git worktree of `--against` made for the run (both imported
through PYTHONPATH by the same interpreter and packages), the median of `repeats` runs each. One more run of
each command in this checkout records which heavy modules it imported (torch, transformers, TRL, Prefect, a
benchmark): the command tree imports them only for the commands that use them.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.worktrees import rlvr_seconds, worktree
from flows.display import console

# The files its figures measure: a change to one makes a saved result stale (bench/results.py). Here what
# `rlvr --help` and `rlvr sql` import: the command tree, the bench group (its entry point), the lake.
DEPENDS_ON = (
    "bench/startup.py",
    "bench/worktrees.py",
    "bench/__init__.py",
    "bench/cli.py",
    "bench/command.py",
    "bench/component_commands.py",
    "bench/loop_commands.py",
    "flows/__init__.py",
    "flows/cli/",
    "flows/display.py",
    "storage/",
    "tasks/__init__.py",
    "tasks/errors.py",
)

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"help": ["--help"], "sql": ["sql", "select 1 as one"]}
HEAVY = ("torch", "transformers", "trl", "prefect", "bench.peer")
IMPORTED = (
    "import sys\nfrom flows.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
    f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
)


def heavy_imports(arguments: list[str], lake: str) -> list[str]:
    """The heavy modules one run of the command imported, in this checkout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RLVR_LAKE": lake}
    result = subprocess.run(
        [sys.executable, "-c", IMPORTED, *arguments], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    return result.stderr.strip().splitlines()[-1].split() if result.stderr.strip() else []


def run_benchmark(against: str, repeats: int) -> dict:
    """Median start-up seconds of each command here and at `against`, their ratios, and the heavy imports."""
    work = Path(tempfile.mkdtemp(prefix="rlvr-bench-startup-"))
    lake = str(work / "lake")
    times: dict[str, dict[str, list[float]]] = {name: {"here": [], "baseline": []} for name in COMMANDS}
    try:
        with worktree(against) as (baseline, baseline_commit):
            for name, arguments in COMMANDS.items():
                rlvr_seconds(arguments, ROOT, lake)  # warm the file cache and bytecode on both sides
                rlvr_seconds(arguments, baseline, lake)
                for _ in range(repeats):
                    times[name]["here"].append(rlvr_seconds(arguments, ROOT, lake))
                    times[name]["baseline"].append(rlvr_seconds(arguments, baseline, lake))
        heavy = {name: heavy_imports(arguments, lake) for name, arguments in COMMANDS.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures: dict = {"against": baseline_commit, "repeats": repeats}
    for name in COMMANDS:
        here, before = statistics.median(times[name]["here"]), statistics.median(times[name]["baseline"])
        figures[name] = {
            "seconds": round(here, 3),
            "baseline_seconds": round(before, 3),
            "ratio": round(here / before, 3),
            "heavy_imports": heavy[name],
        }
        console.print(
            f"rlvr {' '.join(COMMANDS[name])}: {here:.2f} s here, {before:.2f} s at {baseline_commit[:7]} "
            f"(×{here / before:.2f}); heavy modules imported: {', '.join(heavy[name]) or 'none'}"
        )
    return figures
