"""The lake-scale benchmark's S3 part (`bench/lake_scale.py`): a run's writes against moto on loopback, with
every request the object store serves counted by kind, so a change that adds round trips per commit shows."""

from __future__ import annotations

import os
import re
import statistics
from pathlib import Path

from bench.lake_synthetic import seeded_lake, vocabulary, write_iteration
from bench.memory import high_water_mb

REQUEST = re.compile(r'"(GET|PUT|POST|HEAD|DELETE) ')


class RequestLog:
    """moto's access log, read on from where the last look ended (a whole line at a time): counting an
    iteration's requests costs that iteration's lines, not the log's."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def new_requests(self) -> list[str]:
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return REQUEST.findall(complete.decode(errors="replace"))


def s3_requests(iterations: int, rollouts: int, max_tokens: int, problems: int, seed: int, work: Path) -> dict:
    """Requests per iteration to an S3 lake (moto's server), counted in its access log, and the server's peak
    resident set (it holds the whole S3 lake in memory)."""
    import boto3
    import numpy as np

    from bench.moto import start_moto

    log = RequestLog(work / "moto.log")
    moto, endpoint = start_moto(log.path)
    aws = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
    }
    saved = {name: os.environ.get(name) for name in aws}
    os.environ.update(aws)
    methods: dict[str, int] = {}
    try:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="lake-scale")
        lake, bank = seeded_lake("s3://lake-scale/lake", problems, seed)
        rng, words = np.random.default_rng(seed), vocabulary()
        counts = []
        for iteration in range(0, iterations + 1):  # 0: the bucket and the seeded bank, not counted
            if iteration:
                write_iteration(lake, bank, rng, iteration, rollouts, max_tokens, words, work)
            requests = log.new_requests()
            counts.append(len(requests))
            for method in requests:
                methods[method] = methods.get(method, 0) + 1
    finally:
        server_peak = high_water_mb(moto.pid)
        moto.terminate()
        moto.wait(10)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    counts = counts[1:]
    tail = counts[-min(5, len(counts)) :]
    return {
        "iterations": iterations,
        "requests": counts,
        "requests_per_iteration": statistics.median(tail),
        "first_iteration_requests": counts[0],
        "requests_by_method": methods,
        "server_peak_rss_mb": server_peak,
    }
