"""The training stage over the lake: an iteration's batch → model version N+1 in the registry."""

from __future__ import annotations

import json

import polars as pl

from policy.checkpoints import adapter_base, load_policy, load_training_state, save_checkpoint
from storage import faults
from storage.lake import Lake
from storage.registry import BRANCH, latest_version, next_version_number, register, version_row
from storage.runs import Run
from trainers.batch import training_rows
from trainers.grpo import TrainConfig, strategy_of, train_on_batch
from trainers.trainable import trainable_policy
from trainers.workers import trainer_group


def train_iteration(lake: Lake, run: Run, iteration: int, config: TrainConfig, parent: int | None = None) -> dict:
    """Train `parent` (default: the latest version) on the iteration's batch and register the result as the
    next version number; an older parent makes a branch (kind `rl-branch`): its lineage is recorded like
    any other, but it never becomes the main line's latest version."""
    rows, batch_id = training_rows(lake, iteration)
    parent = parent if parent is not None else latest_version(lake)
    if parent is None:
        raise ValueError(f"no model version is registered in {lake.uri}: run an iteration first")
    if batch_id is None:
        return {"model_version": parent, "trained": False, "reason": f"iteration {iteration} kept no group"}
    parent_row = version_row(lake, parent)
    parent_uri = parent_row["checkpoint_uri"]
    reference_uri = version_row(lake, config.reference_version)["checkpoint_uri"] if config.beta else None
    if config.max_completion_length is None and rows["max_new_tokens"].max() is not None:
        # dr_grpo's constant is the generation limit, the same for every batch
        config = config.model_copy(update={"max_completion_length": int(rows["max_new_tokens"].max())})
    version = next_version_number(lake)
    if strategy_of(config) != "single":  # persistent ranks train; rank 0 writes the checkpoint
        stepped = trainer_group(config).step(lake.uri, iteration, parent_uri, version, config, reference_uri)
        uri, metrics = stepped["uri"], stepped["metrics"]
    else:
        model, tokenizer, adapter_of = trainable_policy(parent_uri, config)
        same_kind = (adapter_base(parent_uri) is not None) == (config.lora is not None)  # adapter state fits adapters
        optimizer_state = load_training_state(parent_uri) if same_kind else None
        reference = load_policy(reference_uri, config.device)[0] if reference_uri else None
        metrics, state = train_on_batch(model, rows, config, optimizer_state, reference)
        uri = save_checkpoint(lake, version, model, tokenizer, state, adapter_of)
    rows_seen = metrics.pop("mismatch_rows", [])  # one process's (ranks keep none)
    faults.point("checkpoint-saved:train")
    kind = "rl" if parent == latest_version(lake) else BRANCH  # an older parent: a branch, off the main line
    register(
        lake,
        run,
        version,
        uri=uri,
        kind=kind,
        parent=parent,
        iteration=iteration,
        batch_ids=[batch_id],
        metrics=metrics,
        architecture=json.loads(parent_row["architecture"] or "{}"),
    )
    mismatch = mismatch_frame(rows_seen, iteration, parent, version, config)
    return {"model_version": version, "trained": True, "batch_id": batch_id, **metrics, "mismatch": mismatch}


def mismatch_frame(
    rows: list[dict], iteration: int, parent: int, version: int, config: TrainConfig
) -> pl.DataFrame | None:
    """The `mismatch` table's rows of one step (trainers/mismatch.py), for the stage's run to commit; None when
    no process of this one saw them (several ranks)."""
    if not rows:
        return None
    return pl.DataFrame(rows, schema_overrides={"log_ratio": pl.List(pl.Float64)}).with_columns(
        iteration=pl.lit(iteration, pl.Int64),
        model_version=pl.lit(parent, pl.Int64),
        trained_version=pl.lit(version, pl.Int64),
        correction=pl.lit(config.correction().mode),
    )
