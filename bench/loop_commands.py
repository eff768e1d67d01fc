"""The commands of the benchmarks that run the loop itself (learning, the peer comparison, async, orchestration,
faults, publishing, the engine mismatch), on the group `bench/cli.py` assembles."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from bench.command import BenchFormat, FormatOption, SaveOption, app, check_run_config, measured
from flows.cli.common import fail, prefect_defaults


@app.command("learning")
def bench_learning(
    context: typer.Context,
    config: Annotated[Path, typer.Option(help="the learning run's config")] = Path("configs/demo-learn.yaml"),
    iterations: Annotated[
        Optional[int],
        typer.Option(min=0, help="RL iterations [default: the config's]; 0 only reports on an existing --lake"),
    ] = None,
    lake: Annotated[Optional[str], typer.Option(help="lake to run in or report on [default: a fresh folder]")] = None,
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """Held-out sampled solve rate of the warm-up model against the RL versions after it, from stored metrics."""
    prefect_defaults()
    from bench import learning

    try:
        measured(context, "learning", learning, lambda: learning.run_benchmark(str(config), lake, iterations))
    except ValueError as error:
        fail(str(error))


@app.command("peer")
def bench_peer(
    context: typer.Context,
    config: Annotated[Path, typer.Option(help="the learning run's config")] = Path("configs/demo-learn.yaml"),
    steps: Annotated[int, typer.Option(min=1, help="RL steps (our iterations, TRL's optimizer steps)")] = 50,
    seed: Annotated[list[int], typer.Option(help="seeds; each runs both sides from the same warm-up")] = [
        0,
        1,
        2,
        3,
        4,
    ],
    eval_every: Annotated[int, typer.Option(min=1, help="steps between held-out evaluations")] = 10,
    work: Annotated[Optional[str], typer.Option(help="folder for the warmed lake and the runs (reused)")] = None,
    sweep_steps: Annotated[int, typer.Option(min=1, help="TRL steps timed per batch layout in the sweep")] = 6,
    compare_fixed: Annotated[
        bool,
        typer.Option(
            help="also run ours with the mix's random draw and fixed oversampling (selection and guidance "
            "off) per seed: what sampling by the lake's history changes"
        ),
    ] = True,
    mode: Annotated[
        Optional[str],
        typer.Option(
            help="ours' loop mode, sync or async (default: both swept, the "
            "faster compared); TRL's trainer samples and trains in turn"
        ),
    ] = None,
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """The loop against TRL's GRPOTrainer at its fastest batch layout, from the same warmed-up checkpoint: accuracy
    per checkpoint (paired over seeds), RL wall time, time to TRL's final accuracy."""
    check_run_config(config)
    from bench import peer
    from flows.run_config import load_run_config

    try:
        peer.mirror(load_run_config(config))
    except peer.CannotMirror as error:
        fail(f"{config}: {error}", 2)
    if mode not in (None, "sync", "async"):
        fail(f"--mode {mode}: sync or async", 2)
    prefect_defaults()
    measured(
        context,
        "peer",
        peer,
        lambda: peer.run_benchmark(str(config), steps, seed, eval_every, work, sweep_steps, compare_fixed, mode),
    )


