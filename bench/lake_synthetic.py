"""The synthetic run `rlvr bench lake-scale` writes, through the loop's own write paths: each iteration is the
stage runs the loop makes (`rl-iteration` rollout and verify, `compute-advantages`, `train-policy`, `rl-loop`
record), their rows committed by `Lake.replace`; the advantage stage's own `scored_rollouts`, `compute` and
`write` turn the synthetic rewards into groups, advantages, the batch and the DBB state; each step registers a
model version, and `iteration_row` reads the iteration back into `iteration_metrics` as the loop does.

Responses have long-tailed lengths (log-normal, median `max_tokens / 24`, capped at `max_tokens`), with token ids
and behaviour log-probs stored as the rollout stage stores them; one group in four comes from the version before
(the staleness histogram has more than one bar). An iteration's rows are built and dropped within it: what the
run holds in memory does not grow with the lake.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from flows.curation import curate_bank
from flows.loop_steps import iteration_row
from flows.stage_plans import advantages_key, latest_bank_version, rollout_key, train_key, verify_key
from storage.lake import Lake
from storage.registry import latest_version, register
from tasks.advantages.stage import batch_id_of, batch_outputs, compute, latest_dbb_state, scored_rollouts
from tasks.curation.stage import bank_problems
from tasks.iteration import IterationConfig
from tasks.sampling.rounds import DynamicSamplingConfig
from trainers.grpo import TrainConfig

GROUP_SIZE = 16
LEVEL_SOLVE_RATE = {1: 0.8, 2: 0.55, 3: 0.3, 4: 0.1}


class Clock:
    """Seconds spent in bookkeeping and in row writes during one iteration."""

    def __init__(self):
        self.bookkeeping = self.writes = 0.0

    @contextmanager
    def book(self):
        started = time.perf_counter()
        yield
        self.bookkeeping += time.perf_counter() - started

    @contextmanager
    def write(self):
        started = time.perf_counter()
        yield
        self.writes += time.perf_counter() - started


@contextmanager
def stage_run(lake, clock: Clock, flow: str, stage: str, parameters: dict, iteration: int):
    """`lake.run`, its start and end rows timed as bookkeeping."""
    with clock.book():
        manager = lake.run(flow, stage, parameters, iteration=iteration)
        run = manager.__enter__()
    try:
        yield run
    except BaseException:
        manager.__exit__(*sys.exc_info())
        raise
    with clock.book():
        manager.__exit__(None, None, None)


def synthetic_iteration(rng, bank, iteration: int, rollouts: int, max_tokens: int, words):
    """One iteration's rollouts and rewards: groups of GROUP_SIZE over problems drawn from the bank."""
    groups = max(1, rollouts // GROUP_SIZE)
    picked = rng.choice(bank.height, size=min(groups, bank.height), replace=False)
    problem_ids = bank["problem_id"].gather(picked).to_list()
    solve = bank["solve_rate"].gather(picked).to_numpy()
    n = len(problem_ids) * GROUP_SIZE
    lengths = np.minimum(np.ceil(np.exp(rng.normal(np.log(max_tokens / 24), 1.0, n))), max_tokens).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    token_ids = (rng.zipf(1.3, int(offsets[-1])) % 151_000).astype(np.int32)
    logprobs = (-rng.exponential(0.6, int(offsets[-1]))).astype(np.float32)
    responses = [" ".join(words[token_ids[offsets[i] : offsets[i + 1]] % len(words)]) for i in range(n)]
    group_of = np.repeat(np.arange(len(problem_ids)), GROUP_SIZE)
    version = np.where(group_of % 4 == 3, max(iteration - 2, 0), iteration - 1)
    list_offsets = pa.array(offsets.astype(np.int32))
    ids = [f"{iteration}-{g}-{s}" for g in range(len(problem_ids)) for s in range(GROUP_SIZE)]
    rollout_rows = pl.from_arrow(
        pa.table(
            {
                "rollout_id": ids,
                "iteration": pa.array(np.full(n, iteration, np.int64)),
                "problem_id": [problem_ids[g] for g in group_of],
                "group_id": [f"{iteration}:{problem_ids[g]}" for g in group_of],
                "sample_idx": pa.array(np.tile(np.arange(GROUP_SIZE, dtype=np.int32), len(problem_ids))),
                "round": pa.array(np.ones(n, np.int32)),
                "model_version": pa.array(version.astype(np.int64)),
                "prompt": [f"Problem {problem_ids[g]}: solve it and give the final answer." for g in group_of],
                "prompt_token_ids": pa.array([list(range(3, 67))] * n, pa.list_(pa.int32())),
                "response": responses,
                "response_token_ids": pa.ListArray.from_arrays(list_offsets, pa.array(token_ids)),
                "behaviour_logprobs": pa.ListArray.from_arrays(list_offsets, pa.array(logprobs)),
                "n_tokens": pa.array(lengths.astype(np.int32)),
                "finish_reason": np.where(lengths >= max_tokens, "length", "stop").tolist(),
                "self_certainty": rng.uniform(1, 5, n),
                "backend": ["openai http://gpu-1:8000"] * n,
                "sampler": [f'{{"max_new_tokens": {max_tokens}, "temperature": 1.0}}'] * n,
                "seed": pa.array(np.full(n, iteration, np.int64)),
            }
        )
    )
    correct = rng.random(n) < solve[group_of]
    rewards = pl.DataFrame(
        {
            "iteration": [iteration] * n,
            "rollout_id": ids,
            "problem_id": rollout_rows["problem_id"],
            "verifier": ["math"] * n,
            "verifier_version": ["1"] * n,
            "reward": correct.astype(float),
            "correct": correct,
            "format_reward": np.ones(n),
            "details": ['{"extracted": "42"}'] * n,
        }
    )
    return rollout_rows, rewards


def write_iteration(lake, bank, rng, iteration: int, rollouts: int, max_tokens: int, words, work: Path) -> Clock:
    """One iteration as the loop writes it; returns where its time went."""
    clock, key = Clock(), {"iteration": iteration}
    settings = IterationConfig()
    rollout_rows, rewards = synthetic_iteration(rng, bank, iteration, rollouts, max_tokens, words)
    with clock.book():
        version = latest_version(lake)
        parameters = rollout_key(settings, version, latest_bank_version(lake)).parameters
    with stage_run(lake, clock, "rl-iteration", "rollout", parameters, iteration) as run, clock.write():
        lake.replace("rollouts", rollout_rows, key, run)
        for table in ("groups", "advantages", "batches", "dbb_state"):
            lake.clear(table, key, run)
    with clock.book():
        parameters = verify_key(lake, settings.verify, iteration, "rl-iteration", [run.run_id]).parameters
    with stage_run(lake, clock, "rl-iteration", "verify", parameters, iteration) as run, clock.write():
        lake.replace("rewards", rewards, key, run)
    with clock.book():
        parameters = advantages_key(lake, settings, iteration, version).parameters
    sampling = DynamicSamplingConfig(groups_per_batch=max(1, rollouts // GROUP_SIZE // 2))
    with stage_run(lake, clock, "compute-advantages", "advantages", parameters, iteration) as run:
        with clock.book():
            scored, state = scored_rollouts(lake, iteration, None), latest_dbb_state(lake, iteration)
        results = compute(scored, settings.advantages, sampling, version, state, off_policy_sums(rollout_rows, version))
        with clock.write():
            batch_id = batch_id_of(iteration, run)
            lake.commit(batch_outputs(iteration, results, batch_id), run)
    with clock.book():
        parameters = train_key(lake, TrainConfig(), iteration, version).parameters
    with stage_run(lake, clock, "train-policy", "train", parameters, iteration) as run, clock.write():
        register(
            lake,
            run,
            version + 1,
            uri=str(work / "checkpoints" / f"v{version + 1}"),
            kind="rl",
            parent=version,
            iteration=iteration,
            batch_ids=[batch_id],
            metrics={"loss": float(rng.normal(0, 0.01)), "clip_fraction": 0.01, "entropy": 0.5},
        )
    with stage_run(lake, clock, "rl-loop", "record", {}, iteration) as run:
        with clock.book():
            row = iteration_row(lake, iteration, None)
        with clock.write():
            lake.replace("iteration_metrics", pl.DataFrame([row]), key, run)
    return clock


def off_policy_sums(rollout_rows, version: int):
    """What the off-policy-logprobs stage gives the advantage stage: each older rollout's behaviour log-prob sum
    and the current policy's (here: the behaviour's, nudged)."""
    older = rollout_rows.filter(pl.col("model_version") < version)
    behaviour = older["behaviour_logprobs"].list.sum().cast(pl.Float64)
    return pl.DataFrame(
        {"rollout_id": older["rollout_id"], "behaviour_logprob_sum": behaviour, "current_logprob_sum": behaviour * 0.98}
    )


def seeded_lake(lake_uri: str, problems: int, seed: int):
    """A bank of generated problems, and version 0; returns the bank with each problem's true solve rate."""
    curate_bank({"sources": [{"kind": "generator", "generator": "mix", "count": problems, "seed": seed}]}, lake_uri)
    lake = Lake.open(lake_uri)
    with lake.run("rl-loop", "warmup", {}, iteration=0) as run:
        register(lake, run, 0, uri=f"{lake_uri}-checkpoints/v0", kind="base")
    bank = bank_problems(lake, None, "train").select("problem_id", "level")
    return lake, bank.with_columns(solve_rate=pl.col("level").replace_strict(LEVEL_SOLVE_RATE, return_dtype=pl.Float64))


def vocabulary():

    syllables = ["ka", "lo", "mi", "ne", "ru", "ta", "vi", "so", "de", "pa", "x", "=", "+", "2", "7", "\\frac"]
    rng = np.random.default_rng(7)
    return np.array(["".join(rng.choice(syllables, size=rng.integers(1, 4))) for _ in range(4096)])
