"""`rlvr bench mismatch-analysis`: `rlvr analyze mismatch` over a lake of a million trained rollouts, as a user
runs it (a fresh `rlvr` process, the table read from the lake, every correction replayed); target ≤ 10 s.

The lake's `mismatch` table is synthetic, written as the training stage writes it (one slice per iteration):
response lengths long-tailed (log-normal, median `median_tokens`, capped at `max_tokens`, as
bench/lake_synthetic.py draws them), and per-token log-ratios mostly a bf16 engine's rounding (0.01 nat) with
one token in twenty off by 0.5 nat, so every mode has something to mask. The baseline in the same run is
`rlvr sql` counting the same table's tokens (reading the column, nothing replayed): the replay's cost over a scan.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import polars as pl
import pyarrow as pa

from storage.lake import Lake
from storage.outputs import Outputs

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = (
    "bench/mismatch_analysis.py",
    "trainers/mismatch.py",
    "trainers/correction.py",
    "policy/logprobs.py",
    "flows/cli/runs.py",
)

TARGET_SECONDS = 10.0


def synthetic_mismatch(
    rows: int, iteration: int, median_tokens: int, max_tokens: int, rng: np.random.Generator
) -> pl.DataFrame:
    """One iteration's `mismatch` rows, columns as the training stage computes them from the log-ratios."""
    lengths = np.minimum(np.ceil(rng.lognormal(np.log(median_tokens), 1.0, rows)), max_tokens).astype(np.int64)
    tokens = int(lengths.sum())
    delta = rng.normal(0.0, 0.01, tokens)
    tail = rng.random(tokens) < 0.05
    delta[tail] = rng.normal(0.0, 0.5, int(tail.sum()))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    per_row = lambda values: np.add.reduceat(values, offsets[:-1])  # noqa: E731  (every row has a token)
    maxima = np.maximum.reduceat(np.abs(delta), offsets[:-1])
    log_ratio = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(delta))
    return pl.DataFrame(
        {
            "rollout_id": [f"i{iteration}-{i:07d}" for i in range(rows)],
            "iteration": np.full(rows, iteration),
            "model_version": np.full(rows, iteration - 1),
            "trained_version": np.full(rows, iteration),
            "log_ratio": pl.from_arrow(log_ratio),
            "n_tokens": lengths,
            "after_updates": np.zeros(rows, np.int64),
            "mean_abs_delta": per_row(np.abs(delta)) / lengths,
            "max_abs_delta": maxima,
            "sequence_log_ratio": per_row(delta),
            "kl_k3": per_row(np.expm1(delta) - delta) / lengths,
            "outside_share": per_row((delta > np.log(3.0)).astype(np.float64)) / lengths,
            "correction": ["none"] * rows,
        }
    )


def write_lake(uri: str, rollouts: int, iterations: int, median_tokens: int, max_tokens: int) -> int:
    """The synthetic table, one training run's commit per iteration; returns the tokens written."""
    lake = Lake.open(uri)
    rng = np.random.default_rng(0)
    tokens = 0
    for iteration in range(1, iterations + 1):
        rows = synthetic_mismatch(rollouts // iterations, iteration, median_tokens, max_tokens, rng)
        tokens += int(rows["n_tokens"].sum())
        with lake.run("train-policy", "train", {"synthetic": True}, iteration=iteration) as run:
            key = {"iteration": iteration, "model_version": iteration - 1}
            lake.commit(Outputs().replace("mismatch", rows, key), run)
    return tokens


def timed_command(*arguments: str) -> tuple[float, str]:
    """Seconds of one `rlvr` process, start to exit, and its stdout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", "from flows.cli import main; main()", *arguments],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    seconds = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"rlvr {' '.join(arguments)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds, done.stdout


def run_benchmark(rollouts: int = 1_000_000, iterations: int = 10, median_tokens: int = 48, max_tokens: int = 1024):
    from rich.console import Console

    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-mismatch-") as folder:
        uri = os.path.join(folder, "lake")
        started = time.perf_counter()
        tokens = write_lake(uri, rollouts, iterations, median_tokens, max_tokens)
        console.print(f"{rollouts:,} rollouts, {tokens:,} tokens written in {time.perf_counter() - started:.1f} s")
        scan, _ = timed_command("sql", "select count(*), sum(len(log_ratio)) from mismatch", "--lake", uri)
        analyze, report = timed_command("analyze", "mismatch", "--lake", uri, "--format", "json")
    result = {
        "rollouts": rollouts,
        "tokens": tokens,
        "analyze_seconds": analyze,
        "scan_seconds": scan,
        "ratio_to_scan": analyze / scan,
        "target_seconds": TARGET_SECONDS,
        "within_target": analyze <= TARGET_SECONDS,
        "modes": report_modes(report),
    }
    console.print(
        f"rlvr analyze mismatch over {rollouts:,} rollouts ({tokens:,} tokens): {analyze:.1f} s "
        f"(target ≤ {TARGET_SECONDS:.0f} s); rlvr sql scanning the same column: {scan:.1f} s (×{analyze / scan:.2f})"
    )
    return result


def report_modes(report: str) -> dict:
    """Each mode's masked token share from the command's JSON, so the saved result shows what was replayed."""
    import json

    rows = [json.loads(line) for line in report.splitlines() if line.strip()]  # one JSON object a row
    return {row["mode"]: round(row["tokens_masked_share"], 5) for row in rows if row.get("table") == "modes"}
