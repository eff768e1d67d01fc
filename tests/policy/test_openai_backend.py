"""The `openai` backend over real HTTP: `rlvr policy serve` (an OpenAI-compatible server over the hf
backend) in its own process, several endpoints, model version per request, and servers that fail
and recover."""

import subprocess
import threading
import time

import pytest
from conftest import BIN, free_port, register_random_version, wait_for
from helpers import Scripted, completion

from policy.checkpoints import load_policy
from policy.hf import HFPolicy
from policy.openai_backend import BackendUnavailable, OpenAIBackendConfig, OpenAIPolicy
from policy.sampling import SamplerConfig
from policy.tiny import TinyModelConfig
from storage.seeds import derive_seed
from tasks.rollout.base_policy import BasePolicyConfig, ensure_base_policy

SAMPLER = SamplerConfig(max_new_tokens=12)
SMALL = TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2)


@pytest.fixture(scope="module")
def served_lake(tmp_path_factory):
    """A lake with model versions 0 and 1 (different seeds)."""
    from storage.lake import Lake

    lake = Lake.open(str(tmp_path_factory.mktemp("served") / "lake"))
    ensure_base_policy(lake, BasePolicyConfig(tiny=SMALL, tokenizer_corpus=50))
    register_random_version(lake, 1, seed=1)
    return lake


