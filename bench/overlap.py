"""`rlvr bench async`: the same iterations one after another and overlapped, the policy served apart.

One warmed lake is made first (`bench.warm.warmed_lake`: the config's bank, warm-up and held-out
evaluation), or reused from `--work`. Then each mode runs in its own copy of it, against its own
`rlvr policy serve --no-on-demand` process (the warm version preloaded, later versions published
by the loop as vLLM would get them) on the `openai` backend, one torch thread in the server and one
in each of the loop's workers: `loop.mode: sync`, then `async` (`loop.max_staleness`), for the
same iterations, evaluated once at the end. Printed: the wall time of each (evaluation excluded),
the ratio async / sync (target ≤ 0.7), the final held-out solve rate of each (async not worse by
more than 3 points) and async's staleness histogram (rollouts by staleness, from `advantages`).
`--correction` picks how async corrects for its off-policy rollouts: `truncated` (the sequence weight
of `advantages.off_policy_weight`, one forward pass), `none` (the clipped ratio to the behaviour
log-probs only) or `decoupled` (`train.off_policy_loss: decoupled`, per-token weights from the
training step's own forward pass).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import polars as pl
import pyarrow.compute as pc

from bench.results import LOOP_CODE
from bench.warm import copy_of, started_once, warmed_once
from storage.lake import Lake

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = ("bench/overlap.py", "bench/warm.py", "configs/demo-learn.yaml", "configs/demo.yaml", *LOOP_CODE)

TARGET_RATIO = 0.7
CORRECTIONS = {
    "truncated": ("truncated", "behaviour"),
    "none": ("none", "behaviour"),  # advantages, train
    "decoupled": ("none", "decoupled"),
}
MAX_POINTS_BEHIND = 3.0


def serve(lake_uri: str, version: int, batch_size: int) -> tuple[subprocess.Popen, str]:
    """`rlvr policy serve` on a free port of loopback, one torch thread, only `version` loaded at start."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "rlvr"),
            "policy",
            "serve",
            "--lake",
            lake_uri,
            "--port",
            str(port),
            "--no-on-demand",
            "--preload",
            str(version),
            "--batch-size",
            str(batch_size),
        ],
        env={**os.environ, "RLVR_TORCH_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"rlvr policy serve exited: {process.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return process, url
        except OSError:
            time.sleep(0.3)
    process.kill()
    raise RuntimeError(f"rlvr policy serve did not answer at {url} within 120 s")


def one_mode(
    config, base: str, mode: str, iterations: int, max_staleness: int, batch_size: int, correction: str = "truncated"
) -> dict:
    """The loop in `mode` from the warm version, in a copy of `base`, against its own server."""
    from flows.loop import rl_loop

    lake_uri = copy_of(base, f"rlvr-bench-async-{mode}-")
    lake = Lake.open(lake_uri)
    warm = int(lake.read("iteration_metrics", filter=pc.field("iteration") == 0)["trained_version"][0])
    process, url = serve(lake_uri, warm, batch_size)
    try:
        settings = config.model_copy(deep=True)
        settings.rollout.backend = "openai"
        settings.rollout.openai.endpoints = [url]
        settings.rollout.openai.prompts_per_request = 1024  # one request a round: the server batches within it
        settings.loop.mode, settings.loop.max_staleness = mode, max_staleness
        # only async has off-policy rollouts; sync's are fresh, and every correction leaves them as they are
        settings.advantages.off_policy_weight, settings.train.off_policy_loss = CORRECTIONS[correction]
        settings.loop.evaluate_every = iterations  # once, at the end
        started = time.perf_counter()
        rl_loop(settings.model_dump(mode="json"), iterations, lake_uri)
        wall = time.perf_counter() - started
    finally:
        process.terminate()
        process.wait(30)
    runs = lake.read("runs", filter=pc.field("iteration") > 0).with_columns(
        seconds=(pl.col("ended_at") - pl.col("started_at")).dt.total_microseconds() / 1e6
    )
    evaluation = float(runs.filter(pl.col("stage") == "evaluate")["seconds"].sum())
    final = lake.read("iteration_metrics", filter=pc.field("iteration") == iterations)["eval_solve_rate"][0]
    staleness = lake.read("advantages", columns=["staleness"]).group_by("staleness").len().sort("staleness")
    return {
        "mode": mode,
        "lake": lake_uri,
        "rl_seconds": wall - evaluation,
        "final_solve_rate": final,
        "staleness": dict(staleness.rows()),
    }


def run_benchmark(
    config_path: str,
    iterations: int,
    max_staleness: int,
    work: str | None = None,
    batch_size: int = 128,
    correction: str = "truncated",
) -> dict:
    from rich.console import Console

    from flows.run_config import load_run_config

    console = Console()
    config = load_run_config(config_path)
    base = warmed_once(config_path, work or tempfile.mkdtemp(prefix="rlvr-bench-async-"), console)
    started_once()
    os.environ["RLVR_TORCH_THREADS"] = "1"  # one thread per torch worker, the server's included
    results = {
        mode: one_mode(config, base, mode, iterations, max_staleness, batch_size, correction)
        for mode in ("sync", "async")
    }
    sync, overlapped = results["sync"], results["async"]
    ratio = overlapped["rl_seconds"] / sync["rl_seconds"]
    behind = 100 * (sync["final_solve_rate"] - overlapped["final_solve_rate"])
    console.print(
        f"{iterations} iterations, policy served by `rlvr policy serve`, 1 torch thread per process, "
        f"max_staleness {max_staleness}, correction {correction} (evaluation excluded): sync {sync['rl_seconds']:.1f} s, async {overlapped['rl_seconds']:.1f} s "
        f"— ×{ratio:.2f} (target ≤ {TARGET_RATIO})"
    )
    console.print(
        f"held-out solve rate after iteration {iterations}: sync {sync['final_solve_rate']:.1%}, async "
        f"{overlapped['final_solve_rate']:.1%} ({behind:+.1f} points behind; target ≤ {MAX_POINTS_BEHIND})"
    )
    console.print(
        "async staleness (rollouts by versions behind the trainer): "
        + ", ".join(f"{lag}: {count}" for lag, count in overlapped["staleness"].items())
    )
    return {"ratio": ratio, "points_behind": behind, **results}
