"""What one of ours' runs in the peer benchmark (`bench/peer.py`) left in its lake: rollouts sampled per kept group
and per step, what selection drew, retired and revisited, and whether every row is there."""

from __future__ import annotations

import polars as pl
import pyarrow.compute as pc

from storage.lake import Lake


def sampling_drawn(lake: Lake, steps: int) -> dict:
    """Rollouts sampled per kept group and per optimizer step, and generation rounds per step, from `groups`."""
    groups = lake.read("groups", filter=pc.field("iteration") > 0, columns=["iteration", "round", "n_samples", "kept"])
    sampled, kept = int(groups["n_samples"].sum()), int(groups["kept"].sum())
    rounds = groups.group_by("iteration").agg(pl.col("round").max())["round"]
    return {
        "rollouts": sampled,
        "kept_groups": kept,
        "per_kept_group": sampled / max(kept, 1),
        "per_step": sampled / steps,
        "rounds_per_step": float(rounds.mean()),
    }


def selected(lake: Lake, settings, steps: int) -> dict:
    """What selection did: problems drawn again as revisits over the run, and the training problems retired and
    set aside as predicted-uniform by the ledger after the last step (what a next step would pass over)."""
    from tasks.iteration import bank_labels
    from tasks.rollout.stage import training_bank

    rollouts = lake.read("rollouts", filter=pc.field("iteration") > 0, columns=["iteration", "problem_id", "drawn_as"])
    drawn = rollouts.unique(["iteration", "problem_id"])
    bank = training_bank(lake, settings.rollout.mix)
    labels = bank_labels(lake, settings, bank, steps + 1)
    final = labels["drawn_as"].value_counts() if labels is not None else pl.DataFrame({"drawn_as": [], "count": []})
    counts = dict(final.rows())
    return {
        "revisited": int((drawn["drawn_as"] == "revisit").sum()),
        "bank_problems": bank.height,
        "distinct_problems_drawn": drawn["problem_id"].n_unique(),
        "retired_at_end": int(counts.get("retired", 0)),
        "predicted_uniform_at_end": int(counts.get("predicted_uniform", 0)),
    }


def lake_intact(lake: Lake, steps: int) -> bool:
    """Every sampled rollout stored with its reward, and one RL version per step, each the child of the last."""
    groups = lake.read("groups", filter=pc.field("iteration") > 0, columns=["n_samples"])
    rollouts = lake.read("rollouts", filter=pc.field("iteration") > 0, columns=["rollout_id"])
    rewards = lake.read("rewards", filter=pc.field("iteration") > 0, columns=["rollout_id"])
    versions = (
        lake.read("model_versions", columns=["model_version", "parent_version", "kind"])
        .filter(pl.col("kind") == "rl")
        .sort("model_version")
    )
    chained = versions["parent_version"].to_list() == (versions["model_version"] - 1).to_list()
    return (
        rollouts.height == int(groups["n_samples"].sum()) == rewards["rollout_id"].n_unique()
        and versions.height == steps
        and chained
    )
