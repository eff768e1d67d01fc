"""`rlvr bench peer`: the project's loop against TRL's GRPOTrainer on the same learning work.

One warmed-up lake is made first (the learning config's bank and warm-up, version 1, and its
held-out evaluation). Then, for each seed, from that same checkpoint:

- **ours**: `rl_loop` for `steps` iterations in a copy of the lake, everything written as usual
  (rollouts, rewards, groups, advantages, batches, versions, lineage), evaluated every `eval_every`;
- **TRL**: a `GRPOTrainer` with the same prompts and training problems, G, prompts per step, `dapo`
  loss, clip ε 0.2 / 0.28, β 0, constant learning rate, one optimizer step per generation batch, the
  project's own verifier as its reward, and a copy of the weights kept every `eval_every` steps.

Every checkpoint of both is then scored by the same code (`tasks.evaluation.evaluate`: the same
held-out problems, samples and seed). RL wall time excludes evaluation on both sides: ours is the
loop's wall time less its evaluation runs; TRL's is `trainer.train()`. What a process pays once (Prefect's
temporary server, the model stack's imports) is paid before either side is timed. Printed side by side: mean
held-out accuracy at each checkpoint over the seeds, wall times, the ratio ours / TRL (target ≤ 1.5)
and the share of our wall time spent outside stage runs (target ≤ 10 %).
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time

import polars as pl
import pyarrow.compute as pc

from bench.warm import copy_of, started_once, warmed_once
from storage.lake import Lake
from bench.results import LOOP_CODE

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = ("bench/peer.py", "bench/warm.py", "configs/demo-learn.yaml", "configs/demo.yaml", *LOOP_CODE)

TARGET_RATIO = 1.5


def ours(config, base: str, seed: int, steps: int, eval_every: int) -> dict:
    """Our loop from the warmed version in a copy of `base`: {wall, rl_seconds, curve, stages, outside}."""
    from flows.loop import rl_loop

    lake_uri = copy_of(base, f"rlvr-peer-ours-{seed}-")
    settings = config.model_copy(deep=True)
    settings.rollout.seed, settings.train.seed, settings.loop.evaluate_every = seed, seed, eval_every
    started = time.perf_counter()
    rl_loop(settings.model_dump(mode="json"), steps, lake_uri)
    wall = time.perf_counter() - started
    lake = Lake.open(lake_uri)
    runs = lake.read("runs", filter=pc.field("iteration") > 0).with_columns(
        seconds=(pl.col("ended_at") - pl.col("started_at")).dt.total_microseconds() / 1e6)
    evaluation = float(runs.filter(pl.col("stage") == "evaluate")["seconds"].sum())
    stages = {stage: float(part["seconds"].sum()) for (stage,), part in runs.group_by("stage")
              if stage != "evaluate"}
    rl_seconds = wall - evaluation
    metrics = lake.read("iteration_metrics").filter(pl.col("eval_solve_rate").is_not_null()).sort("iteration")
    return {"wall": wall, "rl_seconds": rl_seconds, "stages": stages,
            "outside": 1 - sum(stages.values()) / rl_seconds,
            "curve": {int(i): float(r) for i, r in metrics.select("iteration", "eval_solve_rate").rows()}}


def trl(config, base: str, seed: int, steps: int, eval_every: int) -> dict:
    """TRL's GRPOTrainer from the warmed version: {rl_seconds, curve} (curve scored by our evaluation)."""
    import warnings

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from storage.registry import BRANCH, next_version_number, register, version_row
    from tasks.evaluation import evaluate, overall_solve_rate
    from tasks.rollout.prompts import format_prompt
    from tasks.rollout.stage import IterationConfig, training_bank
    from tasks.verification import PROBLEM_FIELDS, score_rollouts, verifier_pool
    from storage.checkpoints import load_policy, save_checkpoint
    from trainers.stage import warmup_version
    from storage.threads import use_given_cores

    lake = Lake.open(copy_of(base, f"rlvr-peer-trl-{seed}-"))
    warm = warmup_version(lake)
    model, tokenizer = load_policy(version_row(lake, warm)["checkpoint_uri"])
    use_given_cores()
    bank = training_bank(lake, config.rollout.mix)
    problems = {row["problem_id"]: row for row in bank.select(PROBLEM_FIELDS).iter_rows(named=True)}
    dataset = Dataset.from_dict({"prompt": [format_prompt(p, config.rollout.prompt, tokenizer) for p in bank["prompt"]],
                                 "problem_id": bank["problem_id"].to_list()})
    pool = None                                      # the verifier pool, open while TRL trains

    def reward(prompts, completions, problem_id, **_) -> list[float]:
        frame = pl.DataFrame([{**problems[pid], "rollout_id": str(i), "iteration": 0, "response": text}
                              for i, (pid, text) in enumerate(zip(problem_id, completions))])
        return score_rollouts(frame, config.verify, pool)["reward"].fill_null(0.0).to_list()

    group, prompts_per_step = config.rollout.group_size, config.dynamic_sampling.groups_per_batch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="rlvr-peer-trl-out-"), seed=seed, max_steps=steps,
                          per_device_train_batch_size=group * prompts_per_step, num_generations=group,
                          steps_per_generation=1, num_iterations=1,
                          max_completion_length=config.rollout.sampler.max_new_tokens,
                          temperature=config.rollout.sampler.temperature, top_p=1.0, top_k=0,
                          learning_rate=config.train.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
                          loss_type="dapo", epsilon=config.train.epsilon_low, epsilon_high=config.train.epsilon_high,
                          beta=0.0, use_cpu=True, report_to=[], logging_steps=10**9, save_strategy="no",
                          max_grad_norm=1.0, bf16=False, fp16=False, gradient_checkpointing=False,
                          disable_tqdm=True)
    kept: dict[int, dict] = {}

    class KeepWeights(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % eval_every == 0:
                kept[state.global_step] = copy.deepcopy(model.state_dict())

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[KeepWeights()])
    with verifier_pool(config.verify) as pool:
        started = time.perf_counter()
        trainer.train()
        rl_seconds = time.perf_counter() - started
    settings = IterationConfig.model_validate(config.model_dump(include=set(IterationConfig.model_fields)))
    curve = {}
    for step, weights in sorted(kept.items()):            # scored after training: not in TRL's wall time
        model.load_state_dict(weights)
        with lake.run("bench-peer", "register", {"peer": "trl", "seed": seed, "step": step}) as run:
            version = next_version_number(lake)
            register(lake, run, version, uri=save_checkpoint(lake, version, model, tokenizer), kind=BRANCH,
                     parent=warm, metrics={"peer": "trl", "seed": seed, "step": step})
        evaluation, _ = evaluate(lake, config.evaluation, settings, version)
        curve[step] = overall_solve_rate(evaluation)
    return {"rl_seconds": rl_seconds, "curve": curve}


