"""The commands of the benchmarks of single components (deduplication, verification, advantages, the sandbox,
a training step, sampling), on the group `bench/cli.py` assembles."""

from __future__ import annotations

from typing import Annotated

import typer

from bench.command import BenchFormat, FormatOption, SaveOption, app, measured
from flows.cli.common import fail


@app.command("dedup")
def bench_dedup(
    context: typer.Context,
    sizes: Annotated[str, typer.Option(help="bank sizes to time, comma separated")] = "100000,200000",
    repeats: Annotated[int, typer.Option(help="timed runs per size; the best is kept")] = 2,
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """Near-duplicate detection time as the bank grows: the ratio shows how it scales."""
    from bench import dedup_scaling

    measured(
        context,
        "dedup",
        dedup_scaling,
        lambda: {"sizes": dedup_scaling.run_benchmark([int(s) for s in sizes.split(",")], repeats)},
    )


@app.command("verify")
def bench_verify(
    context: typer.Context,
    limit: Annotated[
        int,
        typer.Option(
            help="gold answers per mix (numeric: MATH-500 then GSM8K test, two responses "
            "each; symbolic: MATH-500's non-numeric golds, 16 responses each)"
        ),
    ] = 2000,
    workers: Annotated[int, typer.Option(min=1, help="our verifier's worker processes")] = 2,
    repeats: Annotated[int, typer.Option(min=1, help="back-to-back measurements; the median is reported")] = 3,
    mix: Annotated[str, typer.Option(help="numeric, symbolic or both (comma separated)")] = "numeric,symbolic",
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """Math verification throughput and accuracy against math-verify called directly, on two mixes."""
    from bench import verify_throughput

    mixes = tuple(m for m in mix.split(",") if m)
    if not set(mixes) <= {"numeric", "symbolic"}:
        fail(f"--mix takes numeric and symbolic, not {mix!r}", 2)
    measured(
        context, "verify", verify_throughput, lambda: verify_throughput.run_benchmark(limit, workers, repeats, mixes)
    )


@app.command("advantages")
def bench_advantages(
    context: typer.Context,
    groups: Annotated[int, typer.Option(min=1, help="groups of rollouts")] = 625_000,
    group_size: Annotated[int, typer.Option(min=2, help="rollouts per group")] = 16,
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """Advantages plus filtering against per-group Python and a bare Polars group-by."""
    from bench import advantages_scale

    measured(context, "advantages", advantages_scale, lambda: advantages_scale.run_benchmark(groups, group_size))


@app.command("mismatch-analysis")
def bench_mismatch_analysis(
    context: typer.Context,
    rollouts: Annotated[int, typer.Option(min=1, help="trained rollouts in the synthetic mismatch table")] = 1_000_000,
    median_tokens: Annotated[int, typer.Option(min=1, help="median response length (log-normal)")] = 48,
    max_tokens: Annotated[int, typer.Option(min=1, help="longest response")] = 1024,
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """`rlvr analyze mismatch` over a million stored rollouts, as a fresh process (target ≤ 10 s), against
    `rlvr sql` scanning the same column."""
    from bench import mismatch_analysis

    measured(
        context,
        "mismatch-analysis",
        mismatch_analysis,
        lambda: mismatch_analysis.run_benchmark(rollouts, median_tokens=median_tokens, max_tokens=max_tokens),
    )


@app.command("sandbox")
def bench_sandbox(
    context: typer.Context,
    workers: Annotated[int, typer.Option(min=1, help="concurrent runs on both sides")] = 2,
    repeats: Annotated[int, typer.Option(min=1, help="passes over the 164 problems")] = 1,
    hostile: Annotated[
        bool,
        typer.Option(
            "--hostile", help="score a mix of honest and hostile programs through the verification pool instead"
        ),
    ] = False,
    rows: Annotated[int, typer.Option(min=1, help="--hostile: rows to score")] = 10_000,
    hostile_share: Annotated[float, typer.Option(min=0, max=1, help="--hostile: share of hostile rows")] = 0.1,
    files: Annotated[
        bool, typer.Option("--files", help="file-level unittest suites against bare python -m unittest instead")
    ] = False,
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """Sandboxed executions per second against bare subprocesses, on HumanEval's canonical solutions; with
    --hostile, honest pass rate, hostile rewards, memory, descriptors and throughput under hostile load; with
    --files, the shipped file-level suites' time against bare `python -m unittest`."""
    if files:
        from bench import sandbox_files

        measured(context, "sandbox-files", sandbox_files, lambda: sandbox_files.run_benchmark(workers, repeats))
        return
    if hostile:
        from bench import sandbox_hostile

        summary = measured(
            context,
            "sandbox-hostile",
            sandbox_hostile,
            lambda: sandbox_hostile.run_benchmark(rows, hostile_share, workers),
        )
        if summary["honest_pass_rate_vs_bare"] < 1 or summary["hostile_rows_rewarded"] or summary["crashed"]:
            raise typer.Exit(1)
        return
    from bench import sandbox_rate

    measured(context, "sandbox", sandbox_rate, lambda: sandbox_rate.run_benchmark(workers, repeats))


@app.command("train")
def bench_train(
    context: typer.Context,
    sequences: Annotated[int, typer.Option(min=2, help="sequences per training step")] = 128,
    response_length: Annotated[int, typer.Option(min=1, help="response tokens per sequence")] = 40,
    repeats: Annotated[int, typer.Option(min=1, help="timed steps per side (median)")] = 5,
    processes: Annotated[
        int,
        typer.Option(
            min=1,
            help="with 2 or more: persistent ranks against one process with "
            "the same total threads, instead of the comparison with TRL",
        ),
    ] = 1,
    strategy: Annotated[str, typer.Option(help="the ranks' strategy: ddp or fsdp")] = "ddp",
    shape: Annotated[list[str], typer.Option(help="model shapes of the ranks' comparison: tiny, 0.5b")] = [
        "tiny",
        "0.5b",
    ],
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """Training-step throughput (tokens/s) against TRL's GRPOTrainer on the same tiny model and batch; with
    --processes N, a step on N persistent ranks (ddp or fsdp) against one process."""
    if processes > 1:
        from bench import train_ranks

        if strategy not in ("ddp", "fsdp") or set(shape) - set(train_ranks.BATCHES):
            fail(f"--strategy is ddp or fsdp and --shape one of {', '.join(train_ranks.BATCHES)}")
        measured(
            context,
            "train-ranks",
            train_ranks,
            lambda: train_ranks.run_benchmark(processes, strategy, tuple(shape), min(repeats, 3)),
        )
        return
    from bench import train_throughput

    measured(
        context,
        "train",
        train_throughput,
        lambda: train_throughput.run_benchmark(sequences=sequences, response_length=response_length, repeats=repeats),
    )


@app.command("sampling")
def bench_sampling(
    context: typer.Context,
    shape: Annotated[
        list[str], typer.Option(help="model shapes: tiny (the demo policy), 0.5b (Qwen2.5-0.5B-shaped)")
    ] = ["tiny", "0.5b"],
    repeats: Annotated[int, typer.Option(min=1, help="alternating repeats per side (best)")] = 3,
    backend: Annotated[
        str,
        typer.Option(
            help="what the hf sampler is measured against: generate (transformers') "
            "or vllm (a real vLLM server from .venv-vllm)"
        ),
    ] = "generate",
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """The hf backend's sampler against transformers' generate (with scores), or against a vLLM server, on the same
    model and batch."""
    from bench import sampling
    from policy import vllm_servers

    unknown = sorted(set(shape) - set(sampling.SHAPES))
    if unknown:
        fail(f"--shape {unknown[0]}: choose from {', '.join(sampling.SHAPES)}")
    if backend not in ("generate", "vllm"):
        fail(f"--backend {backend}: choose from generate, vllm")
    if backend == "vllm" and vllm_servers.missing():
        fail(vllm_servers.missing())
    measured(context, "sampling", sampling, lambda: {"shapes": sampling.run_benchmark(shape, repeats, backend)})
