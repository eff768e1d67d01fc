"""`rlvr bench …`: the benchmarks' command group. It plugs into the command tree through the `rlvr.commands`
entry point (pyproject.toml), so the command line's floor never imports the benchmarks; each command imports
its benchmark only when it runs."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, Optional

import typer

from flows.cli.common import fail, prefect_defaults
from flows.display import errors

app = typer.Typer(help="Benchmarks, measured as ratios on this machine.", no_args_is_help=True)


class BenchFormat(str, Enum):
    """A benchmark's report for people, or its result as one JSON object for programs."""
    table = "table"
    json = "json"


FormatOption = Annotated[BenchFormat, typer.Option(
    "--format", help="table: the report for people; json: one JSON object on stdout (figures, parameters, commit, "
    "date, host), the report on stderr")]
SaveOption = Annotated[Optional[str], typer.Option(
    "--save", metavar="NAME", help="also write the JSON object to bench/results/NAME.json, where docs/benchmarks.md "
    "and the README take their figures from (python -m bench.docs)")]


@contextmanager
def report_on_stderr() -> Iterator[None]:
    """Everything written to stdout meanwhile (rich, print, child processes) goes to stderr instead."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def measured(context: typer.Context, name: str, module: ModuleType, run: Callable[[], Any]) -> Any:
    """Run a benchmark, its report as the command's --format asks; with json print its result object, with --save
    write it. The parameters recorded are the command's own options."""
    from bench.results import code_state, envelope, save as save_result

    parameters = {key: value for key, value in context.params.items() if key not in ("format", "save")}
    format, save = context.params["format"], context.params["save"]
    started = code_state(module.DEPENDS_ON)             # the code that runs is the code at the start
    with report_on_stderr() if format is BenchFormat.json else nullcontext():
        result = run()
    if format is BenchFormat.json or save:
        outcome = envelope(name, result, parameters, module.DEPENDS_ON, started)
        if save:
            errors.print(f"saved {save_result(outcome, save)}", highlight=False, soft_wrap=True)
        if format is BenchFormat.json:
            sys.stdout.write(json.dumps(outcome) + "\n")
    return result


def _check_run_config(path: Path) -> None:
    """A run config a benchmark reads, validated before any work: an error names the file and field, exit 2."""
    from flows.run_config import load_run_config

    try:
        load_run_config(path)
    except ValueError as error:
        fail(str(error), 2)


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

    measured(context, "dedup", dedup_scaling,
             lambda: {"sizes": dedup_scaling.run_benchmark([int(s) for s in sizes.split(",")], repeats)})


