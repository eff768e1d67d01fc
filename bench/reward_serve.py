"""`rlvr bench reward-serve`: rewards a second and latency through `rlvr reward serve` over HTTP, with every reward
written to the lake, against scoring the same responses in-process with the same verifier processes (no HTTP,
no lake): what a trainer pays for the platform's reward server and its lineage.

A bank of generated math problems; `samples` responses each (half right, half wrong), sent as OpenRLHF sends them
(one response a request, `clients` requests in flight at once) and as batches of `batch` responses to the native
endpoint. The server's rows are counted in the lake afterwards: every acknowledged reward must be there.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from flows.display import console

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = (
    "bench/reward_serve.py",
    "tasks/interop/",
    "tasks/verification/stage.py",
    "tasks/verifiers/",
    "storage/",
    "flows/cli/interop.py",
)

BIN = Path(sys.executable).parent


def start_server(lake_uri: str, *options: str) -> tuple[subprocess.Popen, str]:
    """`rlvr reward serve` on a free port, in a session of its own (killed with its verifier processes as one
    group); its address read from the line it prints, its output drained from then on."""
    process = subprocess.Popen(
        [str(BIN / "rlvr"), "reward", "serve", "--lake", lake_uri, "--port", "0", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "300"},
    )
    seen = []
    for line in process.stdout:
        seen.append(line)
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        if found:
            threading.Thread(target=process.stdout.read, daemon=True).start()
            return process, found.group(1)
    process.wait(10)
    raise RuntimeError("rlvr reward serve did not start:\n" + "".join(seen))


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def run_benchmark(problems: int = 200, samples: int = 8, clients: int = 64, batch: int = 64, workers: int = 2) -> dict:
    import polars as pl

    from flows.curation import curate_bank
    from storage.lake import Lake
    from tasks.curation.stage import bank_problems
    from tasks.verification.stage import VerifyConfig, score_rollouts, verifier_pool

    with tempfile.TemporaryDirectory(prefix="rlvr-bench-reward-serve-") as work:
        lake_uri = f"{work}/lake"
        curate_bank(
            {"sources": [{"kind": "generator", "generator": "mix", "count": problems * 2, "seed": 0}]}, lake_uri
        )
        lake = Lake.open(lake_uri)
        bank = bank_problems(lake, None, "train").filter(pl.col("domain") == "math").head(problems)
        items = [
            (row, f"Working.\n#### {row['answer'] if s % 2 == 0 else 'no'}")
            for row in bank.iter_rows(named=True)
            for s in range(samples)
        ]

        frame = pl.DataFrame(
            [
                {**row, "rollout_id": str(i), "iteration": 0, "response": response}
                for i, (row, response) in enumerate(items)
            ],
            infer_schema_length=None,
        )
        config = VerifyConfig(workers=workers)
        with verifier_pool(config) as pool:
            score_rollouts(frame.head(16), config, pool)  # warm: the workers' imports are not scoring
            started = time.perf_counter()
            in_process = score_rollouts(frame, config, pool)
            in_process_seconds = time.perf_counter() - started
        expected = in_process["reward"].to_list()

        server, url = start_server(
            lake_uri, "--run", "bench", "--workers", str(workers), "--rollouts-per-step", str(len(items))
        )
        try:
            with httpx.Client(timeout=120, limits=httpx.Limits(max_connections=clients)) as client:

                def one(index: int) -> tuple[float, float]:
                    row, response = items[index]
                    prompt = f"<|user|>\n{row['prompt']}\n<|assistant|>\n"
                    sent = time.perf_counter()
                    answer = client.post(
                        f"{url}/get_reward",
                        json={"query": [prompt + response], "prompts": [prompt], "labels": [row["answer"]]},
                    )
                    answer.raise_for_status()
                    return time.perf_counter() - sent, answer.json()["rewards"][0]

                one(0)  # warm: the first request starts the workers
                started = time.perf_counter()
                with ThreadPoolExecutor(clients) as threads:
                    answered = list(threads.map(one, range(len(items))))
                single_seconds = time.perf_counter() - started

                def batched(start: int) -> float:
                    chunk = items[start : start + batch]
                    sent = time.perf_counter()
                    answer = client.post(
                        f"{url}/v1/rewards",
                        json={
                            "run": "bench-batched",
                            "step": 10,
                            "model": "m",
                            "items": [
                                {"prompt": row["prompt"], "response": r, "label": row["answer"]} for row, r in chunk
                            ],
                        },
                    )
                    answer.raise_for_status()
                    return time.perf_counter() - sent

                started = time.perf_counter()
                with ThreadPoolExecutor(max(1, clients // 4)) as threads:
                    batch_latency = list(threads.map(batched, range(0, len(items), batch)))
                batched_seconds = time.perf_counter() - started
        finally:
            server.terminate()
            server.wait(30)
        stored = lake.read("rollouts", columns=["run_id"]).height
        runs = lake.read("runs", columns=["flow", "stage"])
        commits = runs.filter(pl.col("stage") == "reward").height

    latency = [seconds for seconds, _ in answered]
    agree = sum(reward == expected[i] for i, (_, reward) in enumerate(answered))
    figures = {
        "responses": len(items),
        "clients": clients,
        "batch": batch,
        "workers": workers,
        "in_process_rewards_per_second": len(items) / in_process_seconds,
        "http_rewards_per_second": len(items) / single_seconds,
        "http_batched_rewards_per_second": len(items) / batched_seconds,
        "http_to_in_process_ratio": (len(items) / single_seconds) / (len(items) / in_process_seconds),
        "batched_to_in_process_ratio": (len(items) / batched_seconds) / (len(items) / in_process_seconds),
        "p50_latency_seconds": statistics.median(latency),
        "p99_latency_seconds": percentile(latency, 0.99),
        "p99_batch_latency_seconds": percentile(batch_latency, 0.99),
        "group_commits": commits,
        "rows_in_lake": stored,
        "rows_acknowledged": 2 * len(items) + 1,
        "agreement_with_in_process": agree / len(items),
    }  # the warm-up is not among them
    console.print(
        f"{len(items):,} responses, {workers} verifier processes: in-process "
        f"{figures['in_process_rewards_per_second']:,.0f} rewards/s; over HTTP with lake writes, one a "
        f"request × {clients} in flight {figures['http_rewards_per_second']:,.0f}/s "
        f"(×{figures['http_to_in_process_ratio']:.2f}), p50 {figures['p50_latency_seconds'] * 1000:.0f} ms, "
        f"p99 {figures['p99_latency_seconds'] * 1000:.0f} ms; batches of {batch} "
        f"{figures['http_batched_rewards_per_second']:,.0f}/s (×{figures['batched_to_in_process_ratio']:.2f}); "
        f"{commits} group commits, {stored:,} of {figures['rows_acknowledged']:,} acknowledged rows in the "
        f"lake; agreement with in-process {figures['agreement_with_in_process']:.1%}"
    )
    if stored != figures["rows_acknowledged"]:
        raise RuntimeError(f"{figures['rows_acknowledged']} rewards were acknowledged but {stored} are in the lake")
    return figures
