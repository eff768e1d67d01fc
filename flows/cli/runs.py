"""`rlvr run`, `rlvr iterate`, `rlvr advantages`, `rlvr train` and `rlvr analyze …`: the main job, one
iteration or one of its stages by hand, and the analysis of a stored iteration."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from flows.cli.bank import curate_and_print, print_bank_stats
from flows.cli.common import (
    ConfigOption,
    FormatOption,
    LakeOption,
    WaitOption,
    fail,
    iteration_config,
    loop_writer,
    prefect_defaults,
)
from flows.display import TableFormat, console, show_table, use_format

app = typer.Typer()


@app.command()
def run(
    config: Annotated[Path, typer.Option(help="run config (YAML)")] = Path("configs/demo.yaml"),
    iterations: Annotated[
        Optional[int],
        typer.Option(
            min=0,
            help="RL iterations the lake should hold; a run "
            "resumes after the last recorded one [default: "
            "the config's loop.iterations]",
        ),
    ] = None,
    lake: LakeOption = None,
    wait: WaitOption = False,
    documents: Annotated[
        Optional[Path],
        typer.Option(
            help="SPICE: a corpus (JSONL, text, or a folder of "
            "them) self-play's challenger reads (sets selfplay.documents)"
        ),
    ] = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """The main job: curate the config's bank (unless done before), then run the RL loop, resuming where the lake is."""
    use_format(format)
    from flows.loop_state import nothing_left
    from flows.run_config import load_run_configs
    from storage.lake import Lake
    from tasks.curation.stage import identical_curation

    try:
        curation, settings = load_run_configs(config)
    except ValueError as error:
        fail(str(error), 2)
    if documents is not None:
        from tasks.proposals.documents import read_documents

        try:
            corpus = read_documents(documents)  # a bad corpus fails here, naming its file and line
        except ValueError as error:
            fail(str(error), 2)
        unlicensed = sum(document.licence is None for document in corpus)
        unread = sum(document.licence_unread for document in corpus)
        console.print(
            f"[dim]{len(corpus)} documents from {documents}"
            + (f"; {unlicensed} with no licence found (no LICENSE file beside them)" if unlicensed else "")
            + (f"; {unread} whose licence file's text is not a licence it knows" if unread else "")
            + "[/dim]"
        )
        settings.selfplay.documents = str(documents.resolve())
    opened = Lake.open(lake)
    with loop_writer(lake, wait):
        previous = identical_curation(opened, curation)
        if previous is not None:
            console.print(
                f"[dim]bank version {previous['bank_version']} was curated from this config by run "
                f"{previous['run_id']}; skipping curation[/dim]"
            )
        else:
            curate_and_print(curation, lake)
        count = settings.loop.iterations if iterations is None else iterations
        if count == 0:
            print_bank_stats(opened, None)
            return
        if nothing_left(opened, count, settings.warmup.enabled):  # no orchestration needed
            console.print(f"nothing to do: the lake already holds {count} iteration(s) (raise --iterations to go on)")
            return
        run_loop(settings, count, lake)


@app.command()
def iterate(
    config: ConfigOption = None,
    iteration: Annotated[
        Optional[int], typer.Option(help="iteration number (replaces its output); default: next")
    ] = None,
    model_version: Annotated[Optional[int], typer.Option(help="policy version to sample; default: the latest")] = None,
    groups: Annotated[Optional[int], typer.Option(help="informative groups the batch needs")] = None,
    group_size: Annotated[Optional[int], typer.Option(help="G: samples per prompt")] = None,
    verifier: Annotated[
        Optional[str], typer.Option(help="score with this verifier (or reward control) instead")
    ] = None,
    lake: LakeOption = None,
    wait: WaitOption = False,
    format: FormatOption = TableFormat.table,
) -> None:
    """One RL iteration without training: rollout with dynamic sampling, verification, advantages, batch."""
    use_format(format)
    settings = iteration_config(
        config,
        {"dynamic_sampling.groups_per_batch": groups, "rollout.group_size": group_size, "verify.verifier": verifier},
    )
    with loop_writer(lake, wait):
        prefect_defaults()
        from flows.iteration import rl_iteration
        from policy.openai_backend import BackendUnavailable
        from tasks.sampling.rounds import BatchShortfall

        try:
            result = rl_iteration(settings.model_dump(mode="json"), iteration, lake, model_version)
        except (BatchShortfall, BackendUnavailable, ValueError, FileNotFoundError) as error:
            fail(str(error))
    _print_iteration(result)


