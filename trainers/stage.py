"""The training stage over the lake: an iteration's batch → model version N+1 in the registry."""

from __future__ import annotations

import json

import polars as pl
import pyarrow.compute as pc

from storage.lake import Lake
from storage.runs import Run
from trainers.grpo import TrainConfig, batch_temperature, train_on_batch
from trainers.registry import latest_version, load_policy, load_training_state, register, save_checkpoint, version_row

ROLLOUT_COLUMNS = ["rollout_id", "prompt_token_ids", "response_token_ids", "behaviour_logprobs", "sampler"]


def training_rows(lake: Lake, iteration: int) -> tuple[pl.DataFrame, str | None]:
    """The latest batch of an iteration joined with the token ids and behaviour log-probs it trains on."""
    batch = lake.read("batches", filter=pc.field("iteration") == iteration)
    if batch.is_empty():
        return batch, None
    batch_id = batch["batch_id"][0]
    rollouts = lake.read("rollouts", filter=(pc.field("iteration") == iteration)
                         & pc.field("rollout_id").isin(batch["rollout_id"].to_list()), columns=ROLLOUT_COLUMNS)
    rows = batch.join(rollouts, on="rollout_id", how="left")
    if rows["response_token_ids"].null_count() or rows["prompt_token_ids"].null_count():
        raise ValueError(f"iteration {iteration}: batch rollouts without token ids (was the backend asked for them?)")
    temperature = pl.Series([batch_temperature(s) for s in rows["sampler"].to_list()], dtype=pl.Float64)
    return rows.with_columns(temperature=temperature).drop("sampler"), batch_id


def train_iteration(lake: Lake, run: Run, iteration: int, config: TrainConfig) -> dict:
    """Train the latest version on the iteration's batch and register the result as the next version."""
    rows, batch_id = training_rows(lake, iteration)
    parent = latest_version(lake)
    if parent is None:
        raise ValueError(f"no model version is registered in {lake.uri}: run an iteration first")
    if batch_id is None:
        return {"model_version": parent, "trained": False, "reason": f"iteration {iteration} kept no group"}
    parent_row = version_row(lake, parent)
    parent_uri = parent_row["checkpoint_uri"]
    model, tokenizer = load_policy(parent_uri, config.device)
    reference = None
    if config.beta:
        reference, _ = load_policy(version_row(lake, config.reference_version)["checkpoint_uri"], config.device)
    metrics, state = train_on_batch(model, rows, config, load_training_state(parent_uri), reference)
    version = parent + 1
    uri = save_checkpoint(lake, version, model, tokenizer, state)
    register(lake, run, version, uri=uri, kind="rl", parent=parent, iteration=iteration, batch_ids=[batch_id],
             metrics=metrics, architecture=json.loads(parent_row["architecture"] or "{}"))
    return {"model_version": version, "trained": True, "batch_id": batch_id, **metrics}

