"""What every `rlvr bench …` command shares: the group itself (`app`), the --format and --save options, and
`measured`, which runs a benchmark and reports, prints or saves its result."""

from __future__ import annotations

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

from flows.cli.common import fail
from flows.display import errors

app = typer.Typer(help="Benchmarks, measured as ratios on this machine.", no_args_is_help=True)


class BenchFormat(str, Enum):
    """A benchmark's report for people, or its result as one JSON object for programs."""

    table = "table"
    json = "json"


FormatOption = Annotated[
    BenchFormat,
    typer.Option(
        "--format",
        help="table: the report for people; json: one JSON object on stdout (figures, parameters, commit, "
        "date, host), the report on stderr",
    ),
]
SaveOption = Annotated[
    Optional[str],
    typer.Option(
        "--save",
        metavar="NAME",
        help="also write the JSON object to bench/results/NAME.json, where docs/benchmarks.md "
        "and the README take their figures from (python -m bench.docs)",
    ),
]


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
    from bench.results import code_state, envelope
    from bench.results import save as save_result

    parameters = {key: value for key, value in context.params.items() if key not in ("format", "save")}
    format, save = context.params["format"], context.params["save"]
    started = code_state(module.DEPENDS_ON)  # the code that runs is the code at the start
    with report_on_stderr() if format is BenchFormat.json else nullcontext():
        result = run()
    if format is BenchFormat.json or save:
        outcome = envelope(name, result, parameters, module.DEPENDS_ON, started)
        if save:
            errors.print(f"saved {save_result(outcome, save)}", highlight=False, soft_wrap=True)
        if format is BenchFormat.json:
            sys.stdout.write(json.dumps(outcome) + "\n")
    return result


def check_run_config(path: Path) -> None:
    """A run config a benchmark reads, validated before any work: an error names the file and field, exit 2."""
    from flows.run_config import load_run_config

    try:
        load_run_config(path)
    except ValueError as error:
        fail(str(error), 2)
