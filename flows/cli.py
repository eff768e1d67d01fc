"""The `rlvr` command line. Read-only commands (sql, lineage, bank stats/sample) never import Prefect."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from flows.display import TableFormat, console, errors, print_lineage, show_table, use_format, write_result

app = typer.Typer(help="RLVR data platform: problem bank, rollouts, verifiers, advantages, GRPO/DAPO.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
lineage_app = typer.Typer(help="Where a row came from.", no_args_is_help=True)
bank_app = typer.Typer(help="Inspect and sample the problem bank.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks, measured as ratios on this machine.", no_args_is_help=True)
app.add_typer(lineage_app, name="lineage")
app.add_typer(bank_app, name="bank")
app.add_typer(bench_app, name="bench")

LakeOption = Annotated[Optional[str], typer.Option("--lake", envvar="RLVR_LAKE",
                                                   help="lake location: a folder or s3://bucket/prefix [default: ./lake]")]
FormatOption = Annotated[TableFormat, typer.Option(
    "--format", help="table for people; csv or json (JSON lines) for programs: then stdout holds only the rows, "
    "and notes go to stderr")]
WaitOption = Annotated[bool, typer.Option("--wait", help="queue behind another writer of this lake instead of being "
                                          "refused (one process writes iterations at a time)")]


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
    insecure_sandbox: Annotated[bool, typer.Option(
        "--insecure-sandbox", help="run model-generated code with resource limits only where this host offers no "
        "isolation (no root, no user namespaces); recorded on every code reward")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="print the version and exit")] = False,
) -> None:
    """RLVR data platform: problem bank, rollouts, verifiers, advantages, GRPO/DAPO."""
    use_format()                                   # tables for people unless the command says --format
    if insecure_sandbox:
        from tasks.sandbox.client import INSECURE_ENV, isolation_mode

        os.environ[INSECURE_ENV] = "1"             # verification workers inherit it
        if isolation_mode() == "rlimits":
            errors.print("[bold red]WARNING: --insecure-sandbox: model-generated code will run WITHOUT isolation, "
                         "as this user, with resource limits only. It can read and change this user's files and "
                         "processes. Every code reward records it.[/bold red]", highlight=False, soft_wrap=True)


def fail(message: str, code: int = 1) -> None:
    errors.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


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
        errors.print(f"[dim]waiting: {escape(str(error).split(': one writer')[0])}[/dim]", highlight=False,
                     soft_wrap=True)
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


def _prefect_defaults() -> None:
    """Before a command's first flow: quiet defaults, and an API to report to (`flows/orchestration.py`:
    PREFECT_API_URL, else a temporary server that dies with this command)."""
    from flows.orchestration import OrchestrationUnavailable, ensure_api

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    try:
        ensure_api()
    except OrchestrationUnavailable as error:
        fail(str(error))
    from flows.policies import without_flow_heartbeats

    _COMMAND_CONTEXT.enter_context(without_flow_heartbeats())    # for the whole command (see policies.py)
    if not os.environ.get("RLVR_DEBUG"):
        for name in ("prefect.flow_runs", "prefect.task_runs"):
            logging.getLogger(name).addFilter(_OneLineErrors())


@app.command()
def curate(
    config: Annotated[Optional[Path], typer.Option(help="curation config (YAML; the `bank:` section if present)")] = None,
    source: Annotated[list[str], typer.Option("--source", help="KIND:PATH_OR_NAME[:COUNT], repeatable")] = [],
    eval_source: Annotated[list[str], typer.Option("--eval-source", help="like --source, as a held-out evaluation set")] = [],
    bank_version: Annotated[Optional[int], typer.Option(help="re-curate this bank version, replacing it")] = None,
    force: Annotated[bool, typer.Option(help="re-curate a version even when later versions depend on it")] = False,
    lake: LakeOption = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """Curate a new bank version from files and procedural sources."""
    use_format(format)
    from tasks.curation.inputs import curation_config_from

    try:
        curation = curation_config_from(config, source, eval_source, bank_version)
    except ValueError as error:
        fail(str(error), 2)
    _curate(curation, lake, force)


def _curate(curation, lake: str | None, force: bool = False) -> None:
    """Check the inputs, then run the curation flow and print what it did."""
    from tasks.curation.readers import SourceReadError
    from tasks.curation.stage import preflight

    try:
        preflight(curation)
    except (SourceReadError, ValueError) as error:
        fail(str(error))
    _prefect_defaults()
    from flows.curation import curate_bank

    try:
        result = curate_bank(curation.model_dump(mode="json"), lake, force)
    except (SourceReadError, ValueError) as error:
        fail(str(error))
    _print_curation(result)


def _print_curation(result: dict) -> None:
    import polars as pl

    show_table(pl.DataFrame(result["sources"]), title=f"bank version {result['bank_version']} (run {result['run_id']})",
               part="curation")                # `rlvr run` may print the loop's table after it
    totals = pl.DataFrame(result["sources"]).select(pl.exclude("source").sum()).row(0, named=True)
    console.print(f"kept {totals['kept']:,} of {totals['loaded']:,} rows: {totals['quarantined']:,} quarantined, "
                  f"{totals['exact_dup']:,} exact and {totals['near_dup']:,} near duplicates, "
                  f"{totals['contaminated']:,} contaminated. Lake version {result['lake_version']}.")


@app.command()
def run(
    config: Annotated[Path, typer.Option(help="run config (YAML)")] = Path("configs/demo.yaml"),
    iterations: Annotated[Optional[int], typer.Option(min=0, help="RL iterations the lake should hold; a run "
                                                                  "resumes after the last recorded one [default: "
                                                                  "the config's loop.iterations]")] = None,
    lake: LakeOption = None,
    wait: WaitOption = False,
    documents: Annotated[Optional[Path], typer.Option(help="SPICE: a corpus (JSONL or text) self-play's challenger "
                                                           "reads (sets selfplay.documents)")] = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """The main job: curate the config's bank (unless done before), then run the RL loop, resuming where the lake is."""
    use_format(format)
    from storage.lake import Lake
    from tasks.curation.config import CurationConfig, load_yaml_config
    from tasks.curation.stage import identical_curation

    from flows.cli_rl import run_config
    from flows.loop_state import nothing_left

    try:
        curation = load_yaml_config(config, CurationConfig, section="bank")
    except ValueError as error:
        fail(str(error), 2)
    settings = run_config(config)
    if documents is not None:
        from tasks.selfplay.documents import read_documents

        try:
            read_documents(documents)                 # a bad corpus fails here, naming its file and line
        except ValueError as error:
            fail(str(error), 2)
        settings.selfplay.documents = str(documents.resolve())
    opened = Lake.open(lake)
    with loop_writer(lake, wait):
        previous = identical_curation(opened, curation)
        if previous is not None:
            console.print(f"[dim]bank version {previous['bank_version']} was curated from this config by run "
                          f"{previous['run_id']}; skipping curation[/dim]")
        else:
            _curate(curation, lake)
        count = settings.loop.iterations if iterations is None else iterations
        if count == 0:
            _print_stats(opened, None)
            return
        if nothing_left(opened, count, settings.warmup.enabled):     # no orchestration needed
            console.print(f"nothing to do: the lake already holds {count} iteration(s) (raise --iterations to go on)")
            return
        from flows.cli_rl import run_loop

        run_loop(settings, count, lake)


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="SQL over the lake's tables (problems, runs, ...)")],
    format: FormatOption = TableFormat.table,
    as_of: Annotated[Optional[str], typer.Option("--as-of", help="lake version (integer) or ISO timestamp")] = None,
    lake: LakeOption = None,
) -> None:
    """Run SQL over every lake table with DuckDB: queries only, over the lake's committed rows."""
    import duckdb

    from storage.catalog import open_lake_catalog
    from storage.lake import Lake, LakeError

    use_format(format)
    try:
        catalog = open_lake_catalog(Lake.open(lake), as_of, query)
        for why in catalog.damaged.values():
            errors.print(f"[yellow]warning:[/yellow] {escape(why)}", highlight=False, soft_wrap=True)
        result = catalog.sql(query)
        arrow = result.to_arrow_table() if result is not None else None
    except duckdb.Error as error:
        fail(str(error))
    except (LakeError, ValueError) as error:
        fail(str(error))
    if arrow is not None:
        write_result(arrow)


