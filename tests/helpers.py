"""Helpers several test modules share: the small run configs and curated lakes the loop's tests start from, a
seeded iteration, scripted and replayed policies, a second process writing the same lake, and the contract
tests' fresh server."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading

import httpx
import polars as pl
import pyarrow.compute as pc
from conftest import ROOT

from policy.openai_backend import (
    served_models,
)
from policy.publish import PublishConfig, publish
from storage.registry import version_row
from tasks.curation.config import SourceConfig, ValidationConfig
from tasks.curation.load import CANDIDATE_SCHEMA, load_source

SMALL_POLICY = {"tiny": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}, "tokenizer_corpus": 50}

CONFIG = {
    "rollout": {"group_size": 4, "sampler": {"max_new_tokens": 16}, "base_policy": SMALL_POLICY},
    "dynamic_sampling": {"groups_per_batch": 3, "max_rounds": 3},
    "verify": {"workers": 0, "verifier": "random"},  # Bernoulli(0.5) rewards: mixed groups from a random policy
}


def curated(lake_uri, count=60):
    from flows.curation import curate_bank

    curate_bank({"sources": [{"kind": "generator", "generator": "mix", "count": count, "seed": 0}]}, lake_uri)


RUN = {
    **CONFIG,
    "train": {"micro_batch_size": 8},
    "evaluation": {"max_problems": 12, "sampler": {"max_new_tokens": 8}},
    "loop": {"iterations": 2},
}

BANK = {
    "sources": [
        {"kind": "generator", "generator": "mix", "count": 60, "seed": 0},
        {"kind": "generator", "name": "gen-eval", "generator": "mix", "count": 20, "seed": 1000, "split": "eval"},
    ]
}


def curated_with_eval(lake_uri):
    from flows.curation import curate_bank

    curate_bank(BANK, lake_uri)


def seed_iteration(lake, iteration=1):
    """A tiny bank (math + code) and rollouts for one iteration: half right, half wrong."""
    math = load_source(SourceConfig(kind="generator", generator="level1", count=4, seed=3), ValidationConfig()).problems
    code = pl.DataFrame(
        [
            {
                "problem_id": "code-1",
                "source": "toy",
                "source_kind": "humaneval",
                "source_uri": "toy",
                "split": "train",
                "domain": "code",
                "level": 2,
                "prompt": "def add(a, b):\n",
                "tests": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
                "entry_point": "add",
                "verifier": "code",
            }
        ]
    )
    problems = pl.concat([math.drop("similarity_checks"), code], how="diagonal_relaxed")
    with lake.run("test", "seed", {}, bank_version=1) as run:
        lake.replace("problems", problems.with_columns(bank_version=pl.lit(1, pl.Int64)), {"bank_version": 1}, run)
    rows = []
    for row in math.iter_rows(named=True):
        rows.append({"problem_id": row["problem_id"], "response": f"\\boxed{{{row['answer']}}}"})
        rows.append({"problem_id": row["problem_id"], "response": f"\\boxed{{{int(row['answer']) + 1}}}"})
    rows += [
        {"problem_id": "code-1", "response": "    return a + b\n"},
        {"problem_id": "code-1", "response": "    return 0\n"},
    ]
    rollouts = pl.DataFrame(
        [
            {
                **r,
                "rollout_id": f"r{i}",
                "iteration": iteration,
                "group_id": r["problem_id"],
                "sample_idx": i % 2,
                "model_version": 0,
            }
            for i, r in enumerate(rows)
        ]
    )
    with lake.run("test", "rollout", {}, iteration=iteration) as run:
        lake.replace("rollouts", rollouts, {"iteration": iteration}, run)
    return rollouts


class Replay:
    """A stand-in for the policy that answers each prompt with a fixed text (the stage's wiring is under test
    here; the loop on a real model is tests/tasks/selfplay/test_selfplay_loop.py)."""

    def __init__(self, answer):
        self.answer = answer

    def generate(self, prompts, n, sampler, seed, model_version):
        from policy.sampling import Sample

        return [
            [
                Sample(
                    text=self.answer(prompt, index),
                    token_ids=[1, 2],
                    logprobs=[-0.1, -0.2],
                    finish_reason="stop",
                    prompt_token_ids=[0],
                )
                for index in range(n)
            ]
            for prompt in prompts
        ]


def candidates(rows):
    defaults = {
        "source": "src",
        "source_kind": "gsm8k",
        "source_uri": "f.jsonl",
        "split": "train",
        "domain": "math",
        "level": 1,
        "verifier": "math",
        "similarity_checks": True,
    }
    full = [{**defaults, "source_line": i + 1, **row} for i, row in enumerate(rows)]
    return pl.DataFrame(full, schema=CANDIDATE_SCHEMA, strict=False)


def write(lake, version, sources, **run_kwargs):
    with lake.run("test-flow", "test-stage", {"sources": sources}, bank_version=version, **run_kwargs) as run:
        lake.replace("quarantine", quarantine_rows(version, sources), {"bank_version": version}, run)
    return run


class Scripted:
    """A real HTTP server on loopback answering POSTs from a script: (status, body) per request."""

    def __init__(self, answer, models: list[str] | None = None):
        import json
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # /v1/models lists `models`; without them, no such route
                data = json.dumps({"data": [{"id": name} for name in models or []]}).encode()
                self.send_response(200 if models is not None else 404)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(body)
                status, payload = answer(body, len(owner.requests))
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def completion(n: int, finish_reason="stop") -> dict:
    choice = {
        "text": "42",
        "finish_reason": finish_reason,
        "logprobs": {"tokens": ["token_id:52", "token_id:50"], "token_logprobs": [-0.5, -0.25]},
    }
    return {"choices": [{**choice, "index": i} for i in range(n)]}


class OtherProcess:
    """The writer process, driven one command at a time (each answered before the next: no race in a read)."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "storage" / "lake_writer_process.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )

    def __call__(self, **command) -> dict:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline())
        assert "error" not in answer, f"the writer process failed on {command}: {answer['error']}"
        return answer

    def close(self) -> None:
        self(do="quit")
        self.process.stdin.close()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