@app.command()
def advantages(
    iteration: Annotated[int, typer.Option(help="the iteration whose stored rollouts and rewards to use")],
    config: ConfigOption = None,
    estimator: Annotated[Optional[str], typer.Option(help="grpo, dr_grpo, rloo, batch_std or dbb")] = None,
    model_version: Annotated[Optional[int], typer.Option(help="current policy version, for staleness")] = None,
    lake: LakeOption = None,
    wait: WaitOption = False,
    format: FormatOption = TableFormat.table,
) -> None:
    """Re-run the advantage stage of an iteration: groups, advantages, batch and DBB state are replaced."""
    use_format(format)
    settings = iteration_config(config, {"advantages.estimator": estimator})
    with loop_writer(lake, wait):
        prefect_defaults()
        from flows.iteration import compute_advantages

        try:
            result = compute_advantages(iteration, settings.model_dump(mode="json"), lake, model_version)
        except ValueError as error:
            fail(str(error))
    _print_iteration(result)


@app.command()
def train(
    iteration: Annotated[int, typer.Option(help="the iteration whose batch to train on")],
    config: Annotated[Optional[Path], typer.Option(help="run config (YAML) with a `train:` section")] = None,
    processes: Annotated[
        Optional[int],
        typer.Option(
            min=1, help="trainer ranks on torch.distributed (gloo on CPU, NCCL on GPUs) [default: the config's, else 1]"
        ),
    ] = None,
    strategy: Annotated[
        Optional[str], typer.Option(help="single, ddp or fsdp [default: the config's; ddp with --processes 2 or more]")
    ] = None,
    lake: LakeOption = None,
    wait: WaitOption = False,
    format: FormatOption = TableFormat.table,
) -> None:
    """One GRPO / DAPO step on an iteration's batch: registers the next model version."""
    use_format(format)
    from storage.config import load_yaml_config
    from trainers.grpo import TrainConfig

    try:
        settings = load_yaml_config(config, TrainConfig, section="train") if config else TrainConfig()
    except ValueError as error:
        fail(str(error), 2)
    if processes is not None or strategy is not None:
        try:
            settings = TrainConfig.model_validate(
                {
                    **settings.model_dump(),
                    **({"processes": processes} if processes else {}),
                    **({"strategy": strategy} if strategy else {}),
                }
            )
        except ValueError as error:
            fail(str(error), 2)
    with loop_writer(lake, wait):
        prefect_defaults()
        from flows.iteration import train_policy
        from trainers.workers import RankFailed

        try:
            result = train_policy(iteration, settings.model_dump(mode="json"), lake)
        except (ValueError, FileNotFoundError, RankFailed) as error:
            fail(str(error))
    if not result["trained"]:
        console.print(f"no training step: {result['reason']}; model version stays {result['model_version']}")
        return
    import polars as pl

    shown = {
        k: result[k]
        for k in (
            "model_version",
            "batch_id",
            "loss",
            "clip_fraction",
            "kl",
            "entropy",
            "grad_norm",
            "tokens",
            "optimizer_steps",
            "global_step",
            "processes",
        )
    }
    show_table(
        pl.DataFrame(
            {"": list(shown), "value": [str(round(v, 5)) if isinstance(v, float) else str(v) for v in shown.values()]}
        ),
        title=f"iteration {iteration}: trained",
    )


