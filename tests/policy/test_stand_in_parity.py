"""The stand-in server against vLLM itself: every route the platform calls answers alike in shape (`vllm` tests;
the contract each must keep is tests/policy/test_server_contract.py)."""

from __future__ import annotations

import json

import httpx
import pytest
from helpers import ONE_REQUEST_A_CONNECTION, fresh

from storage.registry import version_row

PROBES = [  # (method, route, body, what of the answer must be the same)
    ("GET", "/v1/models", None, "ids"),
    ("POST", "/collective_rpc", {"method": "rlvr_loaded_version"}, "json"),
    ("POST", "/collective_rpc", {}, "error"),
    ("POST", "/collective_rpc", {"method": "no_such_method"}, "error"),
    ("POST", "/collective_rpc", {"method": "rlvr_load_checkpoint", "args": ["/nonexistent", 4]}, "error"),
    ("POST", "/pause", None, "json"),
    ("POST", "/resume", None, "json"),
    ("POST", "/reset_prefix_cache", None, "json"),
    ("POST", "/sleep?level=1", None, "json"),
    ("GET", "/is_sleeping", None, "json"),
    ("POST", "/wake_up", None, "json"),
    ("GET", "/is_paused", None, "json"),
    ("POST", "/v1/completions", {"model": "nope", "prompt": "1+1=", "max_tokens": 2}, "error"),
    ("POST", "/v1/load_lora_adapter", {"lora_name": "v2", "lora_path": "/x"}, "status"),
    (
        "POST",
        "/v1/completions",
        {
            "model": "policy",
            "prompt": "1+1=",
            "max_tokens": 3,
            "n": 2,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "seed": 1,
        },
        "shape",
    ),
]

LORA_PROBES = [
    ("GET", "/v1/models", None, "json-models"),
    ("POST", "/v1/load_lora_adapter", {"lora_name": "v2", "lora_path": "{v2}"}, "text"),
    ("POST", "/v1/load_lora_adapter", {"lora_name": "v2", "lora_path": "{v2}"}, "error"),
    ("POST", "/v1/load_lora_adapter", {"lora_name": "v9", "lora_path": "/nonexistent"}, "error"),
    ("GET", "/v1/models", None, "json-models"),
    ("POST", "/v1/unload_lora_adapter", {"lora_name": "v2"}, "text"),
    ("POST", "/v1/unload_lora_adapter", {"lora_name": "v2"}, "error"),
    ("GET", "/openapi.json", None, "no-dev-routes"),
]


def answer_of(client: httpx.Client, url: str, method: str, route: str, body, compare: str, lake):
    """What of one answer the two engines must agree on."""
    if body is not None:
        body = json.loads(json.dumps(body).replace("{v2}", version_row(lake, 2)["checkpoint_uri"]))
    response = client.request(method, f"{url}{route}", json=body)
    status = response.status_code
    if compare == "status":
        return status
    if compare == "text":
        return status, response.text
    payload = response.json()
    if compare == "json":
        return status, payload
    if compare == "ids":
        return status, sorted(entry["id"] for entry in payload["data"])
    if compare == "json-models":
        return status, [(entry["id"], entry["parent"], entry["object"]) for entry in payload["data"]]
    if compare == "error":
        error = payload["error"]
        return status, error["type"] if status != 400 else "bad request", sorted(error)
    if compare == "no-dev-routes":
        return status, sorted({"/collective_rpc", "/pause", "/sleep"} & set(payload["paths"]))
    assert compare == "shape"
    return status, shape(payload)


def shape(value):
    """The keys and value types the backend reads from a completion (`parse_choices`), recursively."""
    if isinstance(value, dict):
        return {
            key: shape(value[key])
            for key in (
                "choices",
                "logprobs",
                "tokens",
                "token_logprobs",
                "token_ids",
                "prompt_token_ids",
                "finish_reason",
                "index",
                "text",
            )
            if key in value
        }
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


@pytest.mark.vllm
def test_the_stand_in_answers_as_vllm_does(vllm, stand_in):
    """The same requests to both engines' servers, in the same order: the answers the platform reads agree."""
    for servers in (vllm, stand_in):
        fresh(servers)
    answers = {}
    for servers in (vllm, stand_in):
        with httpx.Client(timeout=60, headers=ONE_REQUEST_A_CONNECTION) as client:
            answers[servers.engine] = [answer_of(client, servers.full[0], *probe, servers.lake) for probe in PROBES] + [
                answer_of(client, servers.lora, *probe, servers.lake) for probe in LORA_PROBES
            ]
    for probe, ours, theirs in zip(PROBES + LORA_PROBES, answers["stand-in"], answers["vllm"]):
        assert ours == theirs, f"{probe[0]} {probe[1]} {probe[2]}: stand-in {ours!r}, vLLM {theirs!r}"
