"""The supervised warm-up as a stage the loop runs before RL: the bank's worked solutions as examples, the
held-out solve rate the warm-up stops on (sampled as rollouts are, scored by the problems' own verifiers), the
optimiser's steps (`trainers/warmup.py`), and the version it registers (kind `warmup`)."""

from __future__ import annotations

import json

import polars as pl
import pyarrow.compute as pc

from policy.checkpoints import load_policy, save_checkpoint
from policy.hf import HFPolicy
from policy.prompts import format_prompt
from policy.sampling import SamplerConfig
from storage import faults
from storage.lake import Lake
from storage.registry import latest_version, next_version_number, register, version_row
from storage.runs import Run
from tasks.evaluation import evaluation_problems
from tasks.rollout.episodes import EpisodePolicy, PythonTool
from tasks.rollout.stage import training_bank
from tasks.verification.stage import PROBLEM_FIELDS, score_rollouts, verifier_pool
from trainers.warmup import warm_up


def warmup_version(lake: Lake) -> int | None:
    versions = lake.read("model_versions", filter=pc.field("kind") == "warmup", columns=["model_version"])
    return None if versions.is_empty() else int(versions["model_version"].max())


def warmup_bank(lake: Lake, mix) -> pl.DataFrame:
    """The training problems' worked solutions (problem_id, prompt, solution): every one of the mix's split and bank
    version, whatever subset RL draws (`mix.bank_size`), so that the warm-up does not memorise RL's problems."""
    whole = mix.model_copy(update={"bank_size": None})
    return lake.read(
        "problems",
        filter=pc.field("problem_id").isin(training_bank(lake, whole)["problem_id"].to_list()),
        columns=["problem_id", "prompt", "solution"],
    ).drop_nulls("solution")


def run_warmup(lake: Lake, run: Run, settings) -> dict:
    """Warm the base version up on the bank's worked solutions; register it as the next version (kind warmup).

    `settings` is the run config (rollout prompt and mix, evaluation set, warm-up).
    """

    config, prompt = settings.warmup, settings.rollout.prompt
    parent = latest_version(lake)
    parent_row = version_row(lake, parent)
    model, tokenizer = load_policy(parent_row["checkpoint_uri"], settings.rollout.sampling_device())
    bank = warmup_bank(lake, settings.rollout.mix)
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
        frame = held_out.select(PROBLEM_FIELDS).with_columns(
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
