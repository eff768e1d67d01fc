"""`rlvr export`: the bank or a kept batch as the dataset of a trainer teams already use (TRL, verl, OpenRLHF);
`rlvr reward serve`: the verifiers as their reward server, recording what they score into the lake;
`rlvr track`: the loop's metrics and plots logged to MLflow and TensorBoard."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape

from flows.cli.common import (
    FormatOption,
    LakeOption,
    fail,
    fail_on_bad_request,
    mix_from_options,
    serve_until_interrupted,
)
from flows.display import TableFormat, console, errors, show_table, use_format

if TYPE_CHECKING:
    from storage.lake import Lake
    from tasks.interop.tracking import TrackingConfig

app = typer.Typer()
reward_app = typer.Typer(help="The platform's verifiers as other trainers' reward.", no_args_is_help=True)


class Logs(str, Enum):
    verl = "verl"
    trl = "trl"


class Trainer(str, Enum):
    verl = "verl"
    trl = "trl"
    openrlhf = "openrlhf"


@app.command("export")
def export(
    to: Annotated[
        Trainer,
        typer.Option(
            help="verl: a parquet file; trl: a `datasets` folder (load_from_disk); "
            "openrlhf: a jsonl file (--data.input_key input --data.label_key label)"
        ),
    ],
    out: Annotated[Path, typer.Option(help="where to write it (never overwritten)")],
    batch: Annotated[Optional[int], typer.Option(help="the kept batch of this iteration instead of the bank")] = None,
    n: Annotated[
        Optional[int], typer.Option("--n", min=1, help="draw this many problems by the mix (default: the whole split)")
    ] = None,
    seed: Annotated[int, typer.Option(help="seed of the draw")] = 0,
    levels: Annotated[str, typer.Option(help="level weights 1,2,3,4 in percent (with --n)")] = "20,45,30,5",
    domain_weights: Annotated[Optional[str], typer.Option(help="e.g. math=0.7,code=0.2,logic=0.1 (with --n)")] = None,
    split: Annotated[str, typer.Option(help="train or eval")] = "train",
    bank_version: Annotated[Optional[int], typer.Option(help="the bank as of this version")] = None,
    chat: Annotated[bool, typer.Option(help="trl: the prompt as chat messages (else its text)")] = True,
    lake: LakeOption = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """Write the bank (or a draw from it, or an iteration's kept batch) as a trainer's dataset; every row carries
    its problem_id, bank version, level and verifier back to the lake."""
    use_format(format)
    from storage.lake import Lake
    from tasks.interop.export import bank_selection, batch_problems, write_export

    try:
        opened = Lake.open(lake)
        if batch is not None:
            problems = batch_problems(opened, batch)
        else:
            problems = bank_selection(opened, mix_from_options(levels, domain_weights, split, bank_version, seed), n)
        written = write_export(problems, to.value, out, chat)
    except ValueError as error:
        fail_on_bad_request(error)
    show_table(
        problems.group_by("domain", "level").len("rows").sort("domain", "level"),
        title=f"{problems.height} problems exported for {to.value}",
        part="exported",
    )
    console.print(f"wrote {written}")


@reward_app.command("serve")
def reward_serve(
    run: Annotated[str, typer.Option(help="the trainer's run: its rows are the stage runs of flow external:RUN")],
    model: Annotated[str, typer.Option(help="the policy's name for requests that name none (OpenRLHF's)")] = "policy",
    trainer: Annotated[
        str, typer.Option(help="the trainer sending OpenRLHF's requests, recorded as the backend")
    ] = "openrlhf",
    rollouts_per_step: Annotated[
        int,
        typer.Option(
            min=0,
            help="OpenRLHF's rollouts a step (rollout batch size × "
            "samples per prompt): the k-th rollout stored for the run "
            "is step k // this; 0 puts all in step 0",
        ),
    ] = 0,
    iteration_offset: Annotated[
        int,
        typer.Option(
            min=0,
            help="the lake's iteration of step 0 (a restarted server "
            "numbers on from the run's stored rollouts: docs/trainers.md)",
        ),
    ] = 0,
    token_file: Annotated[
        Optional[Path],
        typer.Option(
            help="a file holding a bearer token (one line), read once at "
            "start: every route but GET /health then wants "
            "`Authorization: Bearer TOKEN` (401 otherwise)"
        ),
    ] = None,
    allow_run: Annotated[
        Optional[list[str]],
        typer.Option(
            help="a run the native route /v1/rewards may write "
            "(repeatable; --run always may): other runs are a 403. "
            "Default: any"
        ),
    ] = None,
    max_request_mb: Annotated[
        int,
        typer.Option(
            min=1,
            help="MiB a request's body may hold (413 beyond it): 128 "
            "fits OpenRLHF's one-response requests hundreds of times over and "
            "an older version's whole rollout batch of 1,024 responses of 16k "
            "tokens (about 75 MB); raise it for larger batches",
        ),
    ] = 128,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="0 picks a free port")] = 5000,
    workers: Annotated[
        int, typer.Option(min=0, help="verifier processes (0: in this process; code always runs in the sandbox)")
    ] = 2,
    item_timeout: Annotated[float, typer.Option(help="seconds one response may take to verify")] = 30.0,
    commit_interval: Annotated[
        float,
        typer.Option(
            help="seconds a group commit waits for more requests (requests that arrive while one commits go into the next anyway)"
        ),
    ] = 0.0,
    lake: LakeOption = None,
) -> None:
    """Serve the verifiers over HTTP: OpenRLHF's `POST /get_reward` and the native `POST /v1/rewards`; every
    scored response lands in the lake's rollouts and rewards before its request is answered."""
    from storage.lake import Lake, LeaseHeld
    from storage.leases import LOOP
    from tasks.interop.reward_http import MiB, RewardServer, read_token
    from tasks.interop.reward_service import RewardService
    from tasks.verification.stage import VerifyConfig

    try:
        token = None if token_file is None else read_token(token_file)
        opened = Lake.open(lake)
        service = RewardService(
            opened,
            run,
            model,
            trainer,
            VerifyConfig(workers=workers, item_timeout=item_timeout),
            rollouts_per_step,
            iteration_offset,
            commit_interval,
            allowed_runs=allow_run or None,
        )
        with opened.lease(LOOP):
            service.start()
            try:
                server = RewardServer((host, port), service, max_request_mb * MiB, token)
                console.print(
                    f"serving rewards for run {run!r} into {opened.uri} on http://{host}:{server.server_port}"
                    f" ({len(service.bank)} bank problems): POST /get_reward (OpenRLHF), POST /v1/rewards",
                    soft_wrap=True,
                )
                serve_until_interrupted(server)
            finally:
                service.close()
    except (ValueError, OSError, LeaseHeld) as error:
        fail(str(error))


@app.command("import")
def import_logs(
    kind: Annotated[
        Logs,
        typer.Argument(
            help="verl: a rollout (or validation) dump folder of <step>.jsonl; trl: a "
            "GRPOTrainer output_dir whose completions/ TRL logged"
        ),
    ],
    source: Annotated[Path, typer.Argument(help="the folder")],
    run: Annotated[str, typer.Option(help="the trainer's run: its rows are the stage runs of flow external:RUN")],
    model: Annotated[Optional[str], typer.Option(help="the policy's name (default: the trainer's)")] = None,
    iteration_offset: Annotated[int, typer.Option(min=0, help="the lake's iteration of step 0")] = 0,
    lake: LakeOption = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """Import a trainer's logged responses and rewards into the lake under its run, with lineage (files imported
    before are skipped)."""
    use_format(format)
    import polars as pl

    from storage.lake import Lake, LeaseHeld
    from storage.leases import LOOP
    from tasks.interop.imports import import_logs as run_import
    from tasks.interop.recording import ExternalRun

    try:
        opened = Lake.open(lake)
        recorder = ExternalRun(opened, run, kind.value, iteration_offset)
        with opened.lease(LOOP):
            summaries = run_import(opened, recorder, kind.value, source, model or kind.value)
    except (ValueError, OSError, LeaseHeld) as error:
        fail_on_bad_request(error)
    show_table(
        pl.DataFrame(summaries).select("file", "rollouts", "status"),
        title=f"{sum(s['rollouts'] for s in summaries)} responses imported into run {run!r}",
        part="imported",
    )


@app.command("track")
def track(
    config: Annotated[Path, typer.Option(help="YAML with a `tracking:` section (mlflow, tensorboard, plots)")] = Path(
        "configs/tracking.yaml"
    ),
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            help="keep going: a pass every --interval seconds until "
            "interrupted (Ctrl-C), beside a loop that is running",
        ),
    ] = False,
    interval: Annotated[float, typer.Option(min=0.1, help="seconds between passes with --follow")] = 30.0,
    lake: LakeOption = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """Log the loop's iteration metrics, stage times and the report's plots to MLflow and TensorBoard (step =
    iteration), each iteration once; what went where is recorded in `tracked_runs` (`rlvr lineage tracking`)."""
    use_format(format)
    import time

    from storage.config import load_yaml_config
    from storage.lake import Lake
    from tasks.interop.tracking import TrackingConfig

    try:
        settings = load_yaml_config(config, TrackingConfig, section="tracking")
        if not settings.enabled:
            fail(f"{config}: tracking is off (enable tracking.mlflow or tracking.tensorboard)", 2)
        opened = Lake.open(lake)
    except (ValueError, OSError) as error:
        fail(str(error), 2)
    try:
        while True:
            _track_once(opened, settings, follow, interval)
            if not follow:
                return
            time.sleep(interval)
    except KeyboardInterrupt:  # how --follow ends; a pass cut short is logged again next time
        return


def _track_once(opened: Lake, settings: TrackingConfig, follow: bool, interval: float) -> None:
    """One pass, shown; with --follow a tracker that refuses is a warning, and the next pass tries again."""
    from tasks.interop.trackers import track as track_pass
    from tasks.interop.tracking import TrackingError

    try:
        _show_pass(track_pass(opened, settings))
    except TrackingError as error:
        if not follow:
            fail(str(error))
        errors.print(
            f"[yellow]warning:[/yellow] {escape(str(error))} (trying again in {interval:g} s)",
            highlight=False,
            soft_wrap=True,
        )


def _show_pass(results: list[dict]) -> None:
    import polars as pl

    if not results:
        console.print("nothing to track yet: the lake holds no iteration (`rlvr run` writes them)")
        return
    table = pl.DataFrame(
        [
            {
                "tracker": row["tracker"],
                "run": row["tracker_run_id"],
                "logged": "up to date"
                if row["first_iteration"] is None
                else f"iterations {row['first_iteration']}-{row['last_iteration']}",
                "plots": row["plots"],
                "where": row["link"],
            }
            for row in results
        ]
    )
    show_table(table, title=f"tracked: lake run {results[0]['lake_run_id']}", max_width=200, part="tracked")
