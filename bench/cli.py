"""`rlvr bench …`: the benchmarks' command group. It plugs into the command tree through the `rlvr.commands`
entry point (pyproject.toml), so the command line's floor never imports the benchmarks; each command imports
its benchmark only when it runs. The commands of the component benchmarks are `bench/component_commands.py`'s,
those of the loop's `bench/loop_commands.py`'s; the lake's, the command line's and the results' are here."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Annotated, Optional

import typer

from bench import component_commands, loop_commands  # noqa: F401  (their commands join the group, in this order)
from bench.command import BenchFormat, FormatOption, SaveOption, app, measured
from flows.cli.common import fail
from flows.display import errors


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

    measured(
        context,
        "reward-serve",
        reward_serve,
        lambda: reward_serve.run_benchmark(problems, samples, clients, batch, workers),
    )


@app.command("lake-scale")
def bench_lake_scale(
    context: typer.Context,
    iterations: Annotated[int, typer.Option(min=1, help="iterations the synthetic run writes")] = 2000,
    rollouts: Annotated[int, typer.Option(min=16, help="rollouts an iteration (groups of 16)")] = 8192,
    max_tokens: Annotated[
        int, typer.Option(min=16, help="longest response in tokens (lengths are long-tailed below it)")
    ] = 16384,
    problems: Annotated[
        int, typer.Option(min=0, help="bank size (0: four iterations' worth of groups, at least 400)")
    ] = 0,
    s3_iterations: Annotated[
        int, typer.Option(min=0, help="iterations written to a lake on moto's S3 server to count requests (0: none)")
    ] = 20,
    seed: Annotated[int, typer.Option(help="seed of the synthetic responses")] = 0,
    maintain_every: Annotated[
        int,
        typer.Option(
            min=0,
            help="run `rlvr lake maintain`'s maintenance after every "
            "this many iterations, as the scheduled deployment would (0: "
            "never)",
        ),
    ] = 10,
    retention_hours: Annotated[
        float,
        typer.Option(
            min=0,
            help="the scheduled maintenance's retention (time "
            "travel kept; the synthetic run lasts minutes, so a week's "
            "retention would keep everything)",
        ),
    ] = 0.0,
    format: FormatOption = BenchFormat.table,
    save: SaveOption = None,
) -> None:
    """What a long run's lake costs: bookkeeping per iteration as it ages, `rlvr sql` and lineage times, bytes
    against plain Parquet, S3 requests an iteration."""
    from bench import lake_scale

    measured(
        context,
        "lake-scale",
        lake_scale,
        lambda: lake_scale.run_benchmark(
            iterations, rollouts, max_tokens, problems, s3_iterations, seed, maintain_every, retention_hours
        ),
    )


@app.command("judge-guard")
def bench_judge_guard(
    context: typer.Context, format: FormatOption = BenchFormat.table, save: SaveOption = None
) -> None:
    """The judge's injection guard: benign responses it refuses and injected ones it catches (a labelled set and,
    where ../shared/datasets is present, real worked solutions), against the guard before."""
    from bench import judge_guard

    measured(context, "judge-guard", judge_guard, judge_guard.run_benchmark)


@app.command("startup")
def bench_startup(
    context: typer.Context,
    against: Annotated[
        str, typer.Option(help="the git revision to compare with (a worktree of it is made for the run)")
    ] = "7eaa8ff",
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
    base: Annotated[
        str, typer.Option(help="the commit to compare with (a git worktree of it is made for the run)")
    ] = "main",
    only: Annotated[
        Optional[list[str]],
        typer.Option(
            help="a fast benchmark to compare (repeatable) [default: "
            "advantages, verify, sandbox, train, sampling, startup]"
        ),
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, help="alternating runs of each side (median), after a warm-up")] = 3,
    threshold: Annotated[float, typer.Option(min=0, help="a slowdown past 1 + this is a regression (exit 1)")] = 0.15,
    format: FormatOption = BenchFormat.table,
) -> None:
    """The fast benchmarks on BASE's code and on this working tree, alternating in one run: exit 1 when a figure
    got slower by more than the threshold. The step before merging a change to loop code."""
    from bench.compare import PROBES, compare

    names = list(only or PROBES)
    try:
        outcome = compare(
            base, names, repeats, threshold, say=lambda line: errors.print(line, highlight=False, soft_wrap=True)
        )
    except (ValueError, RuntimeError) as error:
        fail(str(error), 2)
    if format is BenchFormat.json:
        sys.stdout.write(json.dumps(outcome) + "\n")
    else:
        print(
            f"{len(outcome['rows'])} figures compared with {outcome['base'][:7]}: "
            + (
                f"regressed past ×{1 + threshold:.2f}: {', '.join(outcome['regressed'])}"
                if outcome["regressed"]
                else f"none slower than ×{1 + threshold:.2f}"
            )
        )
    if outcome["regressed"]:
        raise typer.Exit(1)
