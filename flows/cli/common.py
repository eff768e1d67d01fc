"""What every command group shares: the common options, one-line errors, the `loop` lease a writing command
holds, Prefect's quiet defaults, and reading run configs. Imports no command group."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from flows.display import TableFormat, errors

LakeOption = Annotated[
    Optional[str],
    typer.Option("--lake", envvar="RLVR_LAKE", help="lake location: a folder or s3://bucket/prefix [default: ./lake]"),
]
FormatOption = Annotated[
    TableFormat,
    typer.Option(
        "--format",
        help="table for people; csv or json (JSON lines) for programs: then stdout holds only the rows, "
        "and notes go to stderr",
    ),
]
WaitOption = Annotated[
    bool,
    typer.Option(
        "--wait",
        help="queue behind another writer of this lake instead of being "
        "refused (one process writes iterations at a time)",
    ),
]
ConfigOption = Annotated[
    Optional[Path],
    typer.Option(help="run config (YAML) with rollout / dynamic_sampling / verify / advantages sections"),
]


def fail(message: str, code: int = 1) -> None:
    errors.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def serve_until_interrupted(server) -> None:
    """Serve an HTTP server until Ctrl-C, then close its socket."""
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def fail_on_bad_request(error: ValueError) -> None:
    """Exit 2 with the error's first line, or with all of a config validation's lines (each names a field)."""
    text = str(error)
    fail(text if "validation error" in text else text.splitlines()[0], 2)


def mix_from_options(levels: str, domain_weights: str | None, split: str, bank_version: int | None, seed: int):
    """A training mix (`MixConfig`) from the command line's --levels 20,45,30,5 and --domain-weights math=0.7,...;
    a bad value raises ValueError naming it."""
    from tasks.curation.config import MixConfig
    from tasks.curation.inputs import parse_weights

    try:
        level_weights = {i + 1: float(w) for i, w in enumerate(levels.split(","))}
    except ValueError:
        raise ValueError(
            f"--levels {levels!r}: give the weights of levels 1,2,3,4 in percent, e.g. 20,45,30,5"
        ) from None
    return MixConfig(
        level_weights=level_weights,
        domain_weights=parse_weights(domain_weights),
        split=split,
        bank_version=bank_version,
        seed=seed,
    )


@contextmanager
def loop_writer(lake: str | None, wait: bool) -> Iterator[None]:
    """Hold the lake's `loop` lease for the whole command, taken before any orchestration starts: a second
    writer is refused at once with one line naming the holder, or waits with --wait. The command's flows
    re-enter it."""
    from storage.lake import Lake, LeaseHeld
    from storage.leases import LOOP

    opened = Lake.open(lake)
    held = opened.lease(LOOP)
    try:
        held.__enter__()
    except LeaseHeld as error:
        if not wait:
            fail(str(error))
        errors.print(
            f"[dim]waiting: {escape(str(error).split(': one writer')[0])}[/dim]", highlight=False, soft_wrap=True
        )
        held = opened.lease(LOOP, wait=True)
        held.__enter__()
    try:
        yield
    finally:
        held.__exit__(None, None, None)


class _OneLineErrors(logging.Filter):
    """Prefect logs a failed run's traceback; at the command line the error line says it (RLVR_DEBUG=1 keeps them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text = None, None
        return True


_COMMAND_CONTEXT = ExitStack()


def prefect_defaults() -> None:
    """Before a command's first flow: quiet defaults, and an API to report to (`flows/orchestration.py`:
    PREFECT_API_URL, else a temporary server that dies with this command)."""
    from flows.orchestration import OrchestrationUnavailable, ensure_api

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    try:
        ensure_api()
    except OrchestrationUnavailable as error:
        fail(str(error))
    from flows.policies import without_flow_heartbeats

    _COMMAND_CONTEXT.enter_context(without_flow_heartbeats())  # for the whole command (see policies.py)
    if not os.environ.get("RLVR_DEBUG"):
        for name in ("prefect.flow_runs", "prefect.task_runs"):
            logging.getLogger(name).addFilter(_OneLineErrors())


def iteration_config(path: Path | None, overrides: dict | None = None):
    from pydantic import ValidationError

    from storage.config import load_yaml_config
    from tasks.iteration import IterationConfig

    try:
        settings = (
            load_yaml_config(path, IterationConfig, tuple(IterationConfig.model_fields)) if path else IterationConfig()
        )
    except ValueError as error:
        fail(str(error), 2)
    for dotted, value in (overrides or {}).items():
        if value is not None:
            section, name = dotted.split(".")
            try:
                part = type(getattr(settings, section)).model_validate(
                    {**getattr(settings, section).model_dump(), name: value}
                )
            except ValidationError as error:
                fail(f"--{name.replace('_', '-')} {value}: {error.errors()[0]['msg']}", 2)
            settings = settings.model_copy(update={section: part})
    return settings


def run_config(path: Path):
    """Every stage section of a run config except the bank (the curation flow's), validated; an error exits 2."""
    from flows.run_config import load_run_config

    try:
        return load_run_config(path)
    except ValueError as error:
        fail(str(error), 2)
