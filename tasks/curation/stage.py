"""The curation stage over the lake: which bank version, what is already there, and the write.

Each function is a plain step the Prefect flow wraps as a task; none of them imports Prefect.
"""

from __future__ import annotations

from collections import defaultdict

import polars as pl
import pyarrow.compute as pc

from storage.lake import Lake
from storage.runs import Run
from tasks.curation.config import CurationConfig, DecontaminationConfig, MixConfig, ValidationConfig
from tasks.curation.load import LoadedSource, load_source
from tasks.curation.gym import check_dataset
from tasks.curation.mix import sample_mix
from tasks.generators import families
from tasks.curation.readers import probe


def next_bank_version(lake: Lake) -> int:
    """One past the highest bank version any curation run has used (failed ones included, so no reuse)."""
    runs = lake.read("runs", filter=pc.field("stage") == "curate", columns=["bank_version"])
    return int(runs["bank_version"].max() or 0) + 1


def existing_bank(lake: Lake, bank_version: int) -> pl.DataFrame:
    """Problems of every other bank version: what new problems are deduplicated against."""
    return lake.read("problems", filter=pc.field("bank_version") != bank_version,
                     columns=["problem_id", "source", "source_kind", "domain", "split", "prompt"])


def evaluation_sets(existing: pl.DataFrame, candidates: pl.DataFrame, config: DecontaminationConfig,
                    validation: ValidationConfig) -> dict[str, list[str]]:
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
            raise ValueError(f"decontamination.against names unknown evaluation sets {sorted(unknown)}; "
                             f"known: {sorted(sets)}")
        return {name: sets[name] for name in config.against}
    return dict(sets)


def write_bank(lake: Lake, run: Run, bank_version: int, problems: pl.DataFrame, quarantined: pl.DataFrame,
               dropped: pl.DataFrame) -> None:
    """Replace this bank version's slice of each table; the problems table last, so that a failure
    before it leaves the previous contents of the bank visible."""
    version_column = pl.lit(bank_version, pl.Int64).alias("bank_version")
    lake.replace("quarantine", quarantined.with_columns(version_column), {"bank_version": bank_version}, run)
    lake.replace("dropped_problems", dropped.with_columns(version_column), {"bank_version": bank_version}, run)
    lake.replace("problems", problems.drop("similarity_checks").with_columns(version_column),
                 {"bank_version": bank_version}, run)


def source_report(loaded: list[LoadedSource], kept: pl.DataFrame, dropped: pl.DataFrame) -> pl.DataFrame:
    """Per source: rows loaded, quarantined, dropped by each reason, kept."""
    counts = pl.DataFrame({
        "source": [s.name for s in loaded],
        "loaded": [s.problems.height + s.quarantined.height for s in loaded],
        "quarantined": [s.quarantined.height for s in loaded],
    })
    reasons = ["exact_duplicate", "near_duplicate", "contaminated"]
    by_reason = (dropped.group_by("source", "reason").len()
                 .pivot(on="reason", index="source", values="len") if dropped.height else pl.DataFrame({"source": []}))
    for reason in reasons:
        if reason not in by_reason.columns:
            by_reason = by_reason.with_columns(pl.lit(0, pl.UInt32).alias(reason))
    counts = counts.join(by_reason.cast({"source": pl.String}), on="source", how="left")
    counts = counts.join(kept.group_by("source").len("kept"), on="source", how="left")
    return counts.fill_null(0).select("source", "loaded", "quarantined", *reasons, "kept")


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
    if split is not None:
        condition = condition & (pc.field("split") == split)
    return lake.read("problems", filter=condition)


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
        "quarantine reasons": quarantine.group_by("source", "field", "reason").len("rows").sort("rows", descending=True),
        "dropped": dropped.group_by("source", "reason").len("rows").sort("source", "reason"),
    }
