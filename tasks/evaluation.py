"""Evaluation: the sampled solve rate of a model version on held-out problems, per source and level.

The same problems every time (a seeded draw from the eval split), sampled at temperature 1 by
default, because the RL loop's claim is about the policy's sampled behaviour, not its greedy one.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import polars as pl
from pydantic import Field

from storage.lake import Lake
from tasks.curation.config import Strict
from tasks.curation.mix import sample_mix
from tasks.curation.stage import bank_problems
from tasks.generators.base import derive_seed
from tasks.rollout.prompts import format_prompt
from tasks.rollout.sampling import SamplerConfig
from tasks.rollout.stage import IterationConfig, open_policy
from tasks.verification import PROBLEM_FIELDS, score_rollouts


class EvalConfig(Strict):
    """Which held-out problems, and how responses are sampled for them."""

    split: str = Field("eval", description="bank split to evaluate on")
    max_problems: int = Field(500, ge=1, description="problems per evaluation (the same ones each time)")
    samples_per_problem: int = Field(1, ge=1, description="sampled responses per problem")
    level_weights: dict[int, float] | None = Field(None, description="level mix of the drawn problems; default: "
                                                   "the split's own")
    sampler: SamplerConfig = Field(default_factory=lambda: SamplerConfig(max_new_tokens=64),
                                   description="sampling of the evaluated responses (temperature 1 by default)")
    seed: int = Field(0, description="seed of the problem draw and of sampling")
    sources: list[str] | None = Field(None, description="evaluate only these held-out sources (e.g. gsm8k_test, "
                                      "math500, aime2024); default: every source of the split")
    per_source: int | None = Field(None, ge=1, description="draw up to this many problems from each source on its "
                                   "own (small sets like AIME are then taken whole); default: one draw of "
                                   "max_problems over the split")


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
            raise ValueError(f"evaluation.sources names {sorted(unknown)}, not {config.split} sources of the bank "
                             f"(it has {sorted(problems['source'].unique().to_list())})")
        problems = problems.filter(pl.col("source").is_in(config.sources))
    if config.per_source is None:
        return _level_draw(problems, config.max_problems, config)
    return pl.concat([_level_draw(part, config.per_source, config)
                      for _, part in problems.sort("source").group_by("source", maintain_order=True)])


def _level_draw(problems: pl.DataFrame, count: int, config: EvalConfig) -> pl.DataFrame:
    weights = config.level_weights or {int(level): float(n) for level, n in problems.group_by("level").len().rows()}
    return sample_mix(problems.sort("problem_id"), min(count, problems.height), config.seed, weights)


def evaluate(lake: Lake, config: EvalConfig, settings: IterationConfig, model_version: int) -> pl.DataFrame:
    """Solve rate per (source, level) of `model_version` on the evaluation problems (no run id yet)."""
    problems = evaluation_problems(lake, config)
    policy, tokenizer = open_policy(lake, settings.rollout, model_version)
    try:
        prompts = [format_prompt(text, settings.rollout.prompt, tokenizer) for text in problems["prompt"]]
        groups = policy.generate(prompts, config.samples_per_problem, config.sampler,
                                 derive_seed(config.seed, "evaluate", model_version), model_version)
    finally:
        getattr(policy, "close", lambda: None)()
    responses = pl.DataFrame([{"rollout_id": f"eval-{i}-{j}", "iteration": 0, "problem_id": problem_id,
                               "response": sample.text}
                              for i, (problem_id, group) in enumerate(zip(problems["problem_id"], groups))
                              for j, sample in enumerate(group)])
    scored = score_rollouts(responses.join(problems.select(PROBLEM_FIELDS), on="problem_id", how="left"),
                            settings.verify)
    solved = responses.select("rollout_id", "problem_id").join(scored.select("rollout_id", "correct"), on="rollout_id")
    by_cell = (solved.join(problems.select("problem_id", "source", "level"), on="problem_id")
               .group_by("source", "level").agg(problems=pl.col("problem_id").n_unique(), samples=pl.len(),
                                                solved=pl.col("correct").fill_null(False).sum()))
    return by_cell.with_columns(
        model_version=pl.lit(model_version, pl.Int64), split=pl.lit(config.split),
        bank_version=pl.lit(pinned_bank_version(lake), pl.Int64),
        solve_rate=pl.col("solved") / pl.col("samples"), sampler=pl.lit(json.dumps(config.sampler.model_dump())),
        created_at=pl.lit(datetime.now(timezone.utc))).sort("source", "level")


def overall_solve_rate(evaluation: pl.DataFrame) -> float:
    return float(evaluation["solved"].sum() / max(int(evaluation["samples"].sum()), 1))
