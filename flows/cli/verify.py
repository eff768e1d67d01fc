"""`rlvr verify-file`, `rlvr verify` and `rlvr audit-verifier`: scoring a file without a lake, re-scoring an
iteration's rollouts, and estimating a verifier's error rates."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from flows.cli.common import FormatOption, LakeOption, WaitOption, fail, loop_writer, prefect_defaults
from flows.display import TableFormat, console, errors, show_table, use_format

app = typer.Typer()


@app.command("verify-file")
def verify_file(
    input_path: Annotated[
        Path, typer.Argument(metavar="IN.jsonl", help="lines with id, domain, response, ground_truth / tests")
    ],
    output_path: Annotated[Path, typer.Argument(metavar="OUT.jsonl", help="where the scored lines go")],
    workers: Annotated[int, typer.Option(min=0, help="worker processes (0: score in this process)")] = 2,
    verifier: Annotated[
        Optional[str], typer.Option(help="score every line with this verifier (e.g. process, random)")
    ] = None,
    item_timeout: Annotated[
        float, typer.Option(min=1, help="seconds one item may take before its worker is killed")
    ] = 30.0,
    partial_credit: Annotated[
        str, typer.Option(help="code rewards: fraction, half (all 1, some 0.5) or all_pass (1 or 0)")
    ] = "fraction",
    process_weight: Annotated[float, typer.Option(help="λ of the process verifier: (1-λ)·outcome + λ·process")] = 0.5,
    max_line_bytes: Annotated[int, typer.Option(min=1, help="longer lines are skipped unread")] = 16 * 1024 * 1024,
    max_response_chars: Annotated[int, typer.Option(min=1, help="longer responses score 0 (too long)")] = 200_000,
) -> None:
    """Score a JSONL file of responses (math, code, logic, qa) without a lake. Exit code 3: some lines could not
    be used (each reported with its number and reason); every other line was scored."""
    import json

    from rich.progress import Progress

    from tasks.verification.engine import VerifierPool

    if verifier is not None:
        from tasks.verification.registry import build_verifier

        build_verifier(verifier)  # an unknown name fails here, before any work
    items, bad = _verify_lines(input_path, max_line_bytes)
    if verifier is not None:
        items = [(problem, response, verifier) for problem, response, _ in items]
    from tasks.verifiers.process import warn_low_process_weight

    warn_low_process_weight(process_weight)  # here, once: not in every worker
    options = {
        "code": {"partial_credit": partial_credit},
        "workspace": {"partial_credit": partial_credit},
        "process": {"process_weight": process_weight},
    }
    pool = VerifierPool(
        workers=workers, item_timeout=item_timeout, options=options, max_response_chars=max_response_chars
    )
    waiting: dict[int, dict] = {}
    next_index, correct = 0, 0
    with output_path.open("w") as out, Progress(console=errors, transient=True) as progress:
        bar = progress.add_task("verifying", total=len(items))
        for scored in pool.score(items):
            correct += bool(scored.correct)
            waiting[scored.index] = {
                "id": items[scored.index][0]["id"],
                "reward": scored.reward,
                "correct": scored.correct,
                "verifier": scored.verifier,
                "verifier_version": scored.verifier_version,
                "details": {**scored.details, "format_reward": scored.format_reward},
            }
            while next_index in waiting:  # keep the input's order
                out.write(json.dumps(waiting.pop(next_index), default=str) + "\n")
                next_index += 1
            progress.advance(bar)
    console.print(
        f"scored {len(items):,} lines ({correct:,} correct) into {output_path}; {len(bad):,} bad lines skipped"
    )
    if bad:
        raise typer.Exit(3)  # every usable line is scored; some lines were not usable


def _verify_lines(path: Path, max_line_bytes: int | None = None) -> tuple[list, list]:
    """(usable items, bad lines) of a verify-file JSONL; each bad line is reported on stderr."""
    from tasks.verification.files import MAX_LINE_BYTES, BadLine, read_lines

    parsed = list(read_lines(str(path), max_line_bytes or MAX_LINE_BYTES))
    bad = [line for line in parsed if isinstance(line, BadLine)]
    for line in bad:
        errors.print(
            f"[yellow]skipped[/yellow] {escape(str(path))} {escape(str(line))}", highlight=False, soft_wrap=True
        )
    return [line for line in parsed if not isinstance(line, BadLine)], bad


@app.command()
def verify(
    iteration: Annotated[int, typer.Option(help="the iteration whose rollouts to score")],
    verifier: Annotated[
        Optional[str], typer.Option(help="re-score with this verifier instead of each problem's own")
    ] = None,
    config: Annotated[Optional[Path], typer.Option(help="YAML with a `verify:` section (VerifyConfig)")] = None,
    workers: Annotated[Optional[int], typer.Option(min=0, help="worker processes")] = None,
    noise_correction: Annotated[bool, typer.Option(help="add corrected_reward from the verifier's audit")] = False,
    lake: LakeOption = None,
    wait: WaitOption = False,
    format: FormatOption = TableFormat.table,
) -> None:
    """Score an iteration's rollouts into the rewards table (replacing that verifier's previous scores)."""
    use_format(format)
    import polars as pl

    from storage.config import load_yaml_config
    from tasks.verification.stage import VerifyConfig

    settings = load_yaml_config(config, VerifyConfig, section="verify") if config else VerifyConfig()
    updates = {
        "verifier": verifier or settings.verifier,
        "noise_correction": noise_correction or settings.noise_correction,
    }
    if workers is not None:
        updates["workers"] = workers
    settings = settings.model_copy(update=updates)
    with loop_writer(lake, wait):
        prefect_defaults()
        from flows.verification import verify_iteration

        result = verify_iteration(iteration, settings.model_dump(mode="json"), lake)
    show_table(pl.DataFrame(result["verifiers"]), title=f"iteration {iteration} (run {result['run_id']})")


@app.command("audit-verifier")
def audit_verifier_command(
    audit_file: Annotated[Path, typer.Argument(metavar="AUDIT.jsonl", help="verify-file lines with a boolean `label`")],
    verifier: Annotated[
        Optional[str], typer.Option(help="the verifier to audit (default: each line's domain's)")
    ] = None,
    reference: Annotated[
        Optional[str], typer.Option(help="take the truth from this stricter verifier, not `label`")
    ] = None,
    workers: Annotated[int, typer.Option(min=0)] = 2,
    lake: LakeOption = None,
) -> None:
    """Estimate a verifier's false-positive (rho0) and false-negative (rho1) rates, with 95 % intervals, and store them."""
    prefect_defaults()
    from flows.verification import audit_verifier

    try:
        result = audit_verifier(str(audit_file), verifier, reference, workers, lake)
    except ValueError as error:
        fail(str(error))
    console.print(
        f"{result['verifier']} {result['verifier_version']}: rho0 (false positives) = {result['rho0']:.3f} "
        f"[{result['rho0_low']:.3f}, {result['rho0_high']:.3f}] over {result['n_wrong']} wrong, rho1 (false "
        f"negatives) = {result['rho1']:.3f} [{result['rho1_low']:.3f}, {result['rho1_high']:.3f}] over "
        f"{result['n_correct']} correct (run {result['run_id']})"
    )
