"""`rlvr analyze sampling`: what an iteration's groups say about the policy on each problem.

For every problem's G samples: the solve rate, how correct and incorrect responses differ (length,
truncation, the form the answer was given in), and whether the problem sits in the learning zone
(20-50 % solved), where GRPO's signal is strongest. Pure functions over frames.
"""

from __future__ import annotations

import polars as pl

from tasks.sampling.groups import success
from tasks.sampling.rounds import LEARNING_ZONE

ANSWER_FORMS = [
    ("boxed", r"\\boxed\{"),
    ("hashes", r"####"),
    ("answer_label", r"(?i)answer\s*(is|:|=)"),
    ("number_at_end", r"-?\d+(?:[./]\d+)?\s*\.?\s*$"),
]


def answer_form() -> pl.Expr:
    """How a response states its final answer: boxed, #### marker, 'answer:' label, a trailing number, or none."""
    response = pl.col("response")
    expr = pl.lit("none")
    for name, pattern in reversed(ANSWER_FORMS):
        expr = pl.when(response.str.contains(pattern)).then(pl.lit(name)).otherwise(expr)
    return expr


def zone(rate: pl.Expr) -> pl.Expr:
    low, high = LEARNING_ZONE
    return (
        pl.when(rate < low)
        .then(pl.lit("too_hard"))
        .when(rate > high)
        .then(pl.lit("too_easy"))
        .otherwise(pl.lit("learning_zone"))
    )


def per_problem(scored: pl.DataFrame) -> pl.DataFrame:
    """One row per (group, problem). `scored` holds rollouts joined with rewards and problems' level and source."""
    frame = scored.with_columns(solved=success(), truncated=pl.col("finish_reason") == "length", form=answer_form())
    right, wrong = pl.col("solved"), ~pl.col("solved")
    return (
        frame.group_by("group_id", maintain_order=True)
        .agg(
            pl.col("problem_id").first(),
            pl.col("level").first(),
            pl.col("source").first(),
            samples=pl.len(),
            solve_rate=right.cast(pl.Float64).mean(),
            mean_tokens_correct=pl.col("n_tokens").filter(right).mean(),
            mean_tokens_incorrect=pl.col("n_tokens").filter(wrong).mean(),
            truncated_correct=pl.col("truncated").filter(right).mean(),
            truncated_incorrect=pl.col("truncated").filter(wrong).mean(),
            form_correct=pl.col("form").filter(right).mode().first(),
            form_incorrect=pl.col("form").filter(wrong).mode().first(),
        )
        .with_columns(zone=zone(pl.col("solve_rate")))
        .sort("solve_rate", "group_id")
    )


def summary(scored: pl.DataFrame, problems: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The iteration in two small tables: correct versus incorrect responses metric by metric, and the
    problems per zone."""
    frame = scored.with_columns(solved=success(), truncated=pl.col("finish_reason") == "length", form=answer_form())
    forms = [name for name, _ in ANSWER_FORMS] + ["none"]
    metrics = {
        "responses": pl.len().cast(pl.Float64),
        "mean tokens": pl.col("n_tokens").mean(),
        "truncated share": pl.col("truncated").mean(),
        **{f"answer form: {name}": (pl.col("form") == name).mean() for name in forms},
    }
    sides = {
        label: frame.filter(pl.col("solved") == solved).select(**metrics).row(0)
        for label, solved in (("correct", True), ("incorrect", False))
    }
    comparison = pl.DataFrame({"metric": list(metrics), **sides}, strict=False)
    zones = problems.group_by("zone").agg(problems=pl.len()).with_columns(share=pl.col("problems") / problems.height)
    return comparison, zones.sort("zone")
