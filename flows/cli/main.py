"""The root of the `rlvr` command tree: global options, and the command groups assembled in one place.

Each group is a module of its own that never imports this one. Groups from a higher floor (the benchmarks)
plug in through the `rlvr.commands` entry points declared in pyproject.toml, so the command line's floor
never imports them; a benchmark's code is imported only when its command runs."""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points
from typing import Annotated

import typer
from rich.markup import escape

from flows.cli import bank, interop, lake, policy, report, runs, serving, stages, verify
from flows.display import console, errors, use_format

app = typer.Typer(
    help="RLVR data platform: problem bank, rollouts, verifiers, advantages, GRPO/DAPO.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

GROUPS = (  # (module, name): a name makes a sub-command group (`rlvr bank stats`), None adds its commands at the top
    (bank.app, None),
    (runs.app, None),
    (lake.app, None),
    (verify.app, None),
    (stages.app, None),
    (serving.app, None),
    (report.app, None),
    (interop.app, None),
    (bank.bank_app, "bank"),
    (lake.lineage_app, "lineage"),
    (policy.app, "policy"),
    (runs.analyze_app, "analyze"),
    (interop.reward_app, "reward"),
    (lake.lake_app, "lake"),
)
for group, name in GROUPS:
    app.add_typer(group, name=name)
for plugged in entry_points(group="rlvr.commands"):  # `rlvr bench ...` (bench/cli.py)
    app.add_typer(plugged.load(), name=plugged.name)


def _flags_show_no_type() -> None:
    """Typer 0.29's help prints `<bool>` after every flag, as if it took a value; a flag takes none."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich
    TyperOption.display_type_rich = lambda option, ctx: None if option.is_flag else shown(option, ctx)


_flags_show_no_type()


def _print_version(wanted: bool) -> None:
    if wanted:
        from importlib.metadata import version

        console.print(f"rlvr {version('rlvr-platform')}")
        raise typer.Exit()


@app.callback()
def main_options(
    insecure_sandbox: Annotated[
        bool,
        typer.Option(
            "--insecure-sandbox",
            help="run model-generated code with resource limits only where this host offers no "
            "isolation (no root, no user namespaces); recorded on every code reward",
        ),
    ] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """RLVR data platform: problem bank, rollouts, verifiers, advantages, GRPO/DAPO."""
    use_format()  # tables for people unless the command says --format
    if insecure_sandbox:
        from tasks.sandbox.client import INSECURE_ENV, isolation_mode

        os.environ[INSECURE_ENV] = "1"  # verification workers inherit it
        if isolation_mode() == "rlimits":
            errors.print(
                "[bold red]WARNING: --insecure-sandbox: model-generated code will run WITHOUT isolation, "
                "as this user, with resource limits only. It can read and change this user's files and "
                "processes. Every code reward records it.[/bold red]",
                highlight=False,
                soft_wrap=True,
            )


def main() -> None:
    """The console entry point: errors the user can act on are one line, never a traceback."""
    from deltalake.exceptions import DeltaError

    from storage.lake import LakeError
    from tasks.errors import VerifierUnavailable

    try:
        app(prog_name="rlvr")
    except (LakeError, DeltaError, OSError, ValueError, VerifierUnavailable) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        errors.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False, soft_wrap=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