@lineage_app.command("problem")
def lineage_problem(problem_id: str, lake: LakeOption = None) -> None:
    """Where a problem came from: file and line or generator and seed, bank version, run."""
    from storage.lake import Lake
    from storage.lineage import problem_lineage

    lineage = problem_lineage(Lake.open(lake), problem_id)
    if lineage is None:
        fail(f"no problem {problem_id} in the bank or among dropped problems")
    print_lineage(lineage)


@bank_app.command("stats")
def bank_stats_command(
    bank_version: Annotated[Optional[int], typer.Option(help="the bank as of this version; default latest")] = None,
    lake: LakeOption = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """Counts by source, domain, level and split, and quarantine and drop reasons."""
    use_format(format)
    from storage.lake import Lake

    _print_stats(Lake.open(lake), bank_version)


def _print_stats(lake, bank_version: int | None) -> None:
    from tasks.curation.stage import bank_stats

    stats = bank_stats(lake, bank_version)
    if all(frame.is_empty() for frame in stats.values()):
        fail(f"the bank at {lake.uri} is empty: run `rlvr curate` first")
    for title, frame in stats.items():
        show_table(frame, title=title, part=title)


@bank_app.command("sample")
def bank_sample(
    n: Annotated[int, typer.Option("--n", min=1, help="how many problems")] = 100,
    seed: Annotated[int, typer.Option(help="seed of the draw")] = 0,
    levels: Annotated[str, typer.Option(help="level weights 1,2,3,4 in percent")] = "20,45,30,5",
    domain_weights: Annotated[Optional[str], typer.Option(help="e.g. math=0.7,code=0.2,logic=0.1")] = None,
    split: Annotated[str, typer.Option(help="train or eval")] = "train",
    bank_version: Annotated[Optional[int], typer.Option(help="the bank as of this version")] = None,
    out: Annotated[Optional[Path], typer.Option(help="write the draw to a .jsonl or .parquet file")] = None,
    lake: LakeOption = None,
    format: FormatOption = TableFormat.table,
) -> None:
    """Draw a seeded training mix by level and domain."""
    use_format(format)
    from storage.lake import Lake
    from tasks.curation.config import MixConfig
    from tasks.curation.stage import draw_training_mix
    from tasks.curation.inputs import parse_weights

    try:
        level_weights = {i + 1: float(w) for i, w in enumerate(levels.split(","))}
        mix = MixConfig(level_weights=level_weights, domain_weights=parse_weights(domain_weights),
                        split=split, bank_version=bank_version, seed=seed)
        drawn = draw_training_mix(Lake.open(lake), n, mix)
    except ValueError as error:
        fail(str(error).splitlines()[0] if "validation error" not in str(error) else str(error), 2)
    summary = drawn.group_by("level", "domain").len("drawn").sort("level", "domain")
    show_table(summary, title=f"{drawn.height} problems drawn (seed {seed})", part="drawn")
    if out is not None:
        writers = {".parquet": drawn.write_parquet, ".jsonl": drawn.write_ndjson, ".csv": drawn.write_csv}
        if out.suffix not in writers:
            fail(f"--out {out}: use a .jsonl, .parquet or .csv file", 2)
        writers[out.suffix](out)
        console.print(f"wrote {out}")
    else:
        show_table(drawn.select("problem_id", "level", "domain", "source", "prompt").head(10),
                   title=f"first {min(10, drawn.height)}", part="first")


@app.command("verify-file")
def verify_file(
    input_path: Annotated[Path, typer.Argument(metavar="IN.jsonl", help="lines with id, domain, response, ground_truth / tests")],
    output_path: Annotated[Path, typer.Argument(metavar="OUT.jsonl", help="where the scored lines go")],
    workers: Annotated[int, typer.Option(min=0, help="worker processes (0: score in this process)")] = 2,
    verifier: Annotated[Optional[str], typer.Option(help="score every line with this verifier (e.g. process, random)")] = None,
    item_timeout: Annotated[float, typer.Option(min=1, help="seconds one item may take before its worker is killed")] = 30.0,
    partial_credit: Annotated[str, typer.Option(help="code rewards: fraction, half (all 1, some 0.5) or all_pass (1 or 0)")] = "fraction",
    process_weight: Annotated[float, typer.Option(help="λ of the process verifier: (1-λ)·outcome + λ·process")] = 0.5,
    max_line_bytes: Annotated[int, typer.Option(min=1, help="longer lines are skipped unread")] = 16 * 1024 * 1024,
    max_response_chars: Annotated[int, typer.Option(min=1, help="longer responses score 0 (too long)")] = 200_000,
) -> None:
    """Score a JSONL file of responses (math, code, logic, qa) without a lake. Exit code 3: some lines could not
    be used (each reported with its number and reason); every other line was scored."""
    import json

    from rich.progress import Progress

    from tasks.verifiers.engine import VerifierPool
    if verifier is not None:
        from tasks.verifiers.base import build_verifier

        build_verifier(verifier)                    # an unknown name fails here, before any work
    items, bad = _verify_lines(input_path, max_line_bytes)
    if verifier is not None:
        items = [(problem, response, verifier) for problem, response, _ in items]
    from tasks.verifiers.process import warn_low_process_weight

    warn_low_process_weight(process_weight)             # here, once: not in every worker
    options = {"code": {"partial_credit": partial_credit}, "workspace": {"partial_credit": partial_credit}, "process": {"process_weight": process_weight}}
    pool = VerifierPool(workers=workers, item_timeout=item_timeout, options=options,
                        max_response_chars=max_response_chars)
    waiting: dict[int, dict] = {}
    next_index, correct = 0, 0
    with output_path.open("w") as out, Progress(console=errors, transient=True) as progress:
        bar = progress.add_task("verifying", total=len(items))
        for scored in pool.score(items):
            correct += bool(scored.correct)
            waiting[scored.index] = {
                "id": items[scored.index][0]["id"], "reward": scored.reward, "correct": scored.correct,
                "verifier": scored.verifier, "verifier_version": scored.verifier_version,
                "details": {**scored.details, "format_reward": scored.format_reward},
            }
            while next_index in waiting:          # keep the input's order
                out.write(json.dumps(waiting.pop(next_index), default=str) + "\n")
                next_index += 1
            progress.advance(bar)
    console.print(f"scored {len(items):,} lines ({correct:,} correct) into {output_path}; {len(bad):,} bad lines skipped")
    if bad:
        raise typer.Exit(3)                          # every usable line is scored; some lines were not usable


def _verify_lines(path: Path, max_line_bytes: int | None = None) -> tuple[list, list]:
    """(usable items, bad lines) of a verify-file JSONL; each bad line is reported on stderr."""
    from tasks.verifiers.files import MAX_LINE_BYTES, BadLine, read_lines

    parsed = list(read_lines(str(path), max_line_bytes or MAX_LINE_BYTES))
    bad = [line for line in parsed if isinstance(line, BadLine)]
    for line in bad:
        errors.print(f"[yellow]skipped[/yellow] {escape(str(path))} {escape(str(line))}", highlight=False, soft_wrap=True)
    return [line for line in parsed if not isinstance(line, BadLine)], bad


@app.command()
def verify(
    iteration: Annotated[int, typer.Option(help="the iteration whose rollouts to score")],
    verifier: Annotated[Optional[str], typer.Option(help="re-score with this verifier instead of each problem's own")] = None,
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

    from tasks.curation.config import load_yaml_config
    from tasks.verification import VerifyConfig

    settings = load_yaml_config(config, VerifyConfig, section="verify") if config else VerifyConfig()
    updates = {"verifier": verifier or settings.verifier, "noise_correction": noise_correction or settings.noise_correction}
    if workers is not None:
        updates["workers"] = workers
    settings = settings.model_copy(update=updates)
    with loop_writer(lake, wait):
        _prefect_defaults()
        from flows.verification import verify_iteration

        result = verify_iteration(iteration, settings.model_dump(mode="json"), lake)
    show_table(pl.DataFrame(result["verifiers"]), title=f"iteration {iteration} (run {result['run_id']})")


@app.command("audit-verifier")
def audit_verifier_command(
    audit_file: Annotated[Path, typer.Argument(metavar="AUDIT.jsonl", help="verify-file lines with a boolean `label`")],
    verifier: Annotated[Optional[str], typer.Option(help="the verifier to audit (default: each line's domain's)")] = None,
    reference: Annotated[Optional[str], typer.Option(help="take the truth from this stricter verifier, not `label`")] = None,
    workers: Annotated[int, typer.Option(min=0)] = 2,
    lake: LakeOption = None,
) -> None:
    """Estimate a verifier's false-positive (rho0) and false-negative (rho1) rates, with 95 % intervals, and store them."""
    _prefect_defaults()
    from flows.verification import audit_verifier

    try:
        result = audit_verifier(str(audit_file), verifier, reference, workers, lake)
    except ValueError as error:
        fail(str(error))
    console.print(f"{result['verifier']} {result['verifier_version']}: rho0 (false positives) = {result['rho0']:.3f} "
                  f"[{result['rho0_low']:.3f}, {result['rho0_high']:.3f}] over {result['n_wrong']} wrong, rho1 (false "
                  f"negatives) = {result['rho1']:.3f} [{result['rho1_low']:.3f}, {result['rho1_high']:.3f}] over "
                  f"{result['n_correct']} correct (run {result['run_id']})")


@bench_app.command("dedup")
def bench_dedup(
    sizes: Annotated[str, typer.Option(help="bank sizes to time, comma separated")] = "100000,200000",
    repeats: Annotated[int, typer.Option(help="timed runs per size; the best is kept")] = 2,
) -> None:
    """Near-duplicate detection time as the bank grows: the ratio shows how it scales."""
    from bench.dedup_scaling import run_benchmark

    run_benchmark([int(s) for s in sizes.split(",")], repeats)


@bench_app.command("verify")
def bench_verify(
    limit: Annotated[int, typer.Option(help="gold answers per mix (numeric: MATH-500 then GSM8K test, two responses "
                                       "each; symbolic: MATH-500's non-numeric golds, 16 responses each)")] = 2000,
    workers: Annotated[int, typer.Option(min=1, help="our verifier's worker processes")] = 2,
    repeats: Annotated[int, typer.Option(min=1, help="back-to-back measurements; the median is reported")] = 3,
    mix: Annotated[str, typer.Option(help="numeric, symbolic or both (comma separated)")] = "numeric,symbolic",
) -> None:
    """Math verification throughput and accuracy against math-verify called directly, on two mixes."""
    from bench.verify_throughput import run_benchmark

    mixes = tuple(m for m in mix.split(",") if m)
    if not set(mixes) <= {"numeric", "symbolic"}:
        fail(f"--mix takes numeric and symbolic, not {mix!r}", 2)
    run_benchmark(limit, workers, repeats, mixes)


@bench_app.command("advantages")
def bench_advantages(
    groups: Annotated[int, typer.Option(min=1, help="groups of rollouts")] = 625_000,
    group_size: Annotated[int, typer.Option(min=2, help="rollouts per group")] = 16,
) -> None:
    """Advantages plus filtering against per-group Python and a bare Polars group-by."""
    from bench.advantages_scale import run_benchmark

    run_benchmark(groups, group_size)


@bench_app.command("sandbox")
def bench_sandbox(
    workers: Annotated[int, typer.Option(min=1, help="concurrent runs on both sides")] = 2,
    repeats: Annotated[int, typer.Option(min=1, help="passes over the 164 problems")] = 1,
    hostile: Annotated[bool, typer.Option("--hostile", help="score a mix of honest and hostile programs through "
                                          "the verification pool instead")] = False,
    rows: Annotated[int, typer.Option(min=1, help="--hostile: rows to score")] = 10_000,
    hostile_share: Annotated[float, typer.Option(min=0, max=1, help="--hostile: share of hostile rows")] = 0.1,
    files: Annotated[bool, typer.Option("--files", help="file-level unittest suites against bare python -m "
                                        "unittest instead")] = False,
) -> None:
    """Sandboxed executions per second against bare subprocesses, on HumanEval's canonical solutions; with
    --hostile, honest pass rate, hostile rewards, memory, descriptors and throughput under hostile load; with
    --files, the shipped file-level suites' time against bare `python -m unittest`."""
    if files:
        from bench.sandbox_files import run_benchmark as files_benchmark

        files_benchmark(workers, repeats)
        return
    if hostile:
        from bench.sandbox_hostile import run_benchmark as hostile_benchmark

        summary = hostile_benchmark(rows, hostile_share, workers)
        if summary["honest_pass_rate_vs_bare"] < 1 or summary["hostile_rows_rewarded"] or summary["crashed"]:
            raise typer.Exit(1)
        return
    from bench.sandbox_rate import run_benchmark

    run_benchmark(workers, repeats)


@bench_app.command("train")
def bench_train(
    sequences: Annotated[int, typer.Option(min=2, help="sequences per training step")] = 128,
    response_length: Annotated[int, typer.Option(min=1, help="response tokens per sequence")] = 40,
    repeats: Annotated[int, typer.Option(min=1, help="timed steps per side (median)")] = 5,
) -> None:
    """Training-step throughput (tokens/s) against TRL's GRPOTrainer on the same tiny model and batch."""
    from bench.train_throughput import run_benchmark

    run_benchmark(sequences=sequences, response_length=response_length, repeats=repeats)


@bench_app.command("sampling")
def bench_sampling(
    shape: Annotated[list[str], typer.Option(help="model shapes: tiny (the demo policy), 0.5b (Qwen2.5-0.5B-shaped)")]
        = ["tiny", "0.5b"],
    repeats: Annotated[int, typer.Option(min=1, help="alternating repeats per side (best)")] = 3,
) -> None:
    """The hf backend's sampler against transformers' generate (with scores) on the same model and batch."""
    from bench.sampling import SHAPES, run_benchmark

    unknown = sorted(set(shape) - set(SHAPES))
    if unknown:
        fail(f"--shape {unknown[0]}: choose from {', '.join(SHAPES)}")
    run_benchmark(shape, repeats)


@bench_app.command("learning")
def bench_learning(
    config: Annotated[Path, typer.Option(help="the learning run's config")] = Path("configs/demo-learn.yaml"),
    iterations: Annotated[Optional[int], typer.Option(min=0, help="RL iterations [default: the config's]; 0 only "
                                                                  "reports on an existing --lake")] = None,
    lake: Annotated[Optional[str], typer.Option(help="lake to run in or report on [default: a fresh folder]")] = None,
) -> None:
    """Held-out sampled solve rate of the warm-up model against the RL versions after it, from stored metrics."""
    _prefect_defaults()
    from bench.learning import run_benchmark

    try:
        run_benchmark(str(config), lake, iterations)
    except ValueError as error:
        fail(str(error))


@bench_app.command("peer")
def bench_peer(
    config: Annotated[Path, typer.Option(help="the learning run's config")] = Path("configs/demo-learn.yaml"),
    steps: Annotated[int, typer.Option(min=1, help="RL steps (our iterations, TRL's optimizer steps)")] = 50,
    seed: Annotated[list[int], typer.Option(help="seeds; each runs both sides from the same warm-up")] = [0, 1, 2],
    eval_every: Annotated[int, typer.Option(min=1, help="steps between held-out evaluations")] = 10,
    work: Annotated[Optional[str], typer.Option(help="folder for the warmed lake and the runs (reused)")] = None,
) -> None:
    """The loop against TRL's GRPOTrainer from the same warmed-up checkpoint: accuracy and RL wall time."""
    _prefect_defaults()
    from bench.peer import run_benchmark

    run_benchmark(str(config), steps, seed, eval_every, work)


@bench_app.command("async")
def bench_async(
    config: Annotated[Path, typer.Option(help="the learning run's config")] = Path("configs/demo-learn.yaml"),
    iterations: Annotated[int, typer.Option(min=1, help="iterations each mode runs")] = 10,
    max_staleness: Annotated[int, typer.Option(min=0, help="async: versions a batch may lag its trainer")] = 1,
    batch_size: Annotated[int, typer.Option(min=1, help="the server's sequences generated together")] = 128,
    correction: Annotated[str, typer.Option(help="async's off-policy correction: truncated (sequence weight), "
                                            "none, or decoupled (per-token, in the training step)")] = "truncated",
    work: Annotated[Optional[str], typer.Option(help="folder for the warmed lake (reused)")] = None,
) -> None:
    """The same iterations sync and async against a separate `rlvr policy serve`: wall times, accuracy, staleness."""
    if correction not in ("truncated", "none", "decoupled"):
        fail(f"--correction {correction!r}: truncated, none or decoupled", 2)
    _prefect_defaults()
    from bench.overlap import run_benchmark

    run_benchmark(str(config), iterations, max_staleness, work, batch_size, correction)


@bench_app.command("orchestration")
def bench_orchestration(
    repeats: Annotated[int, typer.Option(min=1, help="runs of each read-only command (median)")] = 3,
    subflows: Annotated[int, typer.Option(min=1, help="stage-shaped subflows timed (median)")] = 20,
) -> None:
    """What Prefect and the command line cost: read-only commands, a subflow and a task, the loop outside its stages."""
    from bench.orchestration import run_benchmark

    run_benchmark(repeats, subflows)


@bench_app.command("faults")
def bench_faults(
    lakes: Annotated[str, typer.Option(help="where to run the cases: local, s3 (moto on loopback) or both")] = "local,s3",
    run_points: Annotated[Optional[str], typer.Option(help="fault points of `rlvr run` to kill at, comma separated "
                                                     "[default: all 13]")] = None,
    curate_points: Annotated[Optional[str], typer.Option(help="fault points of `rlvr curate` [default: all 4]")] = None,
    concurrency: Annotated[bool, typer.Option(help="also run two `rlvr run` and three `rlvr curate` at once")] = True,
) -> None:
    """Kill -9 the main job and curation at named points and run writers side by side; check the lake after each."""
    from bench.faults import run_benchmark

    def points(text: str | None) -> list[str] | None:
        return None if text is None else [p for p in text.split(",") if p]

    outcomes = run_benchmark([k for k in lakes.split(",") if k], points(run_points), points(curate_points), concurrency)
    if not all(outcome.passed for outcome in outcomes):
        raise typer.Exit(1)


from flows import cli_ops, cli_report, cli_rl  # noqa: E402,F401  (they register their commands on `app`)


def main() -> None:
    """The console entry point: errors the user can act on are one line, never a traceback."""
    from deltalake.exceptions import DeltaError

    from storage.lake import LakeError
    from tasks.verifiers.base import VerifierUnavailable

    try:
        app(prog_name="rlvr")
    except (LakeError, DeltaError, OSError, ValueError, VerifierUnavailable) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        errors.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False, soft_wrap=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
