"""The curation stage over the lake: which bank version, what is already there, and the write.

Each function is a plain step the Prefect flow wraps as a task; none of them imports Prefect.
"""

from __future__ import annotations

import json
from collections import defaultdict

import polars as pl
import pyarrow.compute as pc

from storage.lake import Lake
from storage.progress import track
from storage.runs import Run
from tasks.curation.config import CurationConfig, DecontaminationConfig, MixConfig, ValidationConfig
from tasks.curation.gym import check_dataset
from tasks.curation.load import LoadedSource, load_source
from tasks.curation.mix import sample_mix
from tasks.curation.readers import probe
from tasks.curation.validate import EXECUTOR_VERIFIERS
from tasks.generators import families
from tasks.sandbox.client import Sandbox
from tasks.verifiers.code import extract_program
from tasks.workspaces.verifier import WORKSPACE_LIMITS


def next_bank_version(lake: Lake) -> int:
    """One past the highest bank version a completed curation wrote. Called under the `bank` lease, so no
    other curation is between this and its commit; a version whose run failed or was abandoned is
    reused, and its slices (invisible, as every unfinished run's rows are) are replaced."""
    runs = lake.read(
        "runs", filter=(pc.field("stage") == "curate") & (pc.field("status") == "completed"), columns=["bank_version"]
    )
    return int(runs["bank_version"].max() or 0) + 1


def check_recuration(lake: Lake, bank_version: int, force: bool) -> None:
    """Re-curating a version that later versions were deduplicated against could drop problems they
    rely on: refuse unless forced."""
    runs = lake.read(
        "runs",
        filter=(pc.field("stage") == "curate")
        & (pc.field("status") == "completed")
        & (pc.field("bank_version") > bank_version),
        columns=["bank_version"],
    )
    if runs.height and not force:
        later = sorted(set(runs["bank_version"].to_list()))
        raise ValueError(
            f"bank version {bank_version} has later versions {later} deduplicated against it; "
            "re-curating it could drop problems they rely on (pass --force to do it anyway)"
        )


def identical_curation(lake: Lake, config: CurationConfig) -> dict | None:
    """The latest completed curation run with exactly this config, if any (so `rlvr run` can skip it)."""
    parameters = json.dumps(config.model_dump(mode="json"), sort_keys=True, default=str)
    runs = lake.read(
        "runs",
        filter=(pc.field("stage") == "curate") & (pc.field("status") == "completed"),
        columns=["run_id", "bank_version", "parameters", "started_at"],
    )
    matches = runs.filter(pl.col("parameters") == parameters).sort("started_at")
    return matches.row(-1, named=True) if matches.height else None


def existing_bank(lake: Lake, bank_version: int | None = None) -> pl.DataFrame:
    """Problems of every other bank version (None: every version): what new problems are deduplicated against."""
    return lake.read(
        "problems",
        filter=None if bank_version is None else pc.field("bank_version") != bank_version,
        columns=[
            "problem_id",
            "source",
            "source_kind",
            "source_uri",
            "source_line",
            "seed",
            "domain",
            "split",
            "prompt",
        ],
    )


def evaluation_sets(
    existing: pl.DataFrame, candidates: pl.DataFrame, config: DecontaminationConfig, validation: ValidationConfig
) -> dict[str, list[str]]:
    """Prompts of every evaluation set by name: eval sources in the bank, in this run, and extra files."""
    sets: dict[str, list[str]] = defaultdict(list)
    for frame in (existing, candidates):
        for source, prompts in frame.filter(pl.col("split") == "eval").group_by("source").agg("prompt").iter_rows():
            sets[source].extend(prompts)
    for extra in config.files:
        sets[extra.source_name].extend(load_source(extra, validation).problems["prompt"].to_list())
    if config.against is not None:
        unknown = set(config.against) - set(sets)
        if unknown:
            raise ValueError(
                f"decontamination.against names unknown evaluation sets {sorted(unknown)}; known: {sorted(sets)}"
            )
        return {name: sets[name] for name in config.against}
    return dict(sets)


def write_bank(
    lake: Lake, run: Run, bank_version: int, problems: pl.DataFrame, quarantined: pl.DataFrame, dropped: pl.DataFrame
) -> None:
    """Replace this bank version's slice of each table, the problems table last.

    Delta commits one table at a time; if a later write fails, the slices already replaced are put
    back as they were, with their own run ids (a compensating write). Whatever the run leaves is
    invisible to readers until it completes anyway; this keeps a failed re-curation from hiding the
    version it meant to replace.
    """
    key = {"bank_version": bank_version}
    version_column = pl.lit(bank_version, pl.Int64).alias("bank_version")
    writes = [
        ("quarantine", quarantined),
        ("dropped_problems", dropped),
        ("problems", problems.drop("similarity_checks")),
    ]
    before = {name: (table.version() if (table := lake.table(name)) is not None else None) for name, _ in writes}
    done: list[str] = []
    try:
        for name, rows in writes:
            lake.replace(name, rows.with_columns(version_column), key, run)
            done.append(name)
    except BaseException:
        for name in done:
            lake.restore(name, key, before[name], run)
        raise


