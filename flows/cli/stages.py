"""`rlvr stage` and `rlvr evaluate`: re-running one stage of stored iterations (unchanged stages skipped), and
evaluating a model version on the held-out set."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from flows.cli.common import FormatOption, LakeOption, WaitOption, fail, loop_writer, prefect_defaults
from flows.display import TableFormat, console, show_table, use_format

app = typer.Typer()


def parse_iterations(specs: list[str]) -> list[int]:
    """`3`, `3,5` and `5-7` (repeatable) as a sorted list of iterations."""
    iterations: set[int] = set()
    for part in (p.strip() for spec in specs for p in spec.split(",")):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise ValueError(f"--iteration {part!r}: give a number, a range like 3-7, or a list like 1,4")
        first, last = int(match[1]), int(match[2] or match[1])
        if last < first:
            raise ValueError(f"--iteration {part!r}: the range runs backwards")
        iterations.update(range(first, last + 1))
    return sorted(iterations)


def stage_overrides(path: Path | None) -> dict:
    """The stage sections a config file sets, validated, as given (so they override only what they name). The
    sections come from the typed configs (flows/stage_plans.py), imported here, not as the command line starts."""
    if path is None:
        return {}
    from flows.run_config import RunConfig
    from flows.stage_plans import STAGE_SECTIONS
    from storage.config import read_yaml, validated_config

    data = read_yaml(path)
    validated_config(data, path, RunConfig, STAGE_SECTIONS)  # errors name the file and the field
    return {section: data[section] for section in STAGE_SECTIONS if section in data}


@app.command()
def stage(
    name: Annotated[str, typer.Argument(help="rollout, verify, advantages, train or evaluate")],
    iteration: Annotated[list[str], typer.Option("--iteration", help="iteration(s): 3, 3-7 or 1,4 (repeatable)")],
    config: Annotated[
        Optional[Path],
        typer.Option(help="run config whose stage sections override the ones the iteration last ran with"),
    ] = None,
    downstream: Annotated[bool, typer.Option(help="also re-run every later stage (up to --through)")] = False,
    through: Annotated[Optional[str], typer.Option(help="with --downstream, the last stage to run")] = None,
    force: Annotated[bool, typer.Option(help="run even when inputs, config and code are unchanged")] = False,
    verifier: Annotated[
        Optional[str],
        typer.Option(
            help="re-score with this verifier: verify scores the rollouts "
            "with it, evaluate re-scores the stored held-out responses "
            "(sampling nothing)"
        ),
    ] = None,
    lake: LakeOption = None,
    wait: WaitOption = False,
    format: FormatOption = TableFormat.table,
) -> None:
    """Re-run one stage of an iteration, replacing exactly its output; unchanged stages are skipped."""
    use_format(format)
    try:
        iterations = parse_iterations(iteration)
        overrides = stage_overrides(config)
        if verifier is not None:
            from storage.config import merged_config

            section = "evaluation" if name == "evaluate" else "verify"
            overrides = merged_config(overrides, {section: {"verifier": verifier}})
        from flows.stage_plans import stage_chain

        stage_chain(name, downstream, through)
    except ValueError as error:
        fail(str(error), 2)
    from flows.stage_plans import skipped_chain
    from storage.lake import Lake

    with loop_writer(lake, wait):
        summaries, pending = [], []
        for number in iterations:  # unchanged stages are skipped here, with no orchestration
            skipped = None if force else skipped_chain(Lake.open(lake), name, number, overrides, downstream, through)
            summaries += skipped or []
            pending += [] if skipped else [number]
        if pending:
            prefect_defaults()
            from flows.stages import rerun_stage
            from policy.openai_backend import BackendUnavailable
            from tasks.sampling.rounds import BatchShortfall

        for number in pending:
            try:
                summaries += rerun_stage(name, number, overrides, downstream, force, lake, through)
            except (BatchShortfall, BackendUnavailable, ValueError, FileNotFoundError) as error:
                _print_stages(summaries)
                fail(f"iteration {number}: {error}")
    _print_stages(sorted(summaries, key=lambda s: s.get("iteration") or 0))


def _print_stages(summaries: list[dict]) -> None:
    import polars as pl

    if not summaries:
        return
    rows = [
        {
            "iteration": s.get("iteration"),
            "stage": s["stage"],
            "outcome": "skipped" if s.get("skipped") else "ran",
            "run": s.get("run_id"),
            "output_of_run": s.get("same_as") or s.get("run_id"),
            "result": _result_of(s),
        }
        for s in summaries
    ]
    show_table(pl.DataFrame(rows), title="stages (SQL: select * from runs order by started_at)")


def _result_of(summary: dict) -> str:
    if summary.get("skipped"):
        version = summary.get("model_version")
        return "" if version is None else f"model version {version}"
    if summary["stage"] == "verify":
        return "; ".join(
            f"{v['verifier']} {v['verifier_version']}: mean reward {v['mean_reward']:.3f}"
            for v in summary.get("verifiers", [])
        )
    if summary["stage"] in ("advantages", "rollout"):
        return f"{summary['groups_kept']} of {summary['groups']} groups kept, batch {summary['batch_id']}"
    if summary["stage"] == "train":
        return (
            f"model version {summary['model_version']}"
            if summary.get("trained")
            else f"no step ({summary.get('reason')})"
        )
    return f"model version {summary['model_version']}: held-out solve rate {summary['solve_rate']:.1%}"


@app.command()
def evaluate(
    model_version: Annotated[Optional[int], typer.Option(help="version to evaluate; default: the latest")] = None,
    config: Annotated[
        Optional[Path],
        typer.Option(
            help="run config whose evaluation / rollout / verify sections override the lake's last recorded ones"
        ),
    ] = None,
    force: Annotated[bool, typer.Option(help="evaluate even when an identical evaluation is in place")] = False,
    k: Annotated[
        Optional[int], typer.Option("--k", min=1, help="also report pass@k (samples per problem are raised to k)")
    ] = None,
    verifier: Annotated[
        Optional[str],
        typer.Option(
            help="re-score the version's stored held-out responses with this verifier instead of sampling new ones"
        ),
    ] = None,
    lake: LakeOption = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """Held-out solve rate (pass@1) and pass@k of a model version per source and level (replaces that version's
    evaluation; every response is kept in eval_rollouts).

    Settings are the lake's last recorded ones, overridden by the sections of --config, then --k and --verifier."""
    use_format(format)
    import polars as pl

    from flows.run_config import EvaluationRunConfig
    from flows.stage_plans import evaluate_key, iteration_of_version, recorded_config, skip_if_in_place
    from storage.config import merged_config
    from storage.lake import Lake
    from storage.registry import latest_version

    opened = Lake.open(lake)
    try:
        settings = merged_config(recorded_config(opened), stage_overrides(config))
        flags = {name: value for name, value in (("k", k), ("verifier", verifier)) if value is not None}
        if flags:
            settings = merged_config(settings, {"evaluation": flags})
        settings = EvaluationRunConfig.model_validate(
            {name: value for name, value in settings.items() if name in EvaluationRunConfig.model_fields}
        )
    except ValueError as error:
        fail(str(error), 2)
    version = model_version if model_version is not None else latest_version(opened)
    skipped = (
        None
        if version is None
        else skip_if_in_place(
            opened, evaluate_key(opened, settings, version), iteration_of_version(opened, version), force
        )
    )
    if skipped is not None:  # in place: no orchestration needed
        result = {**skipped, "model_version": version}
    else:
        prefect_defaults()
        from flows.evaluation import evaluate_model

        try:
            result = evaluate_model(model_version, settings.model_dump(mode="json"), lake, force=force)
        except ValueError as error:
            fail(str(error))
    if result.get("skipped"):
        console.print(
            f"model version {result['model_version']}: skipped, the evaluation of run "
            f"{escape(result['same_as'])} is in place (--force to re-run)"
        )
        return
    table = pl.DataFrame(result["by_source_level"]).with_columns(pl.col("solve_rate", "pass_at_k").round(3))
    table = (
        table.rename({"solve_rate": "pass@1", "pass_at_k": f"pass@{result['k']}"})
        if result["k"] > 1
        else table.drop("pass_at_k").rename({"solve_rate": "pass@1"})
    )
    pass_k = f", pass@{result['k']} {result['pass_at_k']:.1%}" if result["k"] > 1 else ""
    show_table(
        table,
        title=f"model version {result['model_version']}: held-out pass@1 "
        f"{result['solve_rate']:.1%}{pass_k} (SQL: select * from evaluations)",
    )