@app.command("verify")
def bench_verify(
    context: typer.Context,
    limit: Annotated[int, typer.Option(help="gold answers per mix (numeric: MATH-500 then GSM8K test, two responses "
                                       "each; symbolic: MATH-500's non-numeric golds, 16 responses each)")] = 2000,
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
    measured(context, "verify", verify_throughput,
             lambda: verify_throughput.run_benchmark(limit, workers, repeats, mixes))


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


@app.command("sandbox")
def bench_sandbox(
    context: typer.Context,
    workers: Annotated[int, typer.Option(min=1, help="concurrent runs on both sides")] = 2,
    repeats: Annotated[int, typer.Option(min=1, help="passes over the 164 problems")] = 1,
    hostile: Annotated[bool, typer.Option("--hostile", help="score a mix of honest and hostile programs through "
                                          "the verification pool instead")] = False,
    rows: Annotated[int, typer.Option(min=1, help="--hostile: rows to score")] = 10_000,
    hostile_share: Annotated[float, typer.Option(min=0, max=1, help="--hostile: share of hostile rows")] = 0.1,
    files: Annotated[bool, typer.Option("--files", help="file-level unittest suites against bare python -m "
                                        "unittest instead")] = False,
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

        summary = measured(context, "sandbox-hostile", sandbox_hostile,
                           lambda: sandbox_hostile.run_benchmark(rows, hostile_share, workers))
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
    processes: Annotated[int, typer.Option(min=1, help="with 2 or more: persistent ranks against one process with "
                                           "the same total threads, instead of the comparison with TRL")] = 1,
    strategy: Annotated[str, typer.Option(help="the ranks' strategy: ddp or fsdp")] = "ddp",
    shape: Annotated[list[str], typer.Option(help="model shapes of the ranks' comparison: tiny, 0.5b")]
        = ["tiny", "0.5b"],
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """Training-step throughput (tokens/s) against TRL's GRPOTrainer on the same tiny model and batch; with
    --processes N, a step on N persistent ranks (ddp or fsdp) against one process."""
    if processes > 1:
        from bench import train_ranks

        if strategy not in ("ddp", "fsdp") or set(shape) - set(train_ranks.BATCHES):
            fail(f"--strategy is ddp or fsdp and --shape one of {', '.join(train_ranks.BATCHES)}")
        measured(context, "train-ranks", train_ranks, lambda: train_ranks.run_benchmark(
            processes, strategy, tuple(shape), min(repeats, 3)))
        return
    from bench import train_throughput

    measured(context, "train", train_throughput, lambda: train_throughput.run_benchmark(
        sequences=sequences, response_length=response_length, repeats=repeats))


@app.command("sampling")
def bench_sampling(
    context: typer.Context,
    shape: Annotated[list[str], typer.Option(help="model shapes: tiny (the demo policy), 0.5b (Qwen2.5-0.5B-shaped)")]
        = ["tiny", "0.5b"],
    repeats: Annotated[int, typer.Option(min=1, help="alternating repeats per side (best)")] = 3,
    backend: Annotated[str, typer.Option(help="what the hf sampler is measured against: generate (transformers') "
                                         "or vllm (a real vLLM server from .venv-vllm)")] = "generate",
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


@app.command("learning")
def bench_learning(
    context: typer.Context,
    config: Annotated[Path, typer.Option(help="the learning run's config")] = Path("configs/demo-learn.yaml"),
    iterations: Annotated[Optional[int], typer.Option(min=0, help="RL iterations [default: the config's]; 0 only "
                                                                  "reports on an existing --lake")] = None,
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
    seed: Annotated[list[int], typer.Option(help="seeds; each runs both sides from the same warm-up")] = [0, 1, 2, 3, 4],
    eval_every: Annotated[int, typer.Option(min=1, help="steps between held-out evaluations")] = 10,
    work: Annotated[Optional[str], typer.Option(help="folder for the warmed lake and the runs (reused)")] = None,
    sweep_steps: Annotated[int, typer.Option(min=1, help="TRL steps timed per batch layout in the sweep")] = 6,
    compare_fixed: Annotated[bool, typer.Option(help="also run ours with fixed oversampling (guidance off) per "
                                                "seed: what sampling guided by the lake changes")] = True,
    mode: Annotated[Optional[str], typer.Option(help="ours' loop mode, sync or async (default: both swept, the "
                                                "faster compared); TRL's trainer samples and trains in turn")] = None,
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """The loop against TRL's GRPOTrainer at its fastest batch layout, from the same warmed-up checkpoint: accuracy
    per checkpoint (paired over seeds), RL wall time, time to TRL's final accuracy."""
    _check_run_config(config)
    from bench import peer
    from flows.run_config import load_run_config

    try:
        peer.mirror(load_run_config(config))
    except peer.CannotMirror as error:
        fail(f"{config}: {error}", 2)
    if mode not in (None, "sync", "async"):
        fail(f"--mode {mode}: sync or async", 2)
    prefect_defaults()
    measured(context, "peer", peer, lambda: peer.run_benchmark(str(config), steps, seed, eval_every, work,
                                                               sweep_steps, compare_fixed, mode))


@app.command("async")
def bench_async(
    context: typer.Context,
    config: Annotated[Path, typer.Option(help="the learning run's config")] = Path("configs/demo-learn.yaml"),
    iterations: Annotated[int, typer.Option(min=1, help="iterations each mode runs")] = 10,
    max_staleness: Annotated[int, typer.Option(min=0, help="async: versions a batch may lag its trainer")] = 1,
    batch_size: Annotated[int, typer.Option(min=1, help="the server's sequences generated together")] = 128,
    correction: Annotated[str, typer.Option(help="async's off-policy correction: truncated (sequence weight), "
                                            "none, or decoupled (per-token, in the training step)")] = "truncated",
    work: Annotated[Optional[str], typer.Option(help="folder for the warmed lake (reused)")] = None,
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """The same iterations sync and async against a separate `rlvr policy serve`: wall times, accuracy, staleness."""
    if correction not in ("truncated", "none", "decoupled"):
        fail(f"--correction {correction!r}: truncated, none or decoupled", 2)
    _check_run_config(config)
    prefect_defaults()
    from bench import overlap

    measured(context, "async", overlap,
             lambda: overlap.run_benchmark(str(config), iterations, max_staleness, work, batch_size, correction))


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
    lakes: Annotated[str, typer.Option(help="where to run the cases: local, s3 (moto on loopback) or both")] = "local,s3",
    run_points: Annotated[Optional[str], typer.Option(help="fault points of `rlvr run` to kill at, comma separated "
                                                     "[default: all 13]")] = None,
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
        outcomes = faults.run_benchmark([k for k in lakes.split(",") if k], points(run_points), points(curate_points),
                                        concurrency)
        return {"cases": len(outcomes), "passed": sum(o.passed for o in outcomes), "outcomes": outcomes}

    outcomes = measured(context, "faults", faults, run)["outcomes"]
    if not all(outcome.passed for outcome in outcomes):
        raise typer.Exit(1)


@app.command("publish")
def bench_publish(
    context: typer.Context,
    versions: Annotated[int, typer.Option(min=1, help="model versions published each way (median)")] = 5,
    engine: Annotated[str, typer.Option(help="stand-in (`rlvr policy serve`) or vllm (real vLLM servers from "
                                        ".venv-vllm, `make vllm-server`)")] = "stand-in",
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
    dtype: Annotated[Optional[list[str]], typer.Option(help="a server dtype to measure (repeat); default float32 "
                                                       "and bfloat16")] = None,
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
    measured(context, "mismatch", engine_mismatch,
             lambda: engine_mismatch.run_benchmark(tuple(dtype or ("float32", "bfloat16")), prompts, samples, max_tokens))


@app.command("reward-serve")
def bench_reward_serve(
    context: typer.Context,
    problems: Annotated[int, typer.Option(min=1, help="generated math problems")] = 200,
    samples: Annotated[int, typer.Option(min=1, help="responses a problem (half right)")] = 8,
    clients: Annotated[int, typer.Option(min=1, help="requests in flight at once")] = 64,
    batch: Annotated[int, typer.Option(min=1, help="responses a request to the native endpoint")] = 64,
    workers: Annotated[int, typer.Option(min=0, help="verifier processes, both ways")] = 2,
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """Rewards a second and latency of `rlvr reward serve` over HTTP with lake writes, against scoring in-process."""
    from bench import reward_serve

    measured(context, "reward-serve", reward_serve,
             lambda: reward_serve.run_benchmark(problems, samples, clients, batch, workers))


@app.command("lake-scale")
def bench_lake_scale(
    context: typer.Context,
    iterations: Annotated[int, typer.Option(min=1, help="iterations the synthetic run writes")] = 2000,
    rollouts: Annotated[int, typer.Option(min=16, help="rollouts an iteration (groups of 16)")] = 8192,
    max_tokens: Annotated[int, typer.Option(min=16, help="longest response in tokens (lengths are long-tailed "
                                            "below it)")] = 16384,
    problems: Annotated[int, typer.Option(min=0, help="bank size (0: four iterations' worth of groups, at least "
                                          "400)")] = 0,
    s3_iterations: Annotated[int, typer.Option(min=0, help="iterations written to a lake on moto's S3 server to "
                                               "count requests (0: none)")] = 20,
    seed: Annotated[int, typer.Option(help="seed of the synthetic responses")] = 0,
    maintain_every: Annotated[int, typer.Option(min=0, help="run `rlvr lake maintain`'s maintenance after every "
                                                "this many iterations, as the scheduled deployment would (0: "
                                                "never)")] = 10,
    retention_hours: Annotated[float, typer.Option(min=0, help="the scheduled maintenance's retention (time "
                                                   "travel kept; the synthetic run lasts minutes, so a week's "
                                                   "retention would keep everything)")] = 0.0,
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """What a long run's lake costs: bookkeeping per iteration as it ages, `rlvr sql` and lineage times, bytes
    against plain Parquet, S3 requests an iteration."""
    from bench import lake_scale

    measured(context, "lake-scale", lake_scale,
             lambda: lake_scale.run_benchmark(iterations, rollouts, max_tokens, problems, s3_iterations, seed,
                                              maintain_every, retention_hours))


@app.command("judge-guard")
def bench_judge_guard(context: typer.Context, format: FormatOption = BenchFormat.table, save: SaveOption = None) -> None:
    """The judge's injection guard: benign responses it refuses and injected ones it catches (a labelled set and,
    where ../shared/datasets is present, real worked solutions), against the guard before."""
    from bench import judge_guard

    measured(context, "judge-guard", judge_guard, judge_guard.run_benchmark)


@app.command("startup")
def bench_startup(
    context: typer.Context,
    against: Annotated[str, typer.Option(help="the git revision to compare with (a worktree of it is made for the "
                                         "run)")] = "7eaa8ff",
    repeats: Annotated[int, typer.Option(min=1, help="alternating runs of each command on each side (median)")] = 7,
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """`rlvr --help` and `rlvr sql` start-up time against an earlier commit's, and the heavy modules each imports."""
    from bench import startup

    measured(context, "startup", startup, lambda: startup.run_benchmark(against, repeats))


@app.command("stale")
def bench_stale(format: FormatOption = BenchFormat.table) -> None:
    """Saved results measured on code older than the working tree: each with its commit, the files that changed
    since and the command that refreshes it (`make bench-refresh` re-runs them all). Information: exit 0."""
    from bench.stale import describe, stale

    entries = stale()
    if format is BenchFormat.json:
        sys.stdout.write(json.dumps([dataclasses.asdict(entry) for entry in entries]) + "\n")
    else:
        print(describe(entries))


@app.command("compare")
def bench_compare(
    base: Annotated[str, typer.Option(help="the commit to compare with (a git worktree of it is made for the run)")]
        = "main",
    only: Annotated[Optional[list[str]], typer.Option(help="a fast benchmark to compare (repeatable) [default: "
                                                    "advantages, verify, sandbox, train, sampling, startup]")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="alternating runs of each side (median), after a warm-up")] = 3,
    threshold: Annotated[float, typer.Option(min=0, help="a slowdown past 1 + this is a regression (exit 1)")] = 0.15,
    format: FormatOption = BenchFormat.table,
) -> None:
    """The fast benchmarks on BASE's code and on this working tree, alternating in one run: exit 1 when a figure
    got slower by more than the threshold. The step before merging a change to loop code."""
    from bench.compare import PROBES, compare

    names = list(only or PROBES)
    try:
        outcome = compare(base, names, repeats, threshold,
                          say=lambda line: errors.print(line, highlight=False, soft_wrap=True))
    except (ValueError, RuntimeError) as error:
        fail(str(error), 2)
    if format is BenchFormat.json:
        sys.stdout.write(json.dumps(outcome) + "\n")
    else:
        print(f"{len(outcome['rows'])} figures compared with {outcome['base'][:7]}: "
              + (f"regressed past ×{1 + threshold:.2f}: {', '.join(outcome['regressed'])}" if outcome["regressed"]
                 else f"none slower than ×{1 + threshold:.2f}"))
    if outcome["regressed"]:
        raise typer.Exit(1)
