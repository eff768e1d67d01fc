"""Evaluation: the sampled solve rate of a model version on held-out problems, per source and level.

The same problems every time (a seeded draw from the eval split), sampled at temperature 1 by
default, because the RL loop's claim is about the policy's sampled behaviour, not its greedy one.
Every response is kept (`eval_rollouts`), so an evaluation can be re-scored with another verifier
without sampling again, and pass@k is reported beside pass@1 (the solve rate) with the unbiased
estimator 1 − C(n−c, k) / C(n, k) of n samples of which c are correct (Chen et al., 2021).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import polars as pl
from pydantic import Field

from policy.prompts import format_prompt
from policy.sampling import SamplerConfig
from storage.config import Strict
from storage.lake import Lake
from storage.seeds import derive_seed
from tasks.curation.mix import sample_mix
from tasks.curation.stage import bank_problems
from tasks.iteration import IterationConfig
from tasks.rollout.stage import open_policy
from tasks.verification.stage import PROBLEM_FIELDS, score_rollouts


class EvalConfig(Strict):
    """Which held-out problems, and how responses are sampled for them."""

    split: str = Field("eval", description="bank split to evaluate on")
    max_problems: int = Field(500, ge=1, description="problems per evaluation (the same ones each time)")
    samples_per_problem: int = Field(1, ge=1, description="sampled responses per problem")
    level_weights: dict[int, float] | None = Field(
        None, description="level mix of the drawn problems; default: the split's own"
    )
    sampler: SamplerConfig = Field(
        default_factory=lambda: SamplerConfig(max_new_tokens=64),
        description="sampling of the evaluated responses (temperature 1 by default)",
    )
    seed: int = Field(0, description="seed of the problem draw and of sampling")
    sources: list[str] | None = Field(
        None,
        description="evaluate only these held-out sources (e.g. gsm8k_test, "
        "math500, aime2024); default: every source of the split",
    )
    per_source: int | None = Field(
        None,
        ge=1,
        description="draw up to this many problems from each source on its "
        "own (small sets like AIME are then taken whole); default: one draw of "
        "max_problems over the split",
    )
    k: int = Field(1, ge=1, description="the k of pass@k; samples per problem are raised to k where fewer")
    verifier: str | None = Field(
        None,
        description="re-score the version's stored held-out responses with this "
        "verifier instead of sampling new ones (default: sample, and score with each "
        "problem's own verifier)",
    )

    @property
    def samples(self) -> int:
        return max(self.samples_per_problem, self.k)


def pinned_bank_version(lake: Lake) -> int | None:
    """The bank version every evaluation of this lake draws from: the first evaluation's, so that a later
    curation adding held-out problems does not move the curve's baseline."""
    done = lake.read("evaluations", columns=["bank_version"])["bank_version"].drop_nulls()
    if done.len():
        return int(done.min())
    latest = lake.read("problems", columns=["bank_version"])["bank_version"].max()
    return None if latest is None else int(latest)


def evaluation_problems(lake: Lake, config: EvalConfig) -> pl.DataFrame:
    """The held-out problems: one seeded draw by level mix, or one per source with `per_source`."""
    problems = bank_problems(lake, pinned_bank_version(lake), split=config.split)
    if problems.is_empty():
        raise ValueError(f"the bank at {lake.uri} has no {config.split} problems to evaluate on")
    if config.sources is not None:
        unknown = set(config.sources) - set(problems["source"].unique().to_list())
        if unknown:
            raise ValueError(
                f"evaluation.sources names {sorted(unknown)}, not {config.split} sources of the bank "
                f"(it has {sorted(problems['source'].unique().to_list())})"
            )
        problems = problems.filter(pl.col("source").is_in(config.sources))
    if config.per_source is None:
        return _level_draw(problems, config.max_problems, config)
    return pl.concat(
        [
            _level_draw(part, config.per_source, config)
            for _, part in problems.sort("source").group_by("source", maintain_order=True)
        ]
    )


