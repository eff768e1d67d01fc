"""Samples as rows of the `rollouts` table: one row per sample, ids in draw order (group
`i00003-r02-g000007` is the 8th group of round 2 of iteration 3). The rollout and self-play stages both write them."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import polars as pl

from policy.sampling import Sample


def rollout_rows(
    problems: pl.DataFrame,
    prompts: list[str],
    groups: list[list[Sample]],
    *,
    iteration: int,
    round_: int,
    model_version: int,
    sampler: dict,
    seed: int,
) -> pl.DataFrame:
    """One row per sample, in the `rollouts` contract."""
    now = datetime.now(UTC)
    rows = []
    for k, (problem_id, prompt, samples) in enumerate(zip(problems["problem_id"], prompts, groups)):
        group_id = f"i{iteration:05d}-r{round_:02d}-g{k:06d}"
        for index, sample in enumerate(samples):
            rows.append(
                {
                    "rollout_id": f"{group_id}-s{index:02d}",
                    "iteration": iteration,
                    "problem_id": problem_id,
                    "group_id": group_id,
                    "sample_idx": index,
                    "round": round_,
                    "model_version": model_version,
                    "prompt": prompt,
                    "prompt_token_ids": sample.prompt_token_ids,
                    "response": sample.text,
                    "response_token_ids": sample.token_ids,
                    "behaviour_logprobs": sample.logprobs,
                    "finish_reason": sample.finish_reason,
                    "self_certainty": sample.self_certainty,
                    "backend": sample.backend,
                    "n_tokens": sum(sample.loss_mask) if sample.loss_mask is not None else len(sample.token_ids),
                    "loss_mask": sample.loss_mask,
                    "tool_calls": sample.tool_calls,
                    "tool_errors": sample.tool_errors,
                    "turns": None if sample.turns is None else json.dumps(sample.turns, ensure_ascii=False),
                    "sampler": json.dumps(sampler, sort_keys=True),
                    "seed": seed,
                    "created_at": now,
                }
            )
    return pl.DataFrame(
        rows,
        schema_overrides={
            "self_certainty": pl.Float64,
            "round": pl.Int32,
            "sample_idx": pl.Int32,
            "n_tokens": pl.Int32,
            "prompt_token_ids": pl.List(pl.Int32),
            "response_token_ids": pl.List(pl.Int32),
            "behaviour_logprobs": pl.List(pl.Float32),
            "loss_mask": pl.List(pl.Int8),
            "tool_calls": pl.Int32,
            "tool_errors": pl.Int32,
            "turns": pl.String,
        },
    )
