"""`rlvr bench lake-scale`: what a long run's lake costs to write, query, store and keep in shape.

A synthetic run written through the loop's own write paths: each iteration is the stage runs the loop makes
(`rl-iteration` rollout and verify, `compute-advantages`, `train-policy`, `rl-loop` record), their rows
committed by `Lake.replace`; the advantage stage's own `scored_rollouts`, `compute` and `write` turn the
synthetic rewards into groups, advantages, the batch and the DBB state; each step registers a model version,
and `iteration_row` reads the iteration back into `iteration_metrics` as the loop does. Responses have
long-tailed lengths (log-normal, median `max_tokens / 24`, capped at `max_tokens`), with token ids and behaviour
log-probs stored as the rollout stage stores them; one group in four comes from the version before (the
staleness histogram has more than one bar).

Measured:
- bookkeeping per iteration: what does not grow with the iteration's rows but may with the lake's age — the
  stage runs' start and end rows, the stage keys' reads (run ids, the bank and model versions, the batch), the
  advantage stage's reads (the iteration's scored rollouts, the last DBB state) and `iteration_row`; the
  median over the five iterations ending at each checkpoint (10, 100, 1,000, 2,000 and the last);
- the standard analytics as `rlvr sql` wall times (a process each, as a user runs them) and `rlvr lineage
  model-version` of the last version, before and after `rlvr lake maintain --retention-hours 0`; beside them a
  `select 1` (a process's start-up: the floor of every command) and the lineage walk in-process;
- bytes: the iteration tables' live files against the same rows written once as plain zstd Parquet;
- S3: a second lake on moto's server (loopback) for `s3_iterations` iterations, its requests counted from
  moto's access log per iteration.

Maintenance runs on a schedule, as the `lake-maintenance` deployment runs it beside a loop: after every
`maintain_every` iterations (in between, not timed as bookkeeping; its own times are reported), with the
retention given (the synthetic run lasts hours, not the weeks a real retention spans).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from flows.display import console

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = ("bench/lake_scale.py", "storage/", "tasks/advantages/", "flows/stage_plans.py", "flows/loop_steps.py",
              "flows/cli/")

BIN = Path(sys.executable).parent
CHECKPOINTS = (10, 100, 1000, 2000)
WINDOW = 5                                     # iterations whose median bookkeeping a checkpoint reports
GROUP_SIZE = 16
LEVEL_SOLVE_RATE = {1: 0.8, 2: 0.55, 3: 0.3, 4: 0.1}
QUERIES = {
    "solve_rate_by_level": "select g.iteration, p.level, avg(g.solve_rate) as solve_rate from groups g join "
                           "(select distinct problem_id, level from problems) p using (problem_id) group by all "
                           "order by 1, 2",
    "filter_stats": "select * from filter_stats",
    "staleness_histogram": "select staleness, count(*) as rollouts from advantages group by 1 order by 1",
    "problem_history": "select r.iteration, count(*) as samples, avg(w.reward) as mean_reward from rollouts r join "
                       "rewards w using (rollout_id) where r.problem_id = '{problem}' group by 1 order by 1",
    "tokens_by_model_version": "select model_version, count(*) as rollouts, sum(n_tokens) as tokens from rollouts "
                               "group by 1 order by 1",
}
ITERATION_TABLES = ("rollouts", "rewards", "groups", "advantages", "batches", "dbb_state", "iteration_metrics")


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
    import numpy as np
    import polars as pl
    import pyarrow as pa

    groups = max(1, rollouts // GROUP_SIZE)
    picked = rng.choice(bank.height, size=min(groups, bank.height), replace=False)
    problem_ids = bank["problem_id"].gather(picked).to_list()
    solve = bank["solve_rate"].gather(picked).to_numpy()
    n = len(problem_ids) * GROUP_SIZE
    lengths = np.minimum(np.ceil(np.exp(rng.normal(np.log(max_tokens / 24), 1.0, n))), max_tokens).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    token_ids = (rng.zipf(1.3, int(offsets[-1])) % 151_000).astype(np.int32)
    logprobs = (-rng.exponential(0.6, int(offsets[-1]))).astype(np.float32)
    responses = [" ".join(words[token_ids[offsets[i]:offsets[i + 1]] % len(words)]) for i in range(n)]
    group_of = np.repeat(np.arange(len(problem_ids)), GROUP_SIZE)
    version = np.where(group_of % 4 == 3, max(iteration - 2, 0), iteration - 1)
    list_offsets = pa.array(offsets.astype(np.int32))
    ids = [f"{iteration}-{g}-{s}" for g in range(len(problem_ids)) for s in range(GROUP_SIZE)]
    rollout_rows = pl.from_arrow(pa.table({
        "rollout_id": ids, "iteration": pa.array(np.full(n, iteration, np.int64)),
        "problem_id": [problem_ids[g] for g in group_of], "group_id": [f"{iteration}:{problem_ids[g]}" for g in group_of],
        "sample_idx": pa.array(np.tile(np.arange(GROUP_SIZE, dtype=np.int32), len(problem_ids))),
        "round": pa.array(np.ones(n, np.int32)), "model_version": pa.array(version.astype(np.int64)),
        "prompt": [f"Problem {problem_ids[g]}: solve it and give the final answer." for g in group_of],
        "prompt_token_ids": pa.array([list(range(3, 67))] * n, pa.list_(pa.int32())),
        "response": responses,
        "response_token_ids": pa.ListArray.from_arrays(list_offsets, pa.array(token_ids)),
        "behaviour_logprobs": pa.ListArray.from_arrays(list_offsets, pa.array(logprobs)),
        "n_tokens": pa.array(lengths.astype(np.int32)),
        "finish_reason": np.where(lengths >= max_tokens, "length", "stop").tolist(),
        "self_certainty": rng.uniform(1, 5, n), "backend": ["openai http://gpu-1:8000"] * n,
        "sampler": ['{"max_new_tokens": %d, "temperature": 1.0}' % max_tokens] * n,
        "seed": pa.array(np.full(n, iteration, np.int64)),
    }))
    correct = rng.random(n) < solve[group_of]
    rewards = pl.DataFrame({"iteration": [iteration] * n, "rollout_id": ids,
                            "problem_id": rollout_rows["problem_id"], "verifier": ["math"] * n,
                            "verifier_version": ["1"] * n, "reward": correct.astype(float), "correct": correct,
                            "format_reward": np.ones(n), "details": ['{"extracted": "42"}'] * n})
    return rollout_rows, rewards


def write_iteration(lake, bank, rng, iteration: int, rollouts: int, max_tokens: int, words, work: Path) -> Clock:
    """One iteration as the loop writes it; returns where its time went."""
    import polars as pl

    from flows.loop_steps import iteration_row
    from flows.stage_plans import advantages_key, latest_bank_version, rollout_key, train_key, verify_key
    from storage.registry import latest_version, register
    from tasks.advantages.dynamic_sampling import DynamicSamplingConfig
    from tasks.advantages.stage import compute, latest_dbb_state, scored_rollouts, write
    from tasks.rollout.stage import IterationConfig
    from trainers.grpo import TrainConfig

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
            batch_id = write(lake, run, iteration, results)
    with clock.book():
        parameters = train_key(lake, TrainConfig(), iteration, version).parameters
    with stage_run(lake, clock, "train-policy", "train", parameters, iteration) as run, clock.write():
        register(lake, run, version + 1, uri=str(work / "checkpoints" / f"v{version + 1}"), kind="rl",
                 parent=version, iteration=iteration, batch_ids=[batch_id],
                 metrics={"loss": float(rng.normal(0, 0.01)), "clip_fraction": 0.01, "entropy": 0.5})
    with stage_run(lake, clock, "rl-loop", "record", {}, iteration) as run:
        with clock.book():
            row = iteration_row(lake, iteration, None)
        with clock.write():
            lake.replace("iteration_metrics", pl.DataFrame([row]), key, run)
    return clock


def off_policy_sums(rollout_rows, version: int):
    """What the off-policy-logprobs stage gives the advantage stage: each older rollout's behaviour log-prob sum
    and the current policy's (here: the behaviour's, nudged)."""
    import polars as pl

    older = rollout_rows.filter(pl.col("model_version") < version)
    behaviour = older["behaviour_logprobs"].list.sum().cast(pl.Float64)
    return pl.DataFrame({"rollout_id": older["rollout_id"], "behaviour_logprob_sum": behaviour,
                         "current_logprob_sum": behaviour * 0.98})


def seeded_lake(lake_uri: str, problems: int, seed: int):
    """A bank of generated problems, and version 0; returns the bank with each problem's true solve rate."""
    import polars as pl

    from flows.curation import curate_bank
    from storage.lake import Lake
    from storage.registry import register
    from tasks.curation.stage import bank_problems

    curate_bank({"sources": [{"kind": "generator", "generator": "mix", "count": problems, "seed": seed}]}, lake_uri)
    lake = Lake.open(lake_uri)
    with lake.run("rl-loop", "warmup", {}, iteration=0) as run:
        register(lake, run, 0, uri=f"{lake_uri}-checkpoints/v0", kind="base")
    bank = bank_problems(lake, None, "train").select("problem_id", "level")
    return lake, bank.with_columns(solve_rate=pl.col("level").replace_strict(LEVEL_SOLVE_RATE, return_dtype=pl.Float64))