def source_report(loaded: list[LoadedSource], kept: pl.DataFrame, dropped: pl.DataFrame) -> pl.DataFrame:
    """Per source: rows loaded, quarantined, dropped by each reason, kept."""
    counts = pl.DataFrame(
        {
            "source": [s.name for s in loaded],
            "loaded": [s.problems.height + s.quarantined.height for s in loaded],
            "quarantined": [s.quarantined.height for s in loaded],
        }
    )
    reasons = ["exact_duplicate", "near_duplicate", "contaminated"]
    by_reason = (
        dropped.group_by("source", "reason").len().pivot(on="reason", index="source", values="len")
        if dropped.height
        else pl.DataFrame({"source": []})
    )
    for reason in reasons:
        if reason not in by_reason.columns:
            by_reason = by_reason.with_columns(pl.lit(0, pl.UInt32).alias(reason))
    counts = counts.join(by_reason.cast({"source": pl.String}), on="source", how="left")
    counts = counts.join(kept.group_by("source").len("kept"), on="source", how="left")
    counts = counts.fill_null(0).select("source", "loaded", "quarantined", *reasons, "kept")
    return counts.rename({"exact_duplicate": "exact_dup", "near_duplicate": "near_dup"})


def check_code_solutions(loaded: LoadedSource, validation: ValidationConfig) -> LoadedSource:
    """Move code problems whose reference solution fails its own tests (run in the sandbox) to quarantine."""

    problems = loaded.problems
    runnable = problems.filter(
        (pl.col("domain") == "code")
        & pl.col("solution").is_not_null()
        & ~pl.col("verifier").is_in(list(EXECUTOR_VERIFIERS))
    )  # self-play: no tests
    if not validation.run_code_solutions or runnable.is_empty():
        return loaded
    failing: dict[str, str] = {}
    with Sandbox() as sandbox:
        for row in track(list(runnable.iter_rows(named=True)), f"running {loaded.name}'s reference solutions"):
            if row["verifier"] == "workspace":
                spec = json.loads(row["tests"])
                result = sandbox.run_suite(
                    {**spec.get("given", {}), **json.loads(row["solution"])}, spec["tests"], limits=WORKSPACE_LIMITS
                )
            else:
                program = extract_program(row["solution"], row["prompt"], row["entry_point"])
                result = sandbox.run_tests(program, row["tests"], row["entry_point"], row["prompt"])
            if not result.all_passed:
                detail = "; ".join([*([] if result.status == "ok" else [result.status]), *result.failures[:1]])
                failing[row["problem_id"]] = (
                    f"reference solution fails its own tests ({result.passed}/{result.total} passed: {detail})"
                )[:500]
    if not failing:
        return loaded
    bad = problems.filter(pl.col("problem_id").is_in(list(failing)))
    quarantined = bad.select(
        "source",
        "source_uri",
        "source_line",
        field=pl.lit("canonical_solution"),
        reason=pl.col("problem_id").replace_strict(failing, return_dtype=pl.String),
        raw=pl.col("solution").str.slice(0, 2000),
    )
    return LoadedSource(
        loaded.name,
        problems.filter(~pl.col("problem_id").is_in(list(failing))),
        pl.concat([loaded.quarantined, quarantined.select(loaded.quarantined.columns)]),
    )


def preflight(config: CurationConfig) -> None:
    """Fail before any work on a file that cannot be read, or on two sources sharing a name
    (their rows would be indistinguishable in the bank)."""
    names = [s.source_name for s in config.sources]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"sources share the names {duplicated}: give them distinct `name:`s")
    for source in [*config.sources, *config.decontamination.files]:
        if source.path:
            probe(source.path)
        if source.kind == "gym":
            check_dataset(source.dataset)
        if source.kind == "generator":
            families(source.generator)


def bank_problems(lake: Lake, bank_version: int | None = None, split: str | None = "train") -> pl.DataFrame:
    """The bank as of a version (every problem added by it or before), optionally one split."""
    condition = pc.scalar(True)
    if bank_version is not None:
        condition = condition & (pc.field("bank_version") <= bank_version)
    problems = lake.read("problems", filter=condition if split is None else condition & (pc.field("split") == split))
    if split != "train":
        return problems
    # training problems that a later evaluation set turned out to overlap stay in the bank, out of mixes
    leaked = lake.read(
        "dropped_problems", filter=condition & (pc.field("reason") == "contaminated_later"), columns=["problem_id"]
    )
    return problems.join(leaked, on="problem_id", how="anti")


def draw_training_mix(lake: Lake, n: int, mix: MixConfig) -> pl.DataFrame:
    """What rollout calls: `n` problems drawn by level and domain weights, reproducible from the seed."""
    problems = bank_problems(lake, mix.bank_version, mix.split)
    if problems.is_empty():
        raise ValueError(f"the bank at {lake.uri} holds no {mix.split} problems: run `rlvr curate` first")
    return sample_mix(problems, n, mix.seed, mix.level_weights, mix.domain_weights)


def bank_stats(lake: Lake, bank_version: int | None = None) -> dict[str, pl.DataFrame]:
    """Counts by source, domain, level and split, and the reasons rows were quarantined or dropped."""
    problems = bank_problems(lake, bank_version, split=None)
    in_scope = pc.field("bank_version") <= bank_version if bank_version is not None else None
    quarantine = lake.read("quarantine", filter=in_scope)
    dropped = lake.read("dropped_problems", filter=in_scope)
    return {
        "by source": problems.group_by("source", "split", "domain").len("problems").sort("source"),
        "by domain": problems.group_by("domain").len("problems").sort("domain"),
        "by level": problems.group_by("level", "split").len("problems").sort("level", "split"),
        "quarantine reasons": quarantine.group_by("source", "field", "reason")
        .len("rows")
        .sort("rows", descending=True),
        "dropped": dropped.group_by("source", "reason").len("rows").sort("source", "reason"),
    }
