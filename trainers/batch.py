"""What a training step reads: an iteration's batch joined with the token ids and behaviour log-probs it trains on
(read by the stage in one process, and by every rank of a distributed trainer for itself)."""

from __future__ import annotations

import json

import polars as pl
import pyarrow.compute as pc

from policy.sampling import sampled_temperature
from storage.lake import Lake

ROLLOUT_COLUMNS = ["rollout_id", "prompt_token_ids", "response_token_ids", "behaviour_logprobs", "sampler", "loss_mask"]


def training_rows(lake: Lake, iteration: int) -> tuple[pl.DataFrame, str | None]:
    """The latest batch of an iteration joined with the token ids and behaviour log-probs it trains on."""
    batch = lake.read("batches", filter=pc.field("iteration") == iteration)
    if batch.is_empty():
        return batch, None
    batch_id = batch["batch_id"][0]
    rollouts = lake.read(
        "rollouts",
        filter=(pc.field("iteration") == iteration) & pc.field("rollout_id").isin(batch["rollout_id"].to_list()),
        columns=ROLLOUT_COLUMNS,
    )
    rows = batch.join(rollouts, on="rollout_id", how="left")
    if rows["response_token_ids"].null_count() or rows["prompt_token_ids"].null_count():
        raise ValueError(f"iteration {iteration}: batch rollouts without token ids (was the backend asked for them?)")
    samplers = [json.loads(s or "{}") for s in rows["sampler"].to_list()]
    return rows.with_columns(
        temperature=pl.Series([sampled_temperature(s) for s in samplers], dtype=pl.Float64),
        max_new_tokens=pl.Series([s.get("max_new_tokens") for s in samplers], dtype=pl.Int64),
    ).drop("sampler"), batch_id
