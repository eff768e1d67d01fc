"""The loop on real vLLM servers, end to end: `rl_loop` with the `openai` backend for three iterations, two
servers in rotation, each trained version published before anything samples it and gated against the
trainer, and every rollout's behaviour log-probs within the gate of the trainer's own recomputation.

Full weights swap in place on the synchronous loop; LoRA adapters load by name on the synchronous and the
overlapped loop. (Full weights on the overlapped loop are refused by the pre-flight check, one name cannot
hold two versions at once: tests/policy/test_full_weights.py.) Every run's lake registers the servers' own base
folder as its version 0, so the servers start on exactly the run's base."""

import json

import httpx
import polars as pl
import pytest
from conftest import sharpened_base
from helpers import CONFIG, FP32_GATE, RUN, curated_with_eval, fresh

from policy.checkpoints import load_policy
from storage.registry import version_row

pytestmark = pytest.mark.vllm


def run_config(servers, weights: str, mode: str) -> dict:
    full = weights == "full"
    openai = {
        "endpoints": servers.full if full else servers.lora_rotation,
        "backoff_seconds": 0.05,
        "model_name": "policy" if full else "v{model_version}",
    }
    base = {"checkpoint": servers.base, **({"served_name": "policy"} if full else {})}
    train = {**RUN.get("train", {}), **({} if full else {"lora": {"r": 4, "alpha": 8}, "learning_rate": 1e-2})}
    return {
        **RUN,
        "rollout": {**CONFIG["rollout"], "base_policy": base, "backend": "openai", "openai": openai},
        "publish": {"weights": weights, "max_loras": 3},
        "train": train,
        "loop": {"iterations": 3, "mode": mode, **({"max_staleness": 1} if mode == "async" else {})},
    }


def behaviour_gap(lake) -> tuple[float, float, int]:
    """(mean, max) over every rollout token of |behaviour log-prob − the trainer's recomputation on the
    version that sampled it|, and the tokens compared."""
    import torch

    from policy.logprobs import response_logprobs

    rollouts = lake.read(
        "rollouts", columns=["model_version", "prompt_token_ids", "response_token_ids", "behaviour_logprobs", "sampler"]
    )
    gaps = []
    for (version,), rows in rollouts.group_by(["model_version"]):
        model, _ = load_policy(version_row(lake, version)["checkpoint_uri"])
        rows = rows.filter(pl.col("response_token_ids").list.len() > 0)
        temperature = json.loads(rows["sampler"][0]).get("temperature") or 1.0
        with torch.no_grad():
            recomputed, mask, _ = response_logprobs(
                model, rows["prompt_token_ids"].to_list(), rows["response_token_ids"].to_list(), temperature
            )
        for row, (served, local, keep) in enumerate(zip(rows["behaviour_logprobs"].to_list(), recomputed, mask)):
            local = local[keep.bool()].tolist()
            assert len(local) == len(served), row
            gaps.extend(abs(a - b) for a, b in zip(served, local))
    return sum(gaps) / len(gaps), max(gaps), len(gaps)


@pytest.mark.parametrize("weights, mode", [("full", "sync"), ("adapter", "sync"), ("adapter", "async")])
def test_the_loop_runs_on_vllm(vllm, prefect_api, tmp_path, weights, mode):
    from flows.loop import rl_loop
    from storage.lake import Lake

    fresh(vllm)
    lake_uri = str(tmp_path / "lake")
    curated_with_eval(lake_uri)
    config = run_config(vllm, weights, mode)
    rows = rl_loop(config, lake_uri=lake_uri)
    lake = Lake.open(lake_uri)
    assert [row["trained_version"] for row in rows] == [1, 2, 3]
    endpoints = config["rollout"]["openai"]["endpoints"]

    publications = lake.read("publications").filter(pl.col("model_version") > 0)
    method = "full" if weights == "full" else "adapter"
    assert set(publications["method"]) == {method} and set(publications["endpoint"]) == set(endpoints)
    loaded = publications.filter(action="loaded").sort("model_version")
    assert loaded.group_by("model_version").len().sort("model_version").rows() == [(1, 2), (2, 2), (3, 2)]
    assert publications["error"].null_count() == publications.height
    if weights == "full":
        assert all(
            httpx.post(f"{url}/collective_rpc", json={"method": "rlvr_loaded_version"}).json() == {"results": ["3"]}
            for url in endpoints
        )

    gate = lake.read("logprob_checks")
    assert all(gate["passed"]) and set(gate["endpoint"]) == set(endpoints)
    assert set(gate["model_version"]) >= {1, 2} and max(gate["mean_abs_delta"]) <= FP32_GATE

    rollouts = lake.read("rollouts", columns=["model_version", "backend"])
    assert {backend.removeprefix("openai:") for backend in rollouts["backend"]} == set(endpoints)  # both served
    assert set(rollouts["model_version"]) >= {0, 1}
    mean, most, tokens = behaviour_gap(lake)
    assert tokens > 100 and mean <= FP32_GATE and most <= 1e-3, (mean, most)


def test_the_overlapped_loop_starts_its_own_vllm_server_and_stops_it(prefect_api, tmp_path):
    """`rollout.openai.launch: 1`: the loop starts a vLLM server from .venv-vllm on version 0's folder (serve.sh,
    LoRA adapters with train.lora), samples two overlapped iterations from it within the gate, and stops it."""
    from flows.loop import rl_loop
    from policy import vllm_servers
    from storage.lake import Lake

    if vllm_servers.missing():
        pytest.skip(vllm_servers.missing())
    lake_uri = str(tmp_path / "lake")
    curated_with_eval(lake_uri)
    base = {"checkpoint": sharpened_base(tmp_path / "base")}  # a shape vLLM's CPU attention takes
    config = {
        **RUN,
        "rollout": {
            **CONFIG["rollout"],
            "base_policy": base,
            "backend": "openai",
            "openai": {"launch": 1, "backoff_seconds": 0.05},
        },
        "train": {**RUN.get("train", {}), "lora": {"r": 4, "alpha": 8}, "learning_rate": 1e-2},
        "loop": {"iterations": 2, "mode": "async", "max_staleness": 1},
    }
    rows = rl_loop(config, lake_uri=lake_uri)
    lake = Lake.open(lake_uri)
    assert [row["trained_version"] for row in rows] == [1, 2]
    publications = lake.read("publications")
    [endpoint] = set(publications["endpoint"])
    assert endpoint.startswith("http://127.0.0.1:") and set(
        publications.filter(pl.col("model_version") > 0)["method"]
    ) == {"adapter"}
    assert {b.removeprefix("openai:") for b in lake.read("rollouts", columns=["backend"])["backend"]} == {endpoint}
    mean, most, tokens = behaviour_gap(lake)
    assert tokens > 100 and mean <= FP32_GATE and most <= 1e-3, (mean, most)
    with pytest.raises(httpx.HTTPError):  # stopped with the loop
        httpx.get(f"{endpoint}/v1/models", timeout=5)
