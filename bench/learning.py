"""`rlvr bench learning`: does the loop make the tiny model better, and how fast?

Runs `rlvr run` on the learning config into a lake (fresh by default), then reads only what the
loop stored: the held-out sampled solve rate of the warm-up version (iteration 0 of
`iteration_metrics`) against the RL versions after it, and the wall time of the warm-up and RL
stages from `runs`, and the share of the RL iterations' wall time spent outside any stage run (the loop's
own bookkeeping: Prefect, run records, reads between stages). The targets: +15 points within about 15
minutes in all on a 2-core machine, and ≤ 10 % outside the stages.
"""

from __future__ import annotations

import json
import time

import polars as pl
import pyarrow.compute as pc

from bench.results import LOOP_CODE
from bench.stage_time import outside_share
from storage.lake import Lake

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = ("bench/learning.py", "bench/stage_time.py", "configs/demo-learn.yaml", "configs/demo.yaml", *LOOP_CODE)

TARGET_POINTS = 15.0


def learning_report(lake: Lake) -> dict:
    """The learning curve and its timing, from the lake alone."""
    metrics = lake.read("iteration_metrics").sort("iteration")
    curve = metrics.filter(pl.col("eval_solve_rate").is_not_null()).select(
        "iteration", "trained_version", "eval_solve_rate"
    )
    if curve.filter(pl.col("iteration") == 0).is_empty():
        raise ValueError(f"{lake.uri} holds no warm-up evaluation (iteration 0): run a config with warmup enabled")
    start = float(curve.filter(pl.col("iteration") == 0)["eval_solve_rate"][0])
    after = curve.filter(pl.col("iteration") > 0)
    runs = lake.read(
        "runs",
        filter=pc.field("flow").isin(["rl-loop", "rl-iteration", "compute-advantages", "train-policy", "curate-bank"]),
    )
    seconds = {
        stage: float(
            part.select((pl.col("ended_at") - pl.col("started_at")).dt.total_milliseconds().sum()).item() / 1000
        )
        for (stage,), part in runs.group_by("stage")
    }
    rl_runs = lake.read(
        "runs", filter=pc.field("iteration") > 0, columns=["stage", "started_at", "ended_at"]
    ).drop_nulls("ended_at")
    rl_span = (rl_runs["ended_at"].max() - rl_runs["started_at"].min()).total_seconds() if rl_runs.height else 0.0
    warm = lake.read("model_versions", filter=pc.field("kind") == "warmup", columns=["metrics"])
    return {
        "warmup_solve_rate": start,
        "warmup_steps": json.loads(warm["metrics"][0])["steps"] if warm.height else None,
        "final_solve_rate": float(after["eval_solve_rate"][-1]) if after.height else None,
        "best_solve_rate": float(after["eval_solve_rate"].max()) if after.height else None,
        "gain_points": 100 * (float(after["eval_solve_rate"][-1]) - start) if after.height else None,
        "iterations": int(metrics["iteration"].max()),
        "curve": curve.rows(),
        "stage_seconds": seconds,
        "rl_seconds": rl_span,
        "outside_share": outside_share(rl_runs),  # the loop's own time between stage runs
        "eval_problems": int(lake.read("evaluations", filter=pc.field("iteration") == 0)["problems"].sum()),
    }


def run_benchmark(config: str, lake_uri: str | None, iterations: int | None) -> dict:
    """Run the loop (unless `iterations` is 0: report on an existing lake) and print the report."""
    import tempfile

    from rich.console import Console

    from flows.curation import curate_bank
    from flows.loop import rl_loop
    from flows.run_config import load_run_config
    from storage.config import load_yaml_config
    from tasks.curation.config import CurationConfig

    lake_uri = lake_uri or tempfile.mkdtemp(prefix="rlvr-bench-learning-")
    started = time.perf_counter()
    if iterations != 0:
        curate_bank(load_yaml_config(config, CurationConfig, section="bank").model_dump(mode="json"), lake_uri)
        rl_loop(load_run_config(config).model_dump(mode="json"), iterations, lake_uri)
    wall = time.perf_counter() - started
    report = learning_report(Lake.open(lake_uri))
    console = Console()
    console.print(f"lake {lake_uri}: {report['eval_problems']} held-out problems, {report['iterations']} iterations")
    for iteration, version, rate in report["curve"]:
        console.print(f"  iteration {iteration:3d}  version {version:3d}  held-out sampled solve rate {rate:.1%}")
    gain = report["gain_points"]
    console.print(
        f"warm-up {report['warmup_solve_rate']:.1%} ({report['warmup_steps']} steps) → final "
        f"{report['final_solve_rate']:.1%} (best {report['best_solve_rate']:.1%}): "
        f"{gain:+.1f} points (target ≥ +{TARGET_POINTS:.0f})"
    )
    stages = ", ".join(f"{stage} {seconds:.0f} s" for stage, seconds in sorted(report["stage_seconds"].items()))
    console.print(f"wall time {wall:.0f} s; by stage: {stages}")
    if report["outside_share"] is not None:
        console.print(
            f"RL iterations {report['rl_seconds']:.0f} s, {report['outside_share']:.0%} of it outside the "
            f"stage runs (target ≤ 10 %)"
        )
    return {**report, "wall_seconds": wall}
