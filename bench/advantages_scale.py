"""Advantages plus dynamic-sampling filtering on millions of synthetic rollouts, three ways, in one run:

- ours: `tasks.advantages` (GRPO advantages as window expressions, group statistics, the filter);
- a straightforward per-group Python implementation, like the seed's `grpo_data_pipeline`;
- a bare Polars group-by of mean and std on the same data (the floor).

Each runs in its own process, so that its peak memory (max RSS, data included) is its own.
"""

from __future__ import annotations

import multiprocessing
import resource
import time
from collections import defaultdict

import numpy as np
import polars as pl

from flows.display import console

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = ("bench/advantages_scale.py", "tasks/advantages/")


def synthetic_rollouts(groups: int, group_size: int, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    solve_rate = rng.beta(0.6, 0.6, size=groups)  # many groups near 0 % and 100 %
    correct = rng.random((groups, group_size)) < solve_rate[:, None]
    return pl.DataFrame(
        {
            "group_id": np.repeat(np.arange(groups, dtype=np.int64), group_size),
            "problem_id": np.repeat(np.arange(groups, dtype=np.int64), group_size),
            "model_version": np.zeros(groups * group_size, dtype=np.int64),
            "reward": correct.ravel().astype(np.float64),
            "correct": correct.ravel(),
        }
    )


def ours(frame: pl.DataFrame) -> int:
    from tasks.advantages.estimators import advantages
    from tasks.sampling.groups import keep_informative_groups, with_group_columns

    return advantages(keep_informative_groups(with_group_columns(frame)), "grpo").height


def per_group_python(frame: pl.DataFrame) -> int:
    """Rollouts as records, grouped in a dict, statistics per group with NumPy, records out."""
    groups: dict[int, list[dict]] = defaultdict(list)
    for rollout in frame.iter_rows(named=True):
        groups[rollout["group_id"]].append(rollout)
    batch = []
    for rollouts in groups.values():
        rewards = np.array([rollout["reward"] for rollout in rollouts])
        solve_rate = float(np.mean([rollout["correct"] for rollout in rollouts]))
        if solve_rate in (0.0, 1.0):  # all wrong or all right: no signal
            continue
        mean, std = rewards.mean(), rewards.std(ddof=1)
        batch.extend({**rollout, "advantage": (rollout["reward"] - mean) / (std + 1e-4)} for rollout in rollouts)
    return len(batch)


def bare_group_by(frame: pl.DataFrame) -> int:
    return frame.group_by("group_id").agg(mean=pl.col("reward").mean(), std=pl.col("reward").std()).height


def _measure(name: str, groups: int, group_size: int, queue) -> None:
    frame = synthetic_rollouts(groups, group_size)
    function = {"ours": ours, "per_group_python": per_group_python, "bare_group_by": bare_group_by}[name]
    start = time.perf_counter()
    rows = function(frame)
    seconds = time.perf_counter() - start
    queue.put((seconds, rows, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def measure(name: str, groups: int, group_size: int) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_measure, args=(name, groups, group_size, queue))
    process.start()
    while True:
        try:
            seconds, rows, peak_mb = queue.get(timeout=5)
            break
        except Exception:  # queue.Empty: is the measuring process still alive?
            if not process.is_alive():
                raise RuntimeError(f"measuring {name} failed (exit code {process.exitcode})") from None
    process.join()
    return {"name": name, "seconds": seconds, "rows": rows, "peak_mb": peak_mb}


def run_benchmark(groups: int = 625_000, group_size: int = 16) -> dict:
    results = {name: measure(name, groups, group_size) for name in ("ours", "per_group_python", "bare_group_by")}
    console.print(f"{groups * group_size:,} rollouts in {groups:,} groups of {group_size}")
    for result in results.values():
        console.print(
            f"{result['name']:>18}: {result['seconds']:7.2f} s, {result['rows']:,} rows out, "
            f"peak RSS {result['peak_mb']:,.0f} MB"
        )
    faster = results["per_group_python"]["seconds"] / results["ours"]["seconds"]
    slower = results["ours"]["seconds"] / results["bare_group_by"]["seconds"]
    console.print(
        f"ours is ×{faster:.1f} faster than per-group Python (target ≥ 50) and ×{slower:.2f} the time of a "
        f"bare group-by (target ≤ 2)"
    )
    return {**results, "rollouts": groups * group_size, "faster_than_python": faster, "time_vs_group_by": slower}
