"""The training stage over the lake: an iteration's batch → model version N+1 in the registry."""

from __future__ import annotations

import json

import polars as pl
import pyarrow.compute as pc

from policy.checkpoints import adapter_base, load_policy, load_training_state, save_checkpoint
from policy.hf import HFPolicy
from policy.prompts import format_prompt
from policy.sampling import SamplerConfig
from storage import faults
from storage.lake import Lake
from storage.registry import BRANCH, latest_version, next_version_number, register, version_row
from storage.runs import Run
from tasks.evaluation import evaluation_problems
from tasks.rollout.episodes import EpisodePolicy, PythonTool
from tasks.rollout.stage import training_bank
from tasks.verification.stage import score_rollouts, verifier_pool
from trainers.batch import training_rows
from trainers.grpo import TrainConfig, strategy_of, train_on_batch
from trainers.trainable import trainable_policy
from trainers.warmup import warm_up
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
    return {"model_version": version, "trained": True, "batch_id": batch_id, **metrics}


def warmup_version(lake: Lake) -> int | None:
    versions = lake.read("model_versions", filter=pc.field("kind") == "warmup", columns=["model_version"])
    return None if versions.is_empty() else int(versions["model_version"].max())


def run_warmup(lake: Lake, run: Run, settings) -> dict:
    """Warm the base version up on the bank's worked solutions; register it as the next version (kind warmup).

    `settings` is the run config (rollout prompt and mix, evaluation set, warm-up).
    """

    config, prompt = settings.warmup, settings.rollout.prompt
    parent = latest_version(lake)
    parent_row = version_row(lake, parent)
    model, tokenizer = load_policy(parent_row["checkpoint_uri"], settings.rollout.sampling_device())
    bank = lake.read(
        "problems",
        filter=pc.field("problem_id").isin(training_bank(lake, settings.rollout.mix)["problem_id"].to_list()),
        columns=["prompt", "solution"],
    ).drop_nulls("solution")
    if bank.is_empty():
        raise ValueError("warm-up needs training problems with worked solutions; the bank has none")
    examples = bank.select(
        prompt=pl.col("prompt").map_elements(
            lambda text: format_prompt(text, prompt, tokenizer), return_dtype=pl.String
        ),
        target="solution",
    )
    held_out = evaluation_problems(lake, settings.evaluation).head(config.eval_problems)
    eval_prompts = [format_prompt(text, prompt, tokenizer) for text in held_out["prompt"]]
    sampler = SamplerConfig(max_new_tokens=config.max_new_tokens)
    tools = settings.rollout.tools
    tool = PythonTool(tools.seconds) if tools.enabled else None  # held-out episodes call tools as rollouts do

    def solve_rate(current) -> float:
        policy = HFPolicy(current, tokenizer, parent, settings.rollout.batch_size)
        if tool is not None:
            policy = EpisodePolicy(policy, tokenizer, tools, tool)
        samples = policy.generate(eval_prompts, 1, sampler, config.seed, parent)
        frame = held_out.select(
            "problem_id",
            "domain",
            "prompt",
            "answer",
            "tests",
            "entry_point",
            "verifier",
            "steps",
            "metadata",
            "params",
        ).with_columns(
            rollout_id=pl.Series([str(i) for i in range(held_out.height)]),
            iteration=pl.lit(0),
            response=pl.Series([group[0].text for group in samples]),
        )
        scored = score_rollouts(frame, truth, pool)
        return float(scored["correct"].fill_null(False).mean())

    def report(step: int, loss: float, rate: float | None) -> None:
        if rate is not None:
            print(f"warm-up step {step}: loss {loss:.3f}, held-out sampled solve rate {rate:.1%}")

    truth = settings.verify.model_copy(update={"verifier": None})  # the problems' own verifiers, as evaluation
    try:
        with verifier_pool(truth) as pool:
            metrics = warm_up(model, tokenizer, examples, config, solve_rate, report)
    finally:
        if tool is not None:
            tool.close()
    if metrics["overshoot"]:
        print(
            f"warm-up overshot the band: {metrics['solve_rate']:.1%} > {config.band[1]:.0%} at the first measurement "
            f"inside it; evaluate more often (warmup.evaluate_every) to stop nearer the band"
        )
    version = next_version_number(lake)
    uri = save_checkpoint(lake, version, model, tokenizer)
    faults.point("checkpoint-saved:warmup")
    register(
        lake,
        run,
        version,
        uri=uri,
        kind="warmup",
        parent=parent,
        metrics=metrics,
        architecture=json.loads(parent_row["architecture"] or "{}"),
    )
    return {"model_version": version, **metrics}