FP32_GATE = 1e-5  # mean |Δ log p| an fp32 server may differ from the fp32 trainer by


def fresh(engine):
    """Every one-name server back on v0, and the adapter servers holding no adapter."""
    full = publish(
        engine.full,
        "policy",
        version_row(engine.lake, 0)["checkpoint_uri"],
        PublishConfig(weights="full"),
        template="policy",
        version=0,
    )
    assert all(result.confirmed for result in full), [result.error for result in full]
    for url in dict.fromkeys([engine.lora, *engine.lora_rotation]):
        for name in served_models(httpx.Client(), url):
            if name != "v0":
                assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": name}).status_code == 200
    return engine


def quarantine_rows(version: int, sources: list[str]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "bank_version": [version] * len(sources),
            "source": sources,
            "source_uri": ["file.jsonl"] * len(sources),
            "source_line": list(range(1, len(sources) + 1)),
            "reason": ["bad"] * len(sources),
        }
    )


def rewards_of(lake, iteration: int) -> pl.DataFrame:
    return lake.read("rewards", filter=pc.field("iteration") == iteration).sort("rollout_id", "verifier")


def batch_rows(iteration: int, count: int, tag: str = "") -> pl.DataFrame:
    return pl.DataFrame(
        {
            "batch_id": [f"b{iteration}{tag}"] * count,
            "iteration": [iteration] * count,
            "rollout_id": [f"r{iteration}{tag}-{i}" for i in range(count)],
            "group_id": ["g"] * count,
            "advantage": [0.5] * count,
            "weight": [1.0] * count,
        }
    )


# vLLM (uvicorn) closes a connection after an answer its app raised for (a failed RPC's 500): a client reusing it
# may send the next request into the closed socket. The publish stage asks so too (policy/publish.py).
ONE_REQUEST_A_CONNECTION = {"Connection": "close"}


def method_calls(source: str, methods: set[str], on: str | None = None) -> list[int]:
    """Lines of `source` that call `x.method(...)` for a method in `methods` (only on a name `on`, if given)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in methods
        and (on is None or (isinstance(node.func.value, ast.Name) and node.func.value.id == on))
    ]


def method_calls_in_flows(methods: set[str], on: str | None = None) -> dict[str, list[int]]:
    """`method_calls` over every module of `flows/`, by path (the ones with none left out)."""
    return {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / "flows").rglob("*.py"))
        if (lines := method_calls(path.read_text(), methods, on))
    }
