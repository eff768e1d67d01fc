"""`rlvr bench correction`: the rollout corrections on a real sampler-trainer gap. A bf16 vLLM server (its CPU
build, `configs/correction-bf16.yaml`) samples for the fp32 trainer; the loop runs the same iterations from the
same seed under each `train.rollout_correction` — none, token_tis and sequence_mask at their defaults, and
sequence_mask at bounds read off the gap (0.95-1.05), where the defaults mask nothing.

From each run's lake alone: the gap per iteration (`iteration_metrics`' mismatch figures), the share the step
masked, the held-out curve, and the offline replay (`trainers/mismatch.py`, what `rlvr analyze mismatch`
prints) of the run's own mode on its stored rows, iteration by iteration, against the share the step measured
while training: they must agree (`replay_max_difference`, 0 up to float rounding).
"""

from __future__ import annotations

import tempfile
import time

import polars as pl
import pyarrow.compute as pc

from bench.results import LOOP_CODE
from storage.lake import Lake

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = (
    "bench/correction_runs.py",
    "configs/correction-bf16.yaml",
    "configs/demo.yaml",
    "infra/vllm/serve.sh",
    "policy/vllm_servers.py",
    *LOOP_CODE,
)

CORRECTIONS = {
    "none": {"mode": "none"},
    "token_tis": {"mode": "token_tis"},
    "sequence_mask": {"mode": "sequence_mask"},
    "sequence_mask_tight": {"mode": "sequence_mask", "low": 0.95, "high": 1.05},
}
GAP = ["mismatch_mean_abs_delta", "mismatch_kl_k3", "mismatch_outside_share", "correction_masked_share"]


def run_report(lake: Lake, correction: dict) -> dict:
    """One run's gap, masked shares, curve and replay, from its lake."""
    from trainers.mismatch import what_each_mode_keeps

    metrics = lake.read("iteration_metrics").sort("iteration")
    trained = metrics.filter(pl.col("iteration") > 0)
    replayed = []
    for iteration, measured in trained.select("iteration", "correction_masked_share").iter_rows():
        rows = lake.read("mismatch", filter=pc.field("iteration") == iteration, columns=["log_ratio"])
        if correction["mode"] == "none":
            replayed.append((iteration, measured, 0.0))  # nothing is masked, and nothing replays
            continue
        bounds = {correction["mode"]: (correction.get("low"), correction.get("high"))}
        modes = what_each_mode_keeps(rows["log_ratio"], bounds).filter(pl.col("mode") == correction["mode"])
        replayed.append((iteration, measured, float(modes["tokens_masked_share"][0])))
    every_mode = what_each_mode_keeps(lake.read("mismatch", columns=["log_ratio"])["log_ratio"])
    curve = metrics.filter(pl.col("eval_solve_rate").is_not_null()).select("iteration", "eval_solve_rate")
    return {
        "correction": correction,
        "curve": curve.rows(),
        "gap_by_iteration": trained.select("iteration", *GAP).rows(),
        "mean_abs_delta": float(trained["mismatch_mean_abs_delta"].mean()),
        "kl_k3": float(trained["mismatch_kl_k3"].mean()),
        "masked_share": float(trained["correction_masked_share"].mean()),
        "replayed": replayed,
        "replay_max_difference": max(abs(measured - again) for _, measured, again in replayed),
        "every_mode_at_defaults": {
            row["mode"]: {
                "tokens_masked": row["tokens_masked_share"],
                "sequences_masked": row["sequences_masked_share"],
            }
            for row in every_mode.iter_rows(named=True)
        },
        "rollouts_kept": lake.read("mismatch", columns=["rollout_id"]).height,
    }


def run_benchmark(config: str, iterations: int, corrections: list[str]) -> dict:
    from rich.console import Console

    from flows.curation import curate_bank
    from flows.loop import rl_loop
    from flows.run_config import load_run_config
    from storage.config import load_yaml_config
    from tasks.curation.config import CurationConfig

    console = Console()
    runs = {}
    for name in corrections:
        lake_uri = tempfile.mkdtemp(prefix=f"rlvr-bench-correction-{name}-")
        settings = load_run_config(config).model_dump(mode="json")
        settings["train"]["rollout_correction"] = CORRECTIONS[name]
        started = time.perf_counter()
        curate_bank(load_yaml_config(config, CurationConfig, section="bank").model_dump(mode="json"), lake_uri)
        rl_loop(settings, iterations, lake_uri)
        runs[name] = {
            **run_report(Lake.open(lake_uri), CORRECTIONS[name]),
            "wall_seconds": time.perf_counter() - started,
        }
        report = runs[name]
        console.print(
            f"{name}: mean |Δ log p| {report['mean_abs_delta']:.5f}, k3 KL {report['kl_k3']:.2e}, masked "
            f"{report['masked_share']:.2%} of tokens (replayed offline: max difference "
            f"{report['replay_max_difference']:.1e}); held-out "
            + " → ".join(f"{rate:.1%}" for _, rate in report["curve"])
        )
    return {"iterations": iterations, "runs": runs}