def cli(*arguments: str, lake_uri: str, env: dict | None = None) -> float:
    """One `rlvr` command's wall time (it must succeed)."""
    started = time.perf_counter()
    result = subprocess.run([str(BIN / "rlvr"), *arguments, "--lake", lake_uri], capture_output=True, text=True,
                            env={**os.environ, **(env or {})}, timeout=600)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"rlvr {' '.join(arguments[:2])} failed: {result.stderr[-2000:]}")
    return seconds


def query_seconds(lake_uri: str, problem: str, last_version: int) -> dict[str, float]:
    seconds = {name: cli("sql", "--format", "json", sql.format(problem=problem), lake_uri=lake_uri)
               for name, sql in QUERIES.items()}
    seconds["lineage"] = cli("lineage", "model-version", str(last_version), lake_uri=lake_uri)
    return seconds


LINEAGE_WALK = """
import sys, time
from storage.lake import Lake
from storage.lineage import model_version_lineage
lake = Lake.open(sys.argv[1])
started = time.perf_counter()
model_version_lineage(lake, int(sys.argv[2]))
print(time.perf_counter() - started)
"""


def lineage_in_process(lake_uri: str, last_version: int) -> float:
    """The lineage walk itself, timed inside a fresh process (its imports and start-up not counted)."""
    result = subprocess.run([sys.executable, "-c", LINEAGE_WALK, lake_uri, str(last_version)], capture_output=True,
                            text=True, timeout=600, cwd=Path(__file__).resolve().parent.parent)
    if result.returncode != 0:
        raise RuntimeError(f"the lineage walk failed: {result.stderr[-2000:]}")
    return float(result.stdout.split()[-1])