@app.command("async")
def bench_async(
    context: typer.Context,
    config: Annotated[Path, typer.Option(help="the learning run's config")] = Path("configs/demo-learn.yaml"),
    iterations: Annotated[int, typer.Option(min=1, help="iterations each mode runs")] = 10,
    max_staleness: Annotated[int, typer.Option(min=0, help="async: versions a batch may lag its trainer")] = 1,
    batch_size: Annotated[int, typer.Option(min=1, help="the server's sequences generated together")] = 128,
    correction: Annotated[
        str,
        typer.Option(
            help="async's off-policy correction: truncated (sequence weight), "
            "none, or decoupled (per-token, in the training step)"
        ),
    ] = "truncated",
    work: Annotated[Optional[str], typer.Option(help="folder for the warmed lake (reused)")] = None,
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """The same iterations sync and async against a separate `rlvr policy serve`: wall times, accuracy, staleness."""
    if correction not in ("truncated", "none", "decoupled"):
        fail(f"--correction {correction!r}: truncated, none or decoupled", 2)
    check_run_config(config)
    prefect_defaults()
    from bench import overlap

    measured(
        context,
        "async",
        overlap,
        lambda: overlap.run_benchmark(str(config), iterations, max_staleness, work, batch_size, correction),
    )


@app.command("orchestration")
def bench_orchestration(
    context: typer.Context,
    repeats: Annotated[int, typer.Option(min=1, help="runs of each read-only command (median)")] = 3,
    subflows: Annotated[int, typer.Option(min=1, help="stage-shaped subflows timed (median)")] = 20,
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """What Prefect and the command line cost: read-only commands, a subflow and a task, the loop outside its stages."""
    from bench import orchestration

    measured(context, "orchestration", orchestration, lambda: orchestration.run_benchmark(repeats, subflows))


@app.command("faults")
def bench_faults(
    context: typer.Context,
    lakes: Annotated[
        str, typer.Option(help="where to run the cases: local, s3 (moto on loopback) or both")
    ] = "local,s3",
    run_points: Annotated[
        Optional[str], typer.Option(help="fault points of `rlvr run` to kill at, comma separated [default: all 13]")
    ] = None,
    curate_points: Annotated[Optional[str], typer.Option(help="fault points of `rlvr curate` [default: all 4]")] = None,
    concurrency: Annotated[bool, typer.Option(help="also run two `rlvr run` and three `rlvr curate` at once")] = True,
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """Kill -9 the main job and curation at named points and run writers side by side; check the lake after each."""
    from bench import faults

    def points(text: str | None) -> list[str] | None:
        return None if text is None else [p for p in text.split(",") if p]

    def run() -> dict:
        outcomes = faults.run_benchmark(
            [k for k in lakes.split(",") if k], points(run_points), points(curate_points), concurrency
        )
        return {"cases": len(outcomes), "passed": sum(o.passed for o in outcomes), "outcomes": outcomes}

    outcomes = measured(context, "faults", faults, run)["outcomes"]
    if not all(outcome.passed for outcome in outcomes):
        raise typer.Exit(1)


@app.command("publish")
def bench_publish(
    context: typer.Context,
    versions: Annotated[int, typer.Option(min=1, help="model versions published each way (median)")] = 5,
    engine: Annotated[
        str,
        typer.Option(
            help="stand-in (`rlvr policy serve`) or vllm (real vLLM servers from .venv-vllm, `make vllm-server`)"
        ),
    ] = "stand-in",
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """Seconds per publish of a model version: full weights swapped in place, a load by name, and a server restart
    (the baseline); and the log-prob agreement gate's time."""
    from bench import publish_time
    from policy import vllm_servers

    if engine not in ("stand-in", "vllm"):
        raise typer.BadParameter(f"--engine is stand-in or vllm, not {engine!r}")
    if engine == "vllm" and vllm_servers.missing():
        raise typer.BadParameter(vllm_servers.missing())
    measured(context, "publish", publish_time, lambda: publish_time.run_benchmark(versions, engine))


@app.command("mismatch")
def bench_mismatch(
    context: typer.Context,
    dtype: Annotated[
        Optional[list[str]], typer.Option(help="a server dtype to measure (repeat); default float32 and bfloat16")
    ] = None,
    prompts: Annotated[int, typer.Option(min=1, help="prompts sampled from each server")] = 16,
    samples: Annotated[int, typer.Option(min=1, help="responses per prompt")] = 4,
    max_tokens: Annotated[int, typer.Option(min=1, help="longest response")] = 64,
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """How far real vLLM servers' behaviour log-probs are from the fp32 trainer's, per token and per sequence, by
    the server's dtype (needs .venv-vllm, `make vllm-server`)."""
    from bench import engine_mismatch
    from policy import vllm_servers

    if vllm_servers.missing():
        raise typer.BadParameter(vllm_servers.missing())
    measured(
        context,
        "mismatch",
        engine_mismatch,
        lambda: engine_mismatch.run_benchmark(tuple(dtype or ("float32", "bfloat16")), prompts, samples, max_tokens),
    )


@app.command("correction")
def bench_correction(
    context: typer.Context,
    config: Annotated[Path, typer.Option(help="the run's config: a bf16 server for the fp32 trainer")] = Path(
        "configs/correction-bf16.yaml"
    ),
    iterations: Annotated[int, typer.Option(min=1, help="RL iterations of each run")] = 10,
    correction: Annotated[
        Optional[list[str]],
        typer.Option(help="a run to make (repeat): none, token_tis, sequence_mask, sequence_mask_tight; default all"),
    ] = None,
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """The loop under each rollout correction against a real bf16 vLLM server (needs .venv-vllm, `make
    vllm-server`): the gap, the masked shares, the held-out curves and the offline replay of each run."""
    from bench import correction_runs
    from policy import vllm_servers

    if vllm_servers.missing():
        raise typer.BadParameter(vllm_servers.missing())
    unknown = set(correction or ()) - set(correction_runs.CORRECTIONS)
    if unknown:
        raise typer.BadParameter(f"--correction is one of {', '.join(correction_runs.CORRECTIONS)}, not {unknown}")
    measured(
        context,
        "correction",
        correction_runs,
        lambda: correction_runs.run_benchmark(str(config), iterations, correction or list(correction_runs.CORRECTIONS)),
    )
