"""Behaviour log-probs that equal the trainer's: every sampling parameter stated in the request, one
tokenization on both backends, and the agreement gate (`rlvr policy check`, and the loop's publish
stage) that fails on a server which applies a penalty anyway, naming it.

The servers are `rlvr policy serve`, as strict as vLLM here: a request's omitted penalties come from a
generation config, text prompts get vLLM's default `add_special_tokens: true`. The model is the tiny
one with its output layer sharpened, so that its next-token distribution is peaked like a trained
model's (a random one's logits are too flat for a penalty to show)."""

import json
import subprocess

import httpx
import pytest
from conftest import BIN, register_sharpened_version, serve_policy

from policy.agreement import GateFailed
from policy.checkpoints import load_policy
from policy.hf import HFPolicy
from policy.openai_backend import OpenAIBackendConfig, completion_request, parse_choices
from policy.sampling import NEUTRAL, SamplerConfig
from policy.tiny import TinyModelConfig
from storage.registry import version_row
from tasks.rollout.base_policy import BasePolicyConfig, ensure_base_policy

SAMPLER = SamplerConfig(max_new_tokens=24)
PROMPTS = ["What is 2+3?\nAnswer:", "7*8 = 7*8 = 7*8 ="]
SHARP, BOS = 1, 2  # model versions


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    from storage.lake import Lake

    opened = Lake.open(str(tmp_path_factory.mktemp("gate") / "lake"))
    ensure_base_policy(
        opened,
        BasePolicyConfig(
            tiny=TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2), tokenizer_corpus=50
        ),
    )
    register_sharpened_version(opened, SHARP)
    register_sharpened_version(opened, BOS, bos=True)
    return opened


@pytest.fixture(scope="module")
def generation_config_server(lake, tmp_path_factory):
    """A server whose model ships `repetition_penalty: 1.3` in its generation config (Qwen2.5-Instruct: 1.1)."""
    config = tmp_path_factory.mktemp("genconfig") / "generation_config.json"
    config.write_text(json.dumps({"repetition_penalty": 1.3, "do_sample": True}))
    process, url = serve_policy(lake, "--generation-config", str(config))
    yield url
    process.terminate()
    process.wait(10)


@pytest.fixture(scope="module")
def forced_server(lake):
    """A misconfigured server: a repetition penalty of 1.3 whatever the request says."""
    process, url = serve_policy(lake, "--force-repetition-penalty", "1.3")
    yield url
    process.terminate()
    process.wait(10)


def local(lake, version: int):
    return load_policy(version_row(lake, version)["checkpoint_uri"])


def old_request(url: str, model: str, prompt: str, n: int = 4) -> list:
    """The request as the backend sent it before: no penalties, no min_p, no add_special_tokens."""
    body = {
        key: value
        for key, value in completion_request(model, [prompt], n, SAMPLER, 5).items()
        if key not in NEUTRAL and key != "add_special_tokens"
    }
    return parse_choices(httpx.post(f"{url}/v1/completions", json=body, timeout=60).json(), n, url)


def test_the_stand_in_samples_from_the_penalised_distribution_as_vllm_does(lake, generation_config_server):
    """The penalty changes what is sampled, not only the log-probs returned: fewer repeated tokens."""
    model, tokenizer = local(lake, SHARP)
    ids = tokenizer(PROMPTS[1], add_special_tokens=False).input_ids
    penalised = old_request(generation_config_server, "v1", PROMPTS[1], n=8)
    plain = HFPolicy(model, tokenizer, SHARP).generate([ids], 8, SAMPLER, seed=5, model_version=SHARP)[0]

    def repeats(samples) -> int:
        return sum(
            token in ids + sample.token_ids[:i] for sample in samples for i, token in enumerate(sample.token_ids)
        )

    assert repeats(penalised) < repeats(plain)


def check(lake, url: str, model: str):
    result = subprocess.run(
        [str(BIN / "rlvr"), "policy", "check", url, "--model", model, "--lake", lake.uri, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return result.returncode, json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def test_the_gate_fails_on_a_server_that_forces_a_penalty_and_names_it(lake, forced_server, generation_config_server):
    code, figures, stderr = check(lake, forced_server, "v1")
    assert code == 1, stderr
    assert figures["passed"] is False and figures["mean_abs_delta"] > 0.05
    assert figures["max_abs_delta"] >= figures["mean_abs_delta"]
    assert "server-side penalties" in figures["causes"][0] and "above 0.05" in stderr

    code, figures, stderr = check(lake, generation_config_server, "v1")  # stated neutral, so no penalty
    assert code == 0, stderr
    assert figures["passed"] is True and figures["mean_abs_delta"] < 1e-4
    code, figures, stderr = check(lake, generation_config_server + "/v1/", "v1")  # the OpenAI convention's URL
    assert code == 0 and figures["passed"] is True, stderr  # (it answered 404 no route /v1/v1/...)

    recorded = lake.read("logprob_checks").sort("created_at")
    assert recorded["endpoint"].to_list()[-3:] == [forced_server, generation_config_server, generation_config_server]
    assert recorded["passed"].to_list()[-3:] == [False, True, True]


def test_the_publish_stage_gates_each_version_before_anything_samples_it(lake, forced_server, generation_config_server):
    from flows.publishing import publish_version
    from policy.publish import PublishConfig
    from tasks.rollout.stage import RolloutConfig

    def rollout(url: str) -> RolloutConfig:
        return RolloutConfig(backend="openai", openai=OpenAIBackendConfig(endpoints=[url]), sampler=SAMPLER)

    checked = lake.read("logprob_checks").height if lake.exists("logprob_checks") else 0
    assert publish_version(lake, rollout(generation_config_server), PublishConfig(), SHARP)
    with pytest.raises(GateFailed, match="server-side penalties"):
        publish_version(lake, rollout(forced_server), PublishConfig(), SHARP)
    recorded = lake.read("logprob_checks").sort("created_at").tail(2)
    assert lake.read("logprob_checks").height == checked + 2
    assert recorded["passed"].to_list() == [True, False] and recorded["model_version"].to_list() == [SHARP, SHARP]
    assert lake.read("publications").filter(endpoint=forced_server)["action"].to_list() == ["already_served"]