def stored_bytes(lake, folder: Path) -> dict[str, dict[str, int]]:
    """Per iteration table: its live data files' bytes, its log's bytes, and the same rows written once as plain
    zstd Parquet."""
    import pyarrow.parquet as pq

    sizes = {}
    for name in ITERATION_TABLES:
        table = lake.table(name)
        actions = table.get_add_actions(flatten=True)
        log = Path(lake.location.table_uri(name)) / "_delta_log"
        plain = folder / f"{name}.parquet"
        pq.write_table(table.to_pyarrow_table(), plain, compression="zstd")
        sizes[name] = {"delta_bytes": int(sum(actions.column("size_bytes").to_pylist())),
                       "log_bytes": sum(f.stat().st_size for f in log.iterdir() if f.is_file()),
                       "plain_bytes": plain.stat().st_size, "files": actions.num_rows}
    return sizes


REQUEST = re.compile(r'"(GET|PUT|POST|HEAD|DELETE) ')


def s3_requests(iterations: int, rollouts: int, max_tokens: int, problems: int, seed: int, work: Path) -> dict:
    """Requests per iteration to an S3 lake (moto's server), counted in its access log."""
    import boto3
    import numpy as np

    from bench.moto import start_moto

    log = work / "moto.log"
    moto, endpoint = start_moto(log)
    aws = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true"}
    saved = {name: os.environ.get(name) for name in aws}
    os.environ.update(aws)
    try:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="lake-scale")
        lake, bank = seeded_lake("s3://lake-scale/lake", problems, seed)
        rng, words = np.random.default_rng(seed), vocabulary()
        per_iteration = []
        for iteration in range(1, iterations + 1):
            before = len(REQUEST.findall(log.read_text()))
            write_iteration(lake, bank, rng, iteration, rollouts, max_tokens, words, work)
            counted = REQUEST.findall(log.read_text())
            per_iteration.append({"requests": len(counted) - before})
        methods: dict[str, int] = {}
        for method in REQUEST.findall(log.read_text()):
            methods[method] = methods.get(method, 0) + 1
    finally:
        moto.terminate()
        moto.wait(10)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    counts = [entry["requests"] for entry in per_iteration]
    tail = counts[-min(5, len(counts)):]
    return {"iterations": iterations, "requests": counts, "requests_per_iteration": statistics.median(tail),
            "first_iteration_requests": counts[0], "requests_by_method": methods}