def run_loop(settings, iterations: int, lake: str | None) -> None:
    """Run the loop flow and print one row per iteration."""

    prefect_defaults()
    from flows.loop import rl_loop
    from policy.openai_backend import BackendUnavailable
    from tasks.sampling.rounds import BatchShortfall
    from tasks.selfplay.health import CollapseDetected
    from trainers.workers import RankFailed

    try:
        rows = rl_loop(settings.model_dump(mode="json"), iterations, lake)
    except (BatchShortfall, BackendUnavailable, CollapseDetected, RankFailed, ValueError, FileNotFoundError) as error:
        fail(str(error))
    if not rows:
        console.print(f"nothing to do: the lake already holds {iterations} iteration(s) (raise --iterations to go on)")
        return
    from storage.lake import Lake

    table = loop_table(rows, warmup_row(Lake.open(lake)))
    show_table(table, title="RL loop (SQL: select * from iteration_metrics)", part="loop")


def warmup_row(lake) -> dict | None:
    """Iteration 0 of `iteration_metrics`: the warm-up version and its held-out solve rate, where there is one."""
    import pyarrow.compute as pc

    if not lake.exists("iteration_metrics"):
        return None
    start = lake.read("iteration_metrics", filter=pc.field("iteration") == 0)
    return None if start.is_empty() else start.row(0, named=True)


def loop_table(rows: list[dict], warmup: dict | None = None):
    """One row per iteration of this run, after the warm-up's row (iteration 0, its version the warm-up's)."""
    import polars as pl

    numbers = ["learning_zone_share", "mean_reward", "loss", "eval_solve_rate", "mean_staleness"]
    first = (
        []
        if warmup is None or any(row["iteration"] == 0 for row in rows)
        else [{**warmup, "model_version": warmup.get("trained_version", warmup.get("model_version"))}]
    )
    frame = pl.DataFrame(
        [
            {
                key: row.get(key)
                for key in ("iteration", "model_version", "groups_kept", *numbers, "solve_rate_by_level")
            }
            for row in [*first, *rows]
        ],
        schema_overrides={name: pl.Float64 for name in numbers},
    )
    return frame.select(
        "iteration",
        version="model_version",
        kept="groups_kept",
        zone=pl.col("learning_zone_share").round(2),
        stale=pl.col("mean_staleness").round(1),
        reward=pl.col("mean_reward").round(3),
        loss=pl.col("loss").round(3),
        eval=pl.col("eval_solve_rate").round(3),
        by_level=pl.col("solve_rate_by_level").map_elements(_compact_levels, return_dtype=pl.String),
    )


def _compact_levels(text: str) -> str:
    import json

    return " ".join(f"L{level}:{rate:.2f}" for level, rate in json.loads(text or "{}").items())


def _print_iteration(result: dict) -> None:
    import polars as pl

    rows = [
        ("model version", result["model_version"]),
        ("batch", result["batch_id"]),
        ("groups kept / drawn", f"{result['groups_kept']} / {result['groups']}"),
        ("rollouts in batch", result["batch_rollouts"]),
        ("filtered share", f"{result['filtered_share']:.0%}"),
        ("learning-zone share (20-50 %)", f"{result['learning_zone_share']:.0%}"),
        (
            "filter reasons",
            ", ".join(
                f"{k or 'kept'}: {v}" for k, v in sorted(result["filter_reasons"].items(), key=lambda kv: str(kv[0]))
            ),
        ),
    ]
    if "rounds" in result:
        rows[1:1] = [
            ("generation rounds", result["rounds"]),
            ("rollouts", result["rollouts"]),
            ("mean reward", f"{result['mean_reward']:.3f}"),
        ]
        if result["short_by"]:
            rows.append(("batch short by", f"{result['short_by']} groups (round bound reached)"))
    table = pl.DataFrame({"": [k for k, _ in rows], "value": [str(v) for _, v in rows]})
    show_table(table, title=f"iteration {result['iteration']}", part="iteration")
    histogram = pl.DataFrame(
        {"solve rate": list(result["solve_rate_histogram"]), "groups": list(result["solve_rate_histogram"].values())}
    )
    show_table(histogram, title="solve-rate histogram", part="solve_rate_histogram")


