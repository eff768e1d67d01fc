"""Deduplication and decontamination over frames of candidate problems.

Priority decides who survives a duplicate: problems already in the bank (never dropped), then
new evaluation problems, then new training problems, each in source order.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tasks.curation.config import FILE_KINDS, PROPOSAL_URI, DecontaminationConfig, DedupConfig
from tasks.curation.dedup import near_duplicates, ngram_overlap
from tasks.curation.records import normalise_text

DROP_COLUMNS = [
    "problem_id",
    "source",
    "source_uri",
    "source_line",
    "seed",
    "reason",
    "duplicate_of",
    "similarity",
    "prompt",
]


def checked_in_bank() -> pl.Expr:
    """Which of the bank's rows take part in near-duplicate and contamination checks: file rows and self-play's
    tasks (both free text; procedural rows are templates, told apart by their numbers only)."""
    return pl.col("source_kind").is_in(list(FILE_KINDS)) | pl.col("source_uri").str.starts_with(PROPOSAL_URI)


def _drops(rows: pl.DataFrame, reason: str, duplicate_of: list, similarity) -> pl.DataFrame:
    return rows.with_columns(
        reason=pl.lit(reason),
        duplicate_of=pl.Series(duplicate_of, dtype=pl.String),
        similarity=pl.Series(similarity, dtype=pl.Float64),
    ).select(DROP_COLUMNS)


def deduplicate(
    candidates: pl.DataFrame, existing: pl.DataFrame, config: DedupConfig
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(kept candidates, dropped rows): exact duplicates of normalised text, then MinHash near-duplicates,
    each within a split (a training copy of an evaluation problem is decontamination's business)."""
    new = candidates.with_row_index("_row").sort(pl.col("split") != "eval", "_row")
    pool = pl.concat(
        [
            existing.select(
                "problem_id",
                "domain",
                "split",
                "prompt",
                _row=pl.lit(None, pl.UInt32),
                similarity_checks=checked_in_bank(),
            ),
            new.select("problem_id", "domain", "split", "prompt", "_row", "similarity_checks"),
        ]
    )
    is_new = pool["_row"].is_not_null().to_numpy()
    ids = pool["problem_id"].to_numpy()
    duplicate_of = np.full(pool.height, -1)
    similarity = np.full(pool.height, np.nan)
    reason = np.full(pool.height, None, dtype=object)
    # Identical problems (same id) are always dropped; `exact` also drops same-text problems within a split.
    keys = (
        pl.Series(
            [f"{s}\x1f{d}\x1f{normalise_text(p)}" for s, d, p in zip(pool["split"], pool["domain"], pool["prompt"])]
        )
        if config.exact
        else pool["problem_id"]
    )
    first = keys.to_frame("key").with_row_index("i").group_by("key").agg(pl.col("i").min())
    first_of = keys.to_frame("key").join(first, on="key", how="left", maintain_order="left")["i"].to_numpy()
    exact = is_new & (first_of != np.arange(pool.height))
    duplicate_of[exact], similarity[exact], reason[exact] = first_of[exact], 1.0, "exact_duplicate"
    if config.near:
        eligible = np.flatnonzero(pool["similarity_checks"].to_numpy() & (reason == None))  # noqa: E711 (object array)
        if is_new[eligible].any():  # else nothing new could be dropped: skip the MinHash
            split_codes = (pool["split"].to_numpy()[eligible] == "eval").astype(np.int64)
            found = near_duplicates(
                [pool["prompt"][int(i)] for i in eligible], split_codes, config.threshold, config.ngram, config.num_perm
            )
            near = (found.duplicate_of >= 0) & is_new[eligible]
            rows = eligible[near]
            duplicate_of[rows] = eligible[found.duplicate_of[near]]
            similarity[rows], reason[rows] = found.similarity[near], "near_duplicate"
    dropped_mask = reason != None  # noqa: E711
    marks = pl.DataFrame(
        {
            "_row": pool["_row"].filter(pl.Series(dropped_mask)),
            "reason": reason[dropped_mask].astype(str),
            "duplicate_of": ids[duplicate_of[dropped_mask]].astype(str),
            "similarity": similarity[dropped_mask],
        }
    )
    rows = new.join(marks, on="_row", how="inner").sort("_row")
    dropped = rows.select(DROP_COLUMNS) if rows.height else pl.DataFrame(schema=_drop_schema())
    kept = new.join(marks, on="_row", how="anti").sort("_row").drop("_row")
    return kept, dropped


def decontaminate(
    candidates: pl.DataFrame,
    eval_sets: dict[str, list[str]],
    config: DecontaminationConfig,
    existing: pl.DataFrame | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Drop training problems whose n-grams overlap an evaluation set by at least `min_overlap`.

    New training rows are checked against every evaluation set. Training rows already in the bank
    are never removed, but when an evaluation set arrives that they overlap, they are recorded as
    `contaminated_later`, which keeps them out of training mixes from this bank version on.
    Only rows with similarity checks take part: a procedural problem shares its template with
    every problem of its family, held out or not, and its exact copies are already gone.
    """
    empty = pl.DataFrame(schema=_drop_schema())
    if not config.enabled or not eval_sets:
        return candidates, empty
    train_mask = ((candidates["split"] == "train") & candidates["similarity_checks"]).to_numpy()
    best, best_set = _best_overlap(candidates["prompt"].filter(pl.Series(train_mask)).to_list(), eval_sets, config)
    contaminated = np.zeros(candidates.height, dtype=bool)
    contaminated[np.flatnonzero(train_mask)] = best >= config.min_overlap
    hits = best >= config.min_overlap
    dropped = [_drops(candidates.filter(pl.Series(contaminated)), "contaminated", list(best_set[hits]), best[hits])]
    new_eval = {
        name: texts
        for name, texts in eval_sets.items()
        if name in set(candidates.filter(pl.col("split") == "eval")["source"].to_list())
    }
    if existing is not None and new_eval:
        old_train = existing.filter((pl.col("split") == "train") & checked_in_bank())
        old_best, old_set = _best_overlap(old_train["prompt"].to_list(), new_eval, config)
        old_hits = old_best >= config.min_overlap
        dropped.append(
            _drops(
                old_train.filter(pl.Series(old_hits)), "contaminated_later", list(old_set[old_hits]), old_best[old_hits]
            )
        )
    return candidates.filter(~pl.Series(contaminated)), pl.concat([d for d in dropped if d.height] or [empty])


def _best_overlap(texts: list[str], eval_sets: dict[str, list[str]], config: DecontaminationConfig):
    """Per text, the highest n-gram overlap with any evaluation set, and that set's name."""
    best = np.zeros(len(texts))
    best_set = np.full(len(texts), None, dtype=object)
    for name, reference in eval_sets.items():
        overlap = ngram_overlap(texts, reference, config.ngram)
        better = overlap > best
        best[better], best_set[better] = overlap[better], name
    return best, best_set


def _drop_schema() -> dict:
    return {
        "problem_id": pl.String,
        "source": pl.String,
        "source_uri": pl.String,
        "source_line": pl.Int64,
        "seed": pl.Int64,
        "reason": pl.String,
        "duplicate_of": pl.String,
        "similarity": pl.Float64,
        "prompt": pl.String,
    }
