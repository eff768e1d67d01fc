"""`rlvr` commands of the RL iteration: the policy registry, one iteration, the advantage stage
alone, and the sampling analysis. Registered on the main app by `flows.cli`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from flows.cli import FormatOption, LakeOption, WaitOption, _prefect_defaults, app, fail, lineage_app, loop_writer
from flows.display import TableFormat, console, show_table, use_format

policy_app = typer.Typer(help="The model registry and policy servers.", no_args_is_help=True)
analyze_app = typer.Typer(help="Analyses of stored iterations.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")
app.add_typer(analyze_app, name="analyze")

NOT_RUN_SECTIONS = ("bank",)          # a run config's sections that are not RunConfig's (the curation's)
ConfigOption = Annotated[Optional[Path], typer.Option(help="run config (YAML) with rollout / dynamic_sampling / "
                                                      "verify / advantages sections")]


def iteration_config(path: Path | None, overrides: dict | None = None):
    from pydantic import ValidationError

    from tasks.curation.config import load_yaml_config
    from tasks.rollout.stage import IterationConfig

    try:
        settings = load_yaml_config(path, IterationConfig, tuple(IterationConfig.model_fields)) if path else \
            IterationConfig()
    except ValueError as error:
        fail(str(error), 2)
    for dotted, value in (overrides or {}).items():
        if value is not None:
            section, name = dotted.split(".")
            try:
                part = type(getattr(settings, section)).model_validate({**getattr(settings, section).model_dump(),
                                                                         name: value})
            except ValidationError as error:
                fail(f"--{name.replace('_', '-')} {value}: {error.errors()[0]['msg']}", 2)
            settings = settings.model_copy(update={section: part})
    return settings


def run_config(path: Path):
    """Every stage section of a run config except the bank (the curation flow's), validated."""
    from flows.run_config import RunConfig
    from tasks.curation.config import load_yaml_config, read_yaml

    try:
        unknown = sorted(set(read_yaml(Path(path))) - set(RunConfig.model_fields) - set(NOT_RUN_SECTIONS))
        if unknown:                                   # a misspelt section must not be ignored
            raise ValueError(f"{path}: unknown section(s) {', '.join(unknown)}; a run config has "
                             f"{', '.join(sorted([*RunConfig.model_fields, *NOT_RUN_SECTIONS]))}")
        return load_yaml_config(path, RunConfig, tuple(RunConfig.model_fields))
    except ValueError as error:
        fail(str(error), 2)


def run_loop(settings, iterations: int, lake: str | None) -> None:
    """Run the loop flow and print one row per iteration."""
    import polars as pl

    _prefect_defaults()
    from flows.loop import rl_loop
    from tasks.advantages.dynamic_sampling import BatchShortfall
    from tasks.rollout.openai_backend import BackendUnavailable
    from tasks.selfplay.health import CollapseDetected

    try:
        rows = rl_loop(settings.model_dump(mode="json"), iterations, lake)
    except (BatchShortfall, BackendUnavailable, CollapseDetected, ValueError, FileNotFoundError) as error:
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
    first = [] if warmup is None or any(row["iteration"] == 0 for row in rows) else [
        {**warmup, "model_version": warmup.get("trained_version", warmup.get("model_version"))}]
    frame = pl.DataFrame([{key: row.get(key) for key in ("iteration", "model_version", "groups_kept", *numbers,
                                                          "solve_rate_by_level")} for row in [*first, *rows]],
                         schema_overrides={name: pl.Float64 for name in numbers})
    return frame.select(
        "iteration", version="model_version", kept="groups_kept",
        zone=pl.col("learning_zone_share").round(2), stale=pl.col("mean_staleness").round(1),
        reward=pl.col("mean_reward").round(3),
        loss=pl.col("loss").round(3), eval=pl.col("eval_solve_rate").round(3),
        by_level=pl.col("solve_rate_by_level").map_elements(_compact_levels, return_dtype=pl.String))


def _compact_levels(text: str) -> str:
    import json

    return " ".join(f"L{level}:{rate:.2f}" for level, rate in json.loads(text or "{}").items())


@app.command()
def iterate(
    config: ConfigOption = None,
    iteration: Annotated[Optional[int], typer.Option(help="iteration number (replaces its output); default: next")] = None,
    model_version: Annotated[Optional[int], typer.Option(help="policy version to sample; default: the latest")] = None,
    groups: Annotated[Optional[int], typer.Option(help="informative groups the batch needs")] = None,
    group_size: Annotated[Optional[int], typer.Option(help="G: samples per prompt")] = None,
    verifier: Annotated[Optional[str], typer.Option(help="score with this verifier (or reward control) instead")] = None,
    lake: LakeOption = None,
    wait: WaitOption = False,
    format: FormatOption = TableFormat.table,
) -> None:
    """One RL iteration without training: rollout with dynamic sampling, verification, advantages, batch."""
    use_format(format)
    settings = iteration_config(config, {"dynamic_sampling.groups_per_batch": groups, "rollout.group_size": group_size,
                                         "verify.verifier": verifier})
    with loop_writer(lake, wait):
        _prefect_defaults()
        from flows.iteration import rl_iteration
        from tasks.advantages.dynamic_sampling import BatchShortfall
        from tasks.rollout.openai_backend import BackendUnavailable

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
        _prefect_defaults()
        from flows.iteration import compute_advantages

        try:
            result = compute_advantages(iteration, settings.model_dump(mode="json"), lake, model_version)
        except ValueError as error:
            fail(str(error))
    _print_iteration(result)


def _print_iteration(result: dict) -> None:
    import polars as pl

    rows = [("model version", result["model_version"]), ("batch", result["batch_id"]),
            ("groups kept / drawn", f"{result['groups_kept']} / {result['groups']}"),
            ("rollouts in batch", result["batch_rollouts"]),
            ("filtered share", f"{result['filtered_share']:.0%}"),
            ("learning-zone share (20-50 %)", f"{result['learning_zone_share']:.0%}"),
            ("filter reasons", ", ".join(f"{k or 'kept'}: {v}" for k, v in sorted(result["filter_reasons"].items(),
                                                                                   key=lambda kv: str(kv[0]))))]
    if "rounds" in result:
        rows[1:1] = [("generation rounds", result["rounds"]), ("rollouts", result["rollouts"]),
                     ("mean reward", f"{result['mean_reward']:.3f}")]
        if result["short_by"]:
            rows.append(("batch short by", f"{result['short_by']} groups (round bound reached)"))
    table = pl.DataFrame({"": [k for k, _ in rows], "value": [str(v) for _, v in rows]})
    show_table(table, title=f"iteration {result['iteration']}", part="iteration")
    histogram = pl.DataFrame({"solve rate": list(result["solve_rate_histogram"]),
                              "groups": list(result["solve_rate_histogram"].values())})
    show_table(histogram, title="solve-rate histogram", part="solve_rate_histogram")


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
    problems = opened.read("problems", filter=pc.field("problem_id").isin(ids), columns=["problem_id", "level", "source"])
    scored = scored.join(problems.unique("problem_id"), on="problem_id", how="left")
    table = per_problem(scored)
    if format is not TableFormat.table:                     # every problem's row, for programs
        show_table(table)
        return
    sides, zones = summary(scored, table)
    shown = table.head(limit).select(
        problem=pl.col("problem_id").str.slice(0, 10), level="level", solve="solve_rate", zone="zone",
        **{"tokens ✓": "mean_tokens_correct", "tokens ✗": "mean_tokens_incorrect", "trunc ✓": "truncated_correct",
           "trunc ✗": "truncated_incorrect", "form ✓": "form_correct", "form ✗": "form_incorrect"})
    show_table(shown.with_columns(pl.col(pl.Float64).round(2)),
               title=f"iteration {iteration}: {table.height} problems, "
                     f"{int(table['samples'].max())} samples each (first {min(limit, table.height)})")
    show_table(sides.with_columns(pl.col(pl.Float64).round(3)), title="correct vs incorrect responses")
    show_table(zones.with_columns(pl.col("share").round(3)), title="problems by zone")


@policy_app.command("init")
def policy_init(config: ConfigOption = None, lake: LakeOption = None, format: FormatOption = TableFormat.table) -> None:
    """Register model version 0 (the embedded tiny model, or the checkpoint the config names)."""
    use_format(format)
    from storage.lake import Lake
    from trainers.registry import ensure_base_policy

    settings = iteration_config(config)
    opened = Lake.open(lake)
    ensure_base_policy(opened, settings.rollout.base_policy)
    policy_list(lake, format)


@policy_app.command("list")
def policy_list(lake: LakeOption = None, format: FormatOption = TableFormat.table) -> None:
    """The registered model versions."""
    use_format(format)
    from storage.lake import Lake
    from storage.registry import versions

    table = versions(Lake.open(lake)).select("model_version", "parent_version", "kind", "checkpoint_uri", "iteration",
                                             "created_at")
    show_table(table, title="model versions")


@policy_app.command("serve")
def policy_serve(
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
    host: Annotated[str, typer.Option(help="interface to bind")] = "127.0.0.1",
    device: Annotated[str, typer.Option(help="torch device")] = "cpu",
    fail_first: Annotated[int, typer.Option(help="answer 503 to this many first requests (testing retries)")] = 0,
    on_demand: Annotated[bool, typer.Option(help="load any registered version the first time a request names it; "
                                            "--no-on-demand serves, as vLLM does, only --preload and what "
                                            "POST /v1/load_lora_adapter loaded")] = True,
    preload: Annotated[Optional[list[int]], typer.Option(help="model versions served from the start")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="sequences generated together")] = 64,
    lake: LakeOption = None,
) -> None:
    """An OpenAI-compatible completions server over the lake's model versions (served as v0, v1, ...)."""
    from tasks.rollout.server import PolicyServer, folder_loader, lake_loader, lake_versions

    try:
        server = PolicyServer((host, port), lake_loader(lake, device, batch_size), fail_first=fail_first,
                              on_demand=on_demand, load_path=folder_loader(device, batch_size),
                              preload=tuple(preload or ()),
                              list_versions=lake_versions(lake))
    except (ValueError, OSError) as error:
        fail(str(error))
    served = "every registered model version" if on_demand else \
        f"model version(s) {', '.join(map(str, preload or [])) or 'none'} and what is loaded into it"
    console.print(f"serving {served} of {lake or 'the lake'} on http://{host}:{server.server_port}/v1")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@policy_app.command("publish")