analyze_app = typer.Typer(help="Analyses of stored iterations.", no_args_is_help=True)


@analyze_app.command("sampling")
def analyze_sampling(
    iteration: Annotated[int, typer.Option(help="the iteration to analyse")],
    verifier: Annotated[Optional[str], typer.Option(help="whose rewards; default each problem's own verifier")] = None,
    limit: Annotated[int, typer.Option(help="problems shown in the table (all with --format csv/json)")] = 20,
    format: FormatOption = TableFormat.table,
    lake: LakeOption = None,
) -> None:
    """Per problem: solve rate of its G samples, correct vs incorrect (length, truncation, answer form), zone."""
    use_format(format)
    import polars as pl
    import pyarrow.compute as pc

    from storage.lake import Lake
    from tasks.advantages.stage import scored_rollouts
    from tasks.analysis.sampling import per_problem, summary

    opened = Lake.open(lake)
    try:
        scored = scored_rollouts(opened, iteration, verifier, extra=("response",))
    except ValueError as error:
        fail(str(error))
    ids = scored["problem_id"].unique().to_list()
    problems = opened.read(
        "problems", filter=pc.field("problem_id").isin(ids), columns=["problem_id", "level", "source"]
    )
    scored = scored.join(problems.unique("problem_id"), on="problem_id", how="left")
    table = per_problem(scored)
    if format is not TableFormat.table:  # every problem's row, for programs
        show_table(table)
        return
    sides, zones = summary(scored, table)
    shown = table.head(limit).select(
        problem=pl.col("problem_id").str.slice(0, 10),
        level="level",
        solve="solve_rate",
        zone="zone",
        **{
            "tokens ✓": "mean_tokens_correct",
            "tokens ✗": "mean_tokens_incorrect",
            "trunc ✓": "truncated_correct",
            "trunc ✗": "truncated_incorrect",
            "form ✓": "form_correct",
            "form ✗": "form_incorrect",
        },
    )
    show_table(
        shown.with_columns(pl.col(pl.Float64).round(2)),
        title=f"iteration {iteration}: {table.height} problems, "
        f"{int(table['samples'].max())} samples each (first {min(limit, table.height)})",
    )
    show_table(sides.with_columns(pl.col(pl.Float64).round(3)), title="correct vs incorrect responses")
    show_table(zones.with_columns(pl.col("share").round(3)), title="problems by zone")


@analyze_app.command("mismatch")
def analyze_mismatch(
    iteration: Annotated[Optional[int], typer.Option(help="the iteration; default every trained one")] = None,
    low: Annotated[Optional[float], typer.Option(help="lower ratio bound for every mode; default each mode's")] = None,
    high: Annotated[Optional[float], typer.Option(help="upper ratio bound for every mode; default each mode's")] = None,
    format: FormatOption = TableFormat.table,
    lake: LakeOption = None,
) -> None:
    """The sampler-trainer gap of the trained rollouts, and what each rollout correction would keep and weight at
    these bounds, from the stored `mismatch` rows alone (nothing is re-run)."""
    use_format(format)
    import pyarrow.compute as pc

    from storage.lake import Lake
    from trainers.mismatch import MODES, what_each_mode_keeps

    opened = Lake.open(lake)
    figures = ["mean_abs_delta", "max_abs_delta", "kl_k3", "outside_share", "sequence_log_ratio"]
    rows = opened.read(
        "mismatch",
        filter=None if iteration is None else pc.field("iteration") == iteration,
        columns=[*figures, "log_ratio"],
    )
    if rows.is_empty():
        fail(f"no mismatch rows{'' if iteration is None else f' for iteration {iteration}'} in {opened.uri}")
    show_table(
        rows.select(figures).describe(), title=f"{rows.height} trained rollouts: per-rollout gap", part="figures"
    )
    modes = what_each_mode_keeps(rows["log_ratio"], {mode: (low, high) for mode in MODES})
    show_table(modes, title="each correction at its bounds", part="modes")