def vocabulary():
    import numpy as np

    syllables = ["ka", "lo", "mi", "ne", "ru", "ta", "vi", "so", "de", "pa", "x", "=", "+", "2", "7", "\\frac"]
    rng = np.random.default_rng(7)
    return np.array(["".join(rng.choice(syllables, size=rng.integers(1, 4))) for _ in range(4096)])


def run_benchmark(iterations: int = 2000, rollouts: int = 8192, max_tokens: int = 16384, problems: int = 0,
                  s3_iterations: int = 20, seed: int = 0, maintain_every: int = 10, retention_hours: float = 0.0) -> dict:
    import numpy as np

    from storage.maintenance import MaintenanceConfig, maintain
    from storage.registry import latest_version
    from tasks.progress import track

    problems = problems or max(400, 4 * rollouts // GROUP_SIZE)
    with tempfile.TemporaryDirectory(prefix="rlvr-bench-lake-scale-") as folder:
        work = Path(folder)
        lake_uri = str(work / "lake")
        lake, bank = seeded_lake(lake_uri, problems, seed)
        rng, words = np.random.default_rng(seed), vocabulary()
        checkpoints = sorted({c for c in CHECKPOINTS if c <= iterations} | {iterations})
        clocks, maintenances = [], []
        started = time.perf_counter()
        for iteration in track(range(1, iterations + 1), "lake-scale iterations", total=iterations):
            clocks.append(write_iteration(lake, bank, rng, iteration, rollouts, max_tokens, words, work))
            if maintain_every and iteration % maintain_every == 0:
                began = time.perf_counter()
                maintain(lake, MaintenanceConfig(retention_hours=retention_hours))
                maintenances.append(time.perf_counter() - began)
        write_seconds = time.perf_counter() - started - sum(maintenances)
        growth = []
        for checkpoint in checkpoints:
            window = clocks[max(0, checkpoint - WINDOW):checkpoint]
            growth.append({"iteration": checkpoint,
                           "bookkeeping_seconds": statistics.median(c.bookkeeping for c in window),
                           "write_seconds": statistics.median(c.writes for c in window)})
        stored_rollouts = lake.read("rollouts", columns=["n_tokens"])
        expected = iterations * min(max(1, rollouts // GROUP_SIZE), bank.height) * GROUP_SIZE
        if stored_rollouts.height != expected:
            raise RuntimeError(f"{expected:,} rollouts were written but {stored_rollouts.height:,} are in the lake")
        problem = bank["problem_id"][0]
        last = latest_version(lake)
        queries = query_seconds(lake_uri, problem, last)
        startup = cli("sql", "--format", "json", "select 1 as one", lake_uri=lake_uri)
        lineage_walk = lineage_in_process(lake_uri, last)
        sizes = stored_bytes(lake, work)
        maintenance_seconds = cli("lake", "maintain", "--retention-hours", "0", lake_uri=lake_uri)
        queries_after = query_seconds(lake_uri, problem, last)
        files_after = {name: len(lake.table(name).file_uris()) for name in ITERATION_TABLES}
        s3 = s3_requests(s3_iterations, rollouts, max_tokens, problems, seed, work) if s3_iterations else None
    delta = sum(entry["delta_bytes"] + entry["log_bytes"] for entry in sizes.values())
    plain = sum(entry["plain_bytes"] for entry in sizes.values())
    figures = {
        "iterations": iterations, "rollouts_per_iteration": stored_rollouts.height // iterations,
        "rollouts": stored_rollouts.height, "tokens": int(stored_rollouts["n_tokens"].sum()),
        "mean_response_tokens": float(stored_rollouts["n_tokens"].mean()), "problems": bank.height,
        "write_seconds": write_seconds, "bookkeeping": growth,
        "bookkeeping_growth": growth[-1]["bookkeeping_seconds"] / growth[0]["bookkeeping_seconds"],
        "queries_seconds": queries, "queries_seconds_after_maintenance": queries_after,
        "max_query_seconds": max(v for k, v in queries.items() if k != "lineage"),
        "max_query_seconds_after_maintenance": max(v for k, v in queries_after.items() if k != "lineage"),
        "lineage_seconds": queries["lineage"], "lineage_in_process_seconds": lineage_walk,
        "trivial_query_seconds": startup, "bytes": sizes, "maintenance_seconds": maintenance_seconds,
        "files_after_maintenance": files_after,
        "scheduled_maintenance": {"every": maintain_every, "retention_hours": retention_hours, "runs": len(maintenances),
                                  "first_seconds": maintenances[0] if maintenances else None,
                                  "last_seconds": maintenances[-1] if maintenances else None,
                                  "total_seconds": sum(maintenances)},
        "bytes_per_rollout": delta / stored_rollouts.height, "plain_bytes_per_rollout": plain / stored_rollouts.height,
        "bytes_ratio": delta / plain,
        "s3": s3, "s3_requests_per_iteration": s3["requests_per_iteration"] if s3 else None,
    }
    report(figures)
    return figures


def report(figures: dict) -> None:
    growth = ", ".join(f"iteration {g['iteration']}: {g['bookkeeping_seconds']:.2f} s" for g in figures["bookkeeping"])
    console.print(f"{figures['iterations']} iterations × {figures['rollouts_per_iteration']} rollouts "
                  f"({figures['rollouts']:,} rollouts, {figures['tokens']:,} tokens, mean "
                  f"{figures['mean_response_tokens']:.0f} a response) written in {figures['write_seconds']:.0f} s")
    console.print(f"bookkeeping per iteration: {growth} (×{figures['bookkeeping_growth']:.2f})")
    scheduled = figures["scheduled_maintenance"]
    if scheduled["runs"]:
        console.print(f"maintenance every {scheduled['every']} iterations: {scheduled['runs']} runs, the first "
                      f"{scheduled['first_seconds']:.2f} s, the last {scheduled['last_seconds']:.2f} s")
    console.print("rlvr sql: " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in figures["queries_seconds"].items())
                  + f"; after maintenance, the slowest {figures['max_query_seconds_after_maintenance']:.2f} s; "
                  f"`select 1` {figures['trivial_query_seconds']:.2f} s; the lineage walk in-process "
                  f"{figures['lineage_in_process_seconds']:.2f} s")
    console.print(f"storage: {figures['bytes_per_rollout']:,.0f} bytes a rollout, plain zstd Parquet "
                  f"{figures['plain_bytes_per_rollout']:,.0f} (×{figures['bytes_ratio']:.2f})")
    if figures["s3"]:
        console.print(f"S3: {figures['s3_requests_per_iteration']:.0f} requests an iteration (first "
                      f"{figures['s3']['first_iteration_requests']}), {json.dumps(figures['s3']['requests_by_method'])}")