def policy_publish(
    version: Annotated[int, typer.Argument(help="the model version to load into the servers")],
    config: Annotated[Path, typer.Option(help="run config whose rollout.openai lists the servers (and publish: "
                                         "max_loras, path_map, ...)")],
    lake: LakeOption = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """Load a model version into every rollout server (vLLM's load_lora_adapter) and confirm GET /v1/models
    lists it; older versions past publish.max_loras are unloaded. Recorded in `publications`."""
    use_format(format)
    settings = run_config(config)
    if settings.rollout.backend != "openai":
        fail(f"{config}: rollout.backend is {settings.rollout.backend!r}; publishing is for the openai backend", 2)
    _prefect_defaults()
    from flows.publishing import publish_policy
    from tasks.rollout.openai_backend import BackendUnavailable

    try:
        rows = publish_policy(version, settings.rollout.model_dump(mode="json"),
                              settings.publish.model_copy(update={"enabled": True}).model_dump(mode="json"), lake)
    except (BackendUnavailable, ValueError) as error:
        fail(str(error))
    import polars as pl

    show_table(pl.DataFrame(rows).select("endpoint", "served_name", "action", "unloaded"),
               title=f"model version {version} published")


@app.command()
def train(
    iteration: Annotated[int, typer.Option(help="the iteration whose batch to train on")],
    config: Annotated[Optional[Path], typer.Option(help="run config (YAML) with a `train:` section")] = None,
    processes: Annotated[Optional[int], typer.Option(min=1, help="data-parallel training processes (gloo on "
                                                     "CPU, NCCL on GPUs) [default: the config's, else 1]")] = None,
    lake: LakeOption = None,
    wait: WaitOption = False,
    format: FormatOption = TableFormat.table,
) -> None:
    """One GRPO / DAPO step on an iteration's batch: registers the next model version."""
    use_format(format)
    from tasks.curation.config import load_yaml_config
    from trainers.grpo import TrainConfig

    try:
        settings = load_yaml_config(config, TrainConfig, section="train") if config else TrainConfig()
    except ValueError as error:
        fail(str(error), 2)
    if processes is not None:
        settings = settings.model_copy(update={"processes": processes})
    with loop_writer(lake, wait):
        _prefect_defaults()
        from flows.iteration import train_policy

        try:
            result = train_policy(iteration, settings.model_dump(mode="json"), lake)
        except (ValueError, FileNotFoundError) as error:
            fail(str(error))
    if not result["trained"]:
        console.print(f"no training step: {result['reason']}; model version stays {result['model_version']}")
        return
    import polars as pl

    shown = {k: result[k] for k in ("model_version", "batch_id", "loss", "clip_fraction", "kl", "entropy",
                                    "grad_norm", "tokens", "optimizer_steps", "global_step", "processes")}
    show_table(pl.DataFrame({"": list(shown), "value": [str(round(v, 5)) if isinstance(v, float) else str(v)
                                                        for v in shown.values()]}), title=f"iteration {iteration}: trained")


@lineage_app.command("model-version")
def lineage_model_version(version: int, lake: LakeOption = None) -> None:
    """Walk back from a model version: its parents, the batches each consumed, their rollouts, problems and runs."""
    from storage.lake import Lake
    from storage.lineage import model_version_lineage

    try:
        chain = model_version_lineage(Lake.open(lake), version)
    except ValueError as error:
        fail(str(error))
    console.print(f"[bold]lineage of model version {version}[/bold]")
    for entry in chain:
        if entry.get("missing"):
            console.print(f"version {entry['model_version']}: not in the registry")
            continue
        parent = "no parent" if entry["parent_version"] is None else f"parent {entry['parent_version']}"
        trained = f", iteration {entry['iteration']}" if entry["iteration"] is not None else ""
        console.print(f"version {entry['model_version']} ({entry['kind']}, {parent}{trained}), run {entry['run_id']}")
        console.print(f"  checkpoint    {entry['checkpoint_uri']}")
        for batch_id in entry.get("replaced_batches", []):
            console.print(f"  batch         {batch_id}: no longer in `batches` (the iteration's advantages were "
                          "re-run since; `rlvr sql --as-of` shows it as it was)")
        for batch_id in [] if entry.get("replaced_batches") else entry["batch_ids"] or []:
            console.print(f"  batch         {batch_id}: {entry.get('rollouts', 0)} rollouts of "
                          f"{entry.get('problems', 0)} problems, sampled by version(s) "
                          f"{', '.join(map(str, entry.get('sampled_by', [])))}, bank version(s) "
                          f"{', '.join(map(str, entry.get('bank_versions', [])))}")
        if entry.get("runs"):
            console.print(f"  stage runs    {', '.join(entry['runs'])}")