def run_benchmark(config_path: str, steps: int, seeds: list[int], eval_every: int, work: str | None = None) -> dict:
    from rich.console import Console
    from rich.table import Table

    from flows.run_config import load_run_config

    console = Console()
    config = load_run_config(config_path)
    base = warmed_once(config_path, work or tempfile.mkdtemp(prefix="rlvr-bench-peer-"), console)
    warmed = Lake.open(base).read("iteration_metrics", filter=pc.field("iteration") == 0)
    start = float(warmed["eval_solve_rate"][0])
    started_once()
    results = {"ours": [], "trl": []}
    for seed in seeds:
        results["ours"].append(ours(config, base, seed, steps, eval_every))
        results["trl"].append(trl(config, base, seed, steps, eval_every))
        console.print(f"seed {seed}: ours {results['ours'][-1]['rl_seconds']:.1f} s, TRL "
                      f"{results['trl'][-1]['rl_seconds']:.1f} s")
    table = Table(title=f"held-out solve rate from the warm-up's {start:.1%}, mean over seeds {seeds}")
    table.add_column("step")
    table.add_column("ours")
    table.add_column("TRL GRPOTrainer")
    checkpoints = sorted(set(results["ours"][0]["curve"]) & set(results["trl"][0]["curve"]))
    means = {}
    for step in checkpoints:
        means[step] = {side: statistics.mean(r["curve"][step] for r in results[side]) for side in results}
        table.add_row(str(step), f"{means[step]['ours']:.1%}", f"{means[step]['trl']:.1%}")
    console.print(table)
    wall = {side: statistics.mean(r["rl_seconds"] for r in results[side]) for side in results}
    stages = {stage: statistics.mean(r["stages"].get(stage, 0.0) for r in results["ours"])
              for stage in results["ours"][0]["stages"]}
    outside = statistics.mean(r["outside"] for r in results["ours"])
    ratio = wall["ours"] / wall["trl"]
    console.print(f"RL wall time for {steps} steps (evaluation excluded): ours {wall['ours']:.1f} s, TRL "
                  f"{wall['trl']:.1f} s — ×{ratio:.2f} (target ≤ {TARGET_RATIO})")
    console.print("ours by stage: " + ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in sorted(stages.items()))
                  + f"; outside the stages {outside:.0%} (target ≤ 10 %)")
    ahead = all(means[step]["ours"] >= means[step]["trl"] for step in checkpoints)
    console.print(f"held-out accuracy ≥ TRL's at every checkpoint: {'yes' if ahead else 'no'}")
    return {"warmup_solve_rate": start, "means": means, "wall": wall, "ratio": ratio, "stages": stages,
            "outside": outside, "ahead_everywhere": ahead, "runs": results}