def start_server(lake, port: int, fail_first: int = 0) -> subprocess.Popen:
    process = subprocess.Popen(
        [
            str(BIN / "rlvr"),
            "policy",
            "serve",
            "--lake",
            lake.uri,
            "--port",
            str(port),
            "--fail-first",
            str(fail_first),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    wait_for(f"http://127.0.0.1:{port}/health", process, 60, "rlvr policy serve")
    return process


@pytest.fixture(scope="module")
def server(served_lake):
    port = free_port()
    process = start_server(served_lake, port)
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(10)


def client(*endpoints: str, **options) -> OpenAIPolicy:
    return OpenAIPolicy(OpenAIBackendConfig(endpoints=list(endpoints), **{"backoff_seconds": 0.05, **options}))


def test_groups_carry_token_ids_and_logprobs_exactly_as_the_hf_backend_samples_them(served_lake, server):
    remote = client(server).generate(["What is 2+3?\nAnswer:", "7*8 ="], 4, SAMPLER, seed=7, model_version=0)
    model, tokenizer = load_policy(served_lake.read("model_versions").sort("model_version")["checkpoint_uri"][0])
    local = HFPolicy(model, tokenizer, 0).generate(["7*8 ="], 4, SAMPLER, derive_seed(7, 1) % 2**31, 0)[0]
    assert [len(group) for group in remote] == [4, 4]
    for got, expected in zip(remote[1], local):
        assert got.token_ids == expected.token_ids and got.finish_reason == expected.finish_reason
        assert got.logprobs == pytest.approx(expected.logprobs, abs=1e-5)
        assert got.prompt_token_ids == tokenizer("7*8 =").input_ids and got.backend == f"openai:{server}"


def test_several_prompts_per_request_come_back_as_their_groups_in_order(served_lake, server):
    prompts = ["What is 2+3?\nAnswer:", "7*8 =", "1+1="]
    remote = client(server, prompts_per_request=2).generate(prompts, 3, SAMPLER, seed=7, model_version=0)
    model, tokenizer = load_policy(served_lake.read("model_versions").sort("model_version")["checkpoint_uri"][0])
    local = HFPolicy(model, tokenizer, 0)
    expected = (
        local.generate(prompts[:2], 3, SAMPLER, derive_seed(7, 0) % 2**31, 0)  # one request, two groups
        + local.generate(prompts[2:], 3, SAMPLER, derive_seed(7, 2) % 2**31, 0)
    )
    assert [len(group) for group in remote] == [3, 3, 3]
    assert [[s.token_ids for s in group] for group in remote] == [[s.token_ids for s in group] for group in expected]
    assert [group[0].prompt_token_ids for group in remote] == [tokenizer(p).input_ids for p in prompts]


def test_the_model_version_is_chosen_per_request(server):
    policy = client(server)
    v0, v1 = (policy.generate(["1+1="], 4, SAMPLER, seed=3, model_version=v)[0] for v in (0, 1))
    assert [s.token_ids for s in v0] != [s.token_ids for s in v1]
    with pytest.raises(BackendUnavailable, match="no endpoint serves model 'v9'"):  # its /v1/models lists v0, v1
        policy.generate(["1+1="], 2, SAMPLER, seed=3, model_version=9)
    with pytest.raises(BackendUnavailable, match="was refused.*HTTP 400.*not registered"):  # asked all the same
        client(server, confirm_served=False).generate(["1+1="], 2, SAMPLER, seed=3, model_version=9)


def test_a_dead_endpoint_is_skipped_for_a_live_one(server):
    dead = f"http://127.0.0.1:{free_port()}"
    groups = client(dead, server, concurrency=4).generate([f"{i}+1=" for i in range(8)], 2, SAMPLER, 0, 0)
    assert all(len(group) == 2 for group in groups)


def test_a_server_answering_503_is_retried_until_it_recovers(served_lake):
    port = free_port()
    process = start_server(served_lake, port, fail_first=3)
    try:
        with pytest.raises(BackendUnavailable, match=r"2 attempts over 1 endpoint.*HTTP 503"):
            client(f"http://127.0.0.1:{port}", max_retries=1).generate(["x"], 2, SAMPLER, 0, 0)
        groups = client(f"http://127.0.0.1:{port}", max_retries=4).generate(["x"], 2, SAMPLER, 0, 0)
        assert len(groups[0]) == 2
    finally:
        process.terminate()
        process.wait(10)


def test_a_server_that_goes_down_and_comes_back_loses_no_request(served_lake):
    port = free_port()
    start_server(served_lake, port).kill()  # it served once, then died
    restarted: list[subprocess.Popen] = []
    restart = threading.Timer(1.0, lambda: restarted.append(start_server(served_lake, port)))
    restart.start()
    try:
        started = time.monotonic()
        # retries for up to about 80 s: a restart on a loaded 2-core host takes tens of seconds (torch's imports)
        groups = client(f"http://127.0.0.1:{port}", concurrency=3, max_retries=45, max_backoff_seconds=2.0).generate(
            [f"{i}*2=" for i in range(6)], 2, SAMPLER, 0, 0
        )
        assert all(len(group) == 2 for group in groups) and time.monotonic() - started > 1.0
    finally:
        restart.join()  # a restart still starting is stopped too, not left
        for process in restarted:
            process.terminate()
            process.wait(10)


def test_broken_or_unfinished_answers_are_retried():
    script = {1: (200, "{not json"), 2: (200, completion(2, finish_reason="abort")), 3: (200, completion(1))}
    server = Scripted(lambda body, count: script.get(count, (200, completion(body["n"]))))
    try:
        samples = client(server.url).generate(["x"], 2, SAMPLER, 0, 0)[0]
        assert len(server.requests) == 4  # junk, an aborted sample, 1 of 2 choices, then a good one
        assert [s.token_ids for s in samples] == [[52, 50]] * 2 and samples[0].logprobs == [-0.5, -0.25]
        request = server.requests[-1]
        assert request["logprobs"] == 0 and request["return_tokens_as_token_ids"] and request["top_k"] == -1
        assert request["model"] == "v0" and request["n"] == 2
    finally:
        server.close()


def test_a_refused_request_fails_the_round_without_waiting_for_the_others_retries():
    server = Scripted(
        lambda body, count: (400, {"error": "bad prompt"}) if body["prompt"] == "bad" else (503, {"error": "busy"})
    )
    try:
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match="was refused.*HTTP 400"):
            client(server.url, concurrency=8, backoff_seconds=2.0).generate(["bad"] + ["ok"] * 7, 2, SAMPLER, 0, 0)
        assert time.monotonic() - started < 2.0 and len(server.requests) <= 8
    finally:
        server.close()


def test_the_registry_served_name_is_what_is_requested():
    server = Scripted(lambda body, count: (200, completion(body["n"])))
    try:
        policy = OpenAIPolicy(OpenAIBackendConfig(endpoints=[server.url]), served_names={3: "qwen-sft-step-900"})
        policy.generate(["x"], 1, SAMPLER, 0, model_version=3)
        policy.generate(["x"], 1, SAMPLER, 0, model_version=4)
        assert [r["model"] for r in server.requests] == ["qwen-sft-step-900", "v4"]
    finally:
        server.close()


def test_self_certainty_of_served_samples_is_recomputed_from_the_local_copy_as_the_hf_backend_records_it(
    served_lake, server
):
    """INTUITOR's reward on the openai backend: the server reports no distributions, so the local copy of the
    version computes each response's self-certainty, equal to what the hf backend accumulates while sampling."""
    from policy.certainty import WithSelfCertainty
    from policy.logprobs import response_self_certainty

    model, tokenizer = load_policy(served_lake.read("model_versions").sort("model_version")["checkpoint_uri"][0])
    remote = client(server).generate(["7*8 ="], 4, SAMPLER, seed=7, model_version=0)
    assert all(sample.self_certainty is None for sample in remote[0])  # nothing from the server
    filled = WithSelfCertainty(client(server), model, tokenizer, batch_size=3)
    remote = filled.generate(["7*8 ="], 4, SAMPLER, seed=7, model_version=0)[0]
    local = HFPolicy(model, tokenizer, 0).generate(["7*8 ="], 4, SAMPLER, derive_seed(7, 0) % 2**31, 0)[0]
    assert filled.filled == 4
    for got, expected in zip(remote, local):
        assert got.token_ids == expected.token_ids
        assert got.self_certainty == pytest.approx(expected.self_certainty, abs=1e-4) and got.self_certainty > 0
    again = response_self_certainty(model, [s.prompt_token_ids for s in remote], [s.token_ids for s in remote])
    assert again == pytest.approx([s.self_certainty for s in remote], abs=1e-6)