def _level_draw(problems: pl.DataFrame, count: int, config: EvalConfig) -> pl.DataFrame:
    weights = config.level_weights or {int(level): float(n) for level, n in problems.group_by("level").len().rows()}
    return sample_mix(problems.sort("problem_id"), min(count, problems.height), config.seed, weights)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from n samples, c of them correct: 1 − C(n−c, k) / C(n, k)."""
    if n < k:
        raise ValueError(f"pass@{k} needs at least {k} samples, not {n}")
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def evaluate(
    lake: Lake, config: EvalConfig, settings: IterationConfig, model_version: int
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(evaluations rows, eval_rollouts rows) of `model_version`: its sampled responses to the evaluation
    problems, scored with each problem's own verifier — or, with `config.verifier`, its stored responses
    re-scored with that verifier (no run ids yet)."""
    if config.verifier is not None:
        return rescore(lake, config, settings, model_version)
    problems = evaluation_problems(lake, config)
    policy, tokenizer = open_policy(lake, settings.rollout, model_version)
    try:
        prompts = [format_prompt(text, settings.rollout.prompt, tokenizer) for text in problems["prompt"]]
        groups = policy.generate(
            prompts, config.samples, config.sampler, derive_seed(config.seed, "evaluate", model_version), model_version
        )
    finally:
        getattr(policy, "close", lambda: None)()
    sampler = json.dumps(config.sampler.model_dump())
    responses = pl.DataFrame(
        [
            {
                "response_id": f"eval-v{model_version}-{problem_id}-s{j}",
                "problem_id": problem_id,
                "sample_idx": j,
                "response": sample.text,
                "n_tokens": len(sample.token_ids),
                "finish_reason": sample.finish_reason,
            }
            for problem_id, group in zip(problems["problem_id"], groups)
            for j, sample in enumerate(group)
        ],
        schema_overrides={"sample_idx": pl.Int32, "n_tokens": pl.Int32},
    )
    scored = score_responses(responses, problems, settings.verify.model_copy(update={"verifier": None}), sampler)
    return summarise(scored, config, model_version, pinned_bank_version(lake), "own", sampler), scored.with_columns(
        model_version=pl.lit(model_version, pl.Int64), scoring=pl.lit("own")
    )


def rescore(
    lake: Lake, config: EvalConfig, settings: IterationConfig, model_version: int
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The version's stored held-out responses scored again, with `config.verifier`."""
    import pyarrow.compute as pc

    stored = (
        lake.read("eval_rollouts", filter=pc.field("model_version") == model_version)
        .unique("response_id", keep="first")
        .sort("response_id")
    )
    if stored.is_empty():
        raise ValueError(
            f"model version {model_version} has no stored held-out responses to re-score in {lake.uri}; "
            "evaluate it first (without evaluation.verifier)"
        )
    problems = lake.read("problems", filter=pc.field("problem_id").isin(stored["problem_id"].unique().to_list()))
    problems = problems.unique("problem_id")
    sampler = stored["sampler"][0] or "{}"
    responses = stored.select("response_id", "problem_id", "sample_idx", "response", "n_tokens", "finish_reason")
    scored = score_responses(
        responses, problems, settings.verify.model_copy(update={"verifier": config.verifier}), sampler
    )
    return summarise(
        scored, config, model_version, pinned_bank_version(lake), config.verifier, sampler
    ), scored.with_columns(model_version=pl.lit(model_version, pl.Int64), scoring=pl.lit(config.verifier))


def score_responses(responses: pl.DataFrame, problems: pl.DataFrame, verify, sampler: str) -> pl.DataFrame:
    """Each response with its verdict, source and level: the eval_rollouts rows (without version and scoring)."""
    frame = responses.with_columns(rollout_id=pl.col("response_id"), iteration=pl.lit(0, pl.Int64)).join(
        problems.select(PROBLEM_FIELDS), on="problem_id", how="left"
    )
    scored = score_rollouts(frame, verify).select(
        "rollout_id", "verifier", "verifier_version", "reward", "correct", "details"
    )
    return (
        responses.join(scored.rename({"rollout_id": "response_id"}), on="response_id", how="left")
        .join(problems.select("problem_id", "source", "level"), on="problem_id", how="left")
        .with_columns(sampler=pl.lit(sampler), created_at=pl.lit(datetime.now(UTC)))
    )


def summarise(
    scored: pl.DataFrame, config: EvalConfig, model_version: int, bank_version: int | None, scoring: str, sampler: str
) -> pl.DataFrame:
    """Per (source, level): problems, samples, solved, the solve rate (pass@1) and pass@k."""
    per_problem = scored.group_by("source", "level", "problem_id").agg(
        n=pl.len(), c=pl.col("correct").fill_null(False).sum()
    )
    per_problem = per_problem.with_columns(
        pass_at_k=pl.struct("n", "c").map_elements(
            lambda row: pass_at_k(row["n"], row["c"], min(config.k, row["n"])), return_dtype=pl.Float64
        )
    )
    by_cell = per_problem.group_by("source", "level").agg(
        problems=pl.len(), samples=pl.col("n").sum(), solved=pl.col("c").sum(), pass_at_k=pl.col("pass_at_k").mean()
    )
    return by_cell.with_columns(
        model_version=pl.lit(model_version, pl.Int64),
        split=pl.lit(config.split),
        bank_version=pl.lit(bank_version, pl.Int64),
        solve_rate=pl.col("solved") / pl.col("samples"),
        sampler=pl.lit(sampler),
        created_at=pl.lit(datetime.now(UTC)),
        k=pl.lit(config.k, pl.Int64),
        scoring=pl.lit(scoring),
    ).sort("source", "level")


def overall_solve_rate(evaluation: pl.DataFrame) -> float:
    return float(evaluation["solved"].sum() / max(int(evaluation["samples"].sum()), 1))
