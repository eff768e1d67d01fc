"""The part of vLLM's server the platform relies on, tested on vLLM itself and on the stand-in alike.

Every test takes `engine` (conftest.py): `make test` runs it against `rlvr policy serve`, `make test-vllm`
against real vLLM servers started by `infra/vllm/serve.sh` from `.venv-vllm`, so nothing here passes only
because the stand-in is lenient. `test_the_stand_in_answers_as_vllm_does` sends the same requests to both and
compares the answers: status, content type, the JSON's shape and the values the platform reads.

The servers are shared by the session; each test starts by putting them back as they started (`fresh`)."""

import json
import subprocess
import time

import httpx
import pytest
from conftest import BIN
from helpers import FP32_GATE, ONE_REQUEST_A_CONNECTION, fresh

from policy.agreement import measure
from policy.checkpoints import load_policy
from policy.openai_backend import (
    OpenAIBackendConfig,
    OpenAIPolicy,
    completion_request,
    held_versions,
    parse_choices,
    served_models,
)
from policy.publish import PublishConfig, publish
from policy.sampling import NEUTRAL, SamplerConfig
from storage.registry import version_row

SAMPLER = SamplerConfig(max_new_tokens=24)
PROMPTS = ["What is 2+3?\nAnswer:", "7*8 = 7*8 = 7*8 ="]


def local(engine, version: int):
    return load_policy(version_row(engine.lake, version)["checkpoint_uri"])


def sampled(url: str, model: str, body_changes: dict | None = None, drop: tuple = ()) -> list:
    """Two samples of each prompt from `url`, as the backend asks for them (with `body_changes`, less `drop`)."""
    groups = []
    for index, prompt in enumerate(PROMPTS):
        body = completion_request(model, [prompt], 2, SAMPLER, 5 + index) | (body_changes or {})
        body = {key: value for key, value in body.items() if key not in drop}
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        groups.append(parse_choices(response.json(), 2, url))
    return groups


def delta(engine, version: int, groups: list) -> float:
    model, tokenizer = local(engine, version)
    prompt_ids = [tokenizer(prompt, add_special_tokens=False).input_ids for prompt in PROMPTS]
    return measure(groups, prompt_ids, model, SAMPLER, tolerance=1.0).mean_abs_delta


def test_completions_carry_token_ids_and_the_trainers_logprobs(engine):
    fresh(engine)
    groups = sampled(engine.full[0], "policy")
    _, tokenizer = local(engine, 0)
    for prompt, group in zip(PROMPTS, groups):
        for sample in group:
            assert sample.prompt_token_ids == tokenizer(prompt, add_special_tokens=False).input_ids
            assert sample.token_ids and len(sample.logprobs) == len(sample.token_ids)
            assert sample.finish_reason in ("stop", "length")
    assert delta(engine, 0, groups) <= FP32_GATE
    again = sampled(engine.full[0], "policy")  # a request's seed fixes its samples
    assert [[s.token_ids for s in group] for group in again] == [[s.token_ids for s in group] for group in groups]


def test_several_prompts_in_one_request_come_back_prompt_by_prompt(engine):
    """One request with a list of prompts and `n` samples each: the choices are ordered prompt by prompt, which
    is how `prompts_per_request` splits them into groups."""
    fresh(engine)
    client = OpenAIPolicy(OpenAIBackendConfig(endpoints=[engine.full[0]], model_name="policy", prompts_per_request=2))
    try:
        groups = client.generate(PROMPTS + ["1+1=", "9-4="], 3, SAMPLER, seed=2, model_version=0)
    finally:
        client.close()
    _, tokenizer = local(engine, 0)
    assert [len(group) for group in groups] == [3] * 4
    for prompt, group in zip(PROMPTS + ["1+1=", "9-4="], groups):
        assert {tuple(sample.prompt_token_ids) for sample in group} == {
            tuple(tokenizer(prompt, add_special_tokens=False).input_ids)
        }
    assert delta(engine, 0, groups[:2]) <= FP32_GATE


def test_many_long_seeded_requests_at_once_are_all_answered(engine):
    """More prompt tokens at once than one engine step takes (vLLM then splits prefills across steps), every
    request seeded as the backend seeds them: vLLM 0.32's CPU build died on that ("CPU Generator does not use
    offset") until serve.sh turned chunked prefill off for it."""
    fresh(engine)
    prompts = [
        f"Problem {index}: " + " ".join(f"{index * 7 + k} plus {k} is" for k in range(40)) for index in range(16)
    ]
    client = OpenAIPolicy(
        OpenAIBackendConfig(endpoints=[engine.full[0]], model_name="policy", concurrency=16, max_retries=1)
    )
    try:
        groups = client.generate(prompts, 4, SamplerConfig(max_new_tokens=8), seed=3, model_version=0)
    finally:
        client.close()
    _, tokenizer = local(engine, 0)
    assert sum(len(tokenizer(p, add_special_tokens=False).input_ids) for p in prompts) * 4 > 8192
    assert [len(group) for group in groups] == [4] * 16 and all(s.token_ids for group in groups for s in group)


def test_text_prompts_get_special_tokens_only_when_asked_and_token_prompts_are_taken_as_they_are(engine):
    """The base's tokenizer adds a BOS (as Llama 3's): vLLM's default `add_special_tokens: true` adds it to a
    prompt whose chat template wrote one already; the backend's requests say false, so the ids are the hf
    backend's, and the gate names a doubled BOS."""
    from policy.tiny import IM_START

    model, tokenizer = local(engine, 0)
    url, prompt = engine.full[0], f"{IM_START}user\n2+3?<|im_end|>\n{IM_START}assistant\n"
    assert tokenizer("x").input_ids[0] == tokenizer.bos_token_id
    for add in (True, False):
        body = {
            "model": "policy",
            "prompt": prompt,
            "max_tokens": 2,
            "add_special_tokens": add,
            "return_token_ids": True,
        }
        answer = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
        assert answer["choices"][0]["prompt_token_ids"] == tokenizer(prompt, add_special_tokens=add).input_ids
    hf_ids = tokenizer(prompt, add_special_tokens=False).input_ids
    body = completion_request("policy", [prompt], 2, SAMPLER, 1)
    twice = parse_choices(
        httpx.post(
            f"{url}/v1/completions", json={k: v for k, v in body.items() if k != "add_special_tokens"}, timeout=60
        ).json(),
        2,
        url,
    )
    assert twice[0].prompt_token_ids == [tokenizer.bos_token_id] + hf_ids
    verdict = measure([twice], [hf_ids], model, SAMPLER, tolerance=0.05)
    assert not verdict.prompt_tokens_match and not verdict.passed and "BOS" in verdict.causes[0]
    once = parse_choices(httpx.post(f"{url}/v1/completions", json=body, timeout=60).json(), 2, url)
    assert once[0].prompt_token_ids == hf_ids and measure([once], [hf_ids], model, SAMPLER, 0.05).passed
    answer = httpx.post(
        f"{url}/v1/completions",
        json={"model": "policy", "prompt": hf_ids, "max_tokens": 2, "return_token_ids": True},
        timeout=60,
    ).json()
    assert answer["choices"][0]["prompt_token_ids"] == hf_ids  # token ids are taken as they are


def test_penalties_a_request_omits_come_from_the_generation_config_and_stated_ones_do_not(engine):
    """The adapter server's model ships `repetition_penalty: 1.3` and the server applies it (vLLM's default
    `--generation-config auto`): the backend's requests, which state every parameter, stay neutral."""
    fresh(engine)
    stated = sampled(engine.lora, "v0")
    omitted = sampled(engine.lora, "v0", drop=tuple(NEUTRAL))
    assert delta(engine, 0, stated) <= FP32_GATE
    assert delta(engine, 0, omitted) > 0.01  # penalised: not the trainer's distribution
    model, tokenizer = local(engine, 0)
    verdict = measure(
        omitted, [tokenizer(p, add_special_tokens=False).input_ids for p in PROMPTS], model, SAMPLER, tolerance=0.01
    )
    assert not verdict.passed and "server-side penalties" in verdict.causes[0]
    checked = subprocess.run(
        [
            str(BIN / "rlvr"),
            "policy",
            "check",
            engine.lora,
            "--model",
            "v0",
            "--lake",
            engine.lake.uri,
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stderr[-2000:]  # `rlvr policy check`: stated, so it agrees
    assert json.loads(checked.stdout.strip().splitlines()[-1])["mean_abs_delta"] <= FP32_GATE


def test_adapters_load_by_name_are_listed_with_their_folder_and_unload(engine):
    fresh(engine)
    url, folder = engine.lora, version_row(engine.lake, 2)["checkpoint_uri"]
    loaded = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "v2", "lora_path": folder})
    assert loaded.status_code == 200 and loaded.text == "Success: LoRA adapter 'v2' added successfully."
    listed = {entry["id"]: entry for entry in httpx.get(f"{url}/v1/models").json()["data"]}
    assert set(listed) == {"v0", "v2"} and listed["v2"]["root"] == folder and listed["v2"]["parent"] == "v0"
    again = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "v2", "lora_path": folder})
    assert again.status_code == 400 and "has already been loaded" in again.json()["error"]["message"]
    missing = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "v9", "lora_path": "/nonexistent"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
    assert delta(engine, 2, sampled(url, "v2")) <= FP32_GATE  # the adapter's own distribution
    unloaded = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "v2"})
    assert unloaded.status_code == 200 and unloaded.text == "Success: LoRA adapter 'v2' removed successfully."
    gone = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "v2"})
    assert gone.status_code == 404 and gone.json()["error"]["message"] == "The lora adapter 'v2' cannot be found."
    unknown = httpx.post(f"{url}/v1/completions", json={"model": "v2", "prompt": "1+1=", "max_tokens": 2})
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "NotFoundError"


def test_more_adapters_than_max_loras_load_and_answer(engine):
    """vLLM's --max-loras bounds the adapters in one batch, not the adapters loaded: the publish stage's
    `max_loras` is what keeps a server's set small."""
    fresh(engine)
    url = engine.lora
    for version in (2, 3):
        [result] = publish(
            [url], f"v{version}", version_row(engine.lake, version)["checkpoint_uri"], PublishConfig(max_loras=4)
        )
        assert result.action == "loaded", result.error
    with httpx.Client(timeout=60) as client:
        copy = version_row(engine.lake, 3)["checkpoint_uri"]
        assert (
            client.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "extra", "lora_path": copy}).status_code
            == 200
        )
        assert set(served_models(client, url)) == {"v0", "v2", "v3", "extra"}  # three, --max-loras 2
    assert delta(engine, 3, sampled(url, "extra")) <= FP32_GATE


def test_a_base_request_beside_adapter_requests_keeps_the_bases_logprobs(engine):
    """vLLM marks a token of a base-model request with adapter slot -1; the CPU build's LoRA ops (0.32) indexed
    the stacked adapters with it and so gave every base request that shared a step with adapter requests the
    adapter in the last `--max-loras` slot (the overlapped loop's base samples came back off the trainer's).
    serve.sh loads infra/vllm/rlvr_cpu_lora.py on the CPU build, which gives those rows no adapter term.
    Both of the adapter server's two slots hold an adapter, and base requests join long adapter requests."""
    from concurrent.futures import ThreadPoolExecutor

    fresh(engine)
    url = engine.lora
    for version in (2, 3):
        [result] = publish([url], f"v{version}", version_row(engine.lake, version)["checkpoint_uri"], PublishConfig())
        assert result.action == "loaded", result.error
    client = OpenAIPolicy(
        OpenAIBackendConfig(endpoints=[url], model_name="v{model_version}", concurrency=16, max_retries=1)
    )
    long = SamplerConfig(max_new_tokens=200)
    try:
        with ThreadPoolExecutor(3) as pool:
            adapters = [
                pool.submit(
                    client.generate,
                    [f"{k} plus {k} is" for k in range(8)],
                    2,
                    long,
                    seed=version,
                    model_version=version,
                )
                for version in (2, 3)
            ]
            while engine.engine == "vllm" and not requests_running(url):
                assert not any(job.done() for job in adapters), "the adapter requests ended before base ones joined"
                time.sleep(0.05)
            base = sampled(url, "v0")
            # vLLM batched them (the stand-in serves one request at a time: nothing to share a step with)
            assert engine.engine != "vllm" or not all(job.done() for job in adapters), "no adapter request was left"
            for job in adapters:
                assert all(sample.token_ids for group in job.result() for sample in group)
    finally:
        client.close()
    assert delta(engine, 0, base) <= FP32_GATE


def test_the_cpu_lora_extension_gives_rows_without_an_adapter_no_adapter_term(monkeypatch):
    """`rlvr_cpu_lora.skipping_base_rows` around an op indexed as the CPU build's `bgmv_shrink` is (the
    stacked weights indexed by each row's slot, so -1 is the last): rows of slot -1 get 0, the others their
    adapter's term, unchanged."""
    import torch
    from conftest import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "infra" / "vllm"))
    from rlvr_cpu_lora import skipping_base_rows

    def bgmv_shrink(inputs, weights, output, indices, scaling=1.0):  # vLLM 0.32's, torch_ops/lora_ops.py
        output[:, : weights.shape[-2]] = scaling * torch.einsum("bi, boi -> bo", inputs, weights[indices].squeeze(1))

    inputs, weights = torch.randn(4, 8), torch.randn(2, 1, 3, 8)
    indices = torch.tensor([0, -1, 1, -1])
    unmended, mended = torch.zeros(4, 3), torch.zeros(4, 3)
    bgmv_shrink(inputs, weights, unmended, indices, 0.5)
    skipping_base_rows(bgmv_shrink)(inputs, weights, mended, indices, 0.5)
    assert torch.allclose(unmended[1], 0.5 * weights[1, 0] @ inputs[1])  # the defect: slot -1 is the last
    assert torch.equal(mended[[1, 3]], torch.zeros(2, 3)) and torch.equal(mended[[0, 2]], unmended[[0, 2]])


def requests_running(url: str) -> bool:
    """Whether a vLLM server is generating now (its `vllm:num_requests_running` gauge)."""
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    return any(
        line.startswith("vllm:num_requests_running") and float(line.split()[-1]) > 0 for line in metrics.splitlines()
    )


def test_dev_mode_routes_answer_as_vllm_answers(engine):
    fresh(engine)
    url = engine.full[0]
    with httpx.Client(timeout=60, headers=ONE_REQUEST_A_CONNECTION) as client:
        assert client.post(f"{url}/collective_rpc", json={"method": "rlvr_loaded_version"}).json() == {"results": ["0"]}
        assert held_versions(client, url) == [0]
        missing = client.post(f"{url}/collective_rpc", json={})
        assert missing.status_code == 400 and "Missing 'method'" in missing.json()["error"]["message"]
        unknown = client.post(f"{url}/collective_rpc", json={"method": "no_such_method"})
        assert unknown.status_code == 500 and "no_such_method" in unknown.json()["error"]["message"]
        failed = client.post(
            f"{url}/collective_rpc", json={"method": "rlvr_load_checkpoint", "args": ["/nonexistent", 4]}
        )
        assert failed.status_code == 500 and "/nonexistent" in failed.json()["error"]["message"]
        assert held_versions(client, url) == [0]  # a failed load changes nothing
        assert client.post(f"{url}/pause", params={"mode": "wait"}).json() == {"status": "paused"}
        assert client.get(f"{url}/is_paused").json() == {"is_paused": True}
        assert client.post(f"{url}/resume").json() == {"status": "resumed"}
        assert client.get(f"{url}/is_paused").json() == {"is_paused": False}
        assert client.post(f"{url}/reset_prefix_cache").json() == {"success": True}
        assert client.post(f"{url}/sleep", params={"level": "1"}).json() == {"status": "sleeping", "level": 1}
        assert client.get(f"{url}/is_sleeping").json() == {"is_sleeping": True}
        with pytest.raises(httpx.ReadTimeout):  # asleep: a request waits, as while paused
            client.post(f"{url}/v1/completions", json={"model": "policy", "prompt": "1+1=", "max_tokens": 2}, timeout=3)
        assert client.post(f"{url}/wake_up").json() == {"status": "awake", "tags": None}
        assert client.get(f"{url}/is_sleeping").json() == {"is_sleeping": False}
        assert "/collective_rpc" in client.get(f"{url}/openapi.json").json()["paths"]
        unknown_model = client.post(f"{url}/v1/completions", json={"model": "v7", "prompt": "1+1=", "max_tokens": 2})
        assert unknown_model.status_code == 404 and unknown_model.json()["error"]["type"] == "NotFoundError"
        no_adapters = client.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "v2", "lora_path": "/x"})
        assert no_adapters.status_code == 404  # a one-name server has no adapter routes


def test_full_weights_swap_in_place_and_the_served_output_layer_is_the_new_versions(engine):
    """v1 differs from v0 in every weight, the tied embedding too: after the swap, the logits (the output layer
    tied to the new embedding) are v1's on every server, and both servers swap at once."""
    from flows.publishing import publish_version
    from tasks.rollout.stage import RolloutConfig

    fresh(engine)
    rollout = RolloutConfig(
        backend="openai", sampler=SAMPLER, openai=OpenAIBackendConfig(endpoints=engine.full, model_name="policy")
    )
    rows = publish_version(engine.lake, rollout, PublishConfig(), 1)
    assert [(row["method"], row["action"]) for row in rows] == [("full", "loaded")] * 2, rows
    assert all(held_versions(httpx.Client(), url) == [1] for url in engine.full)
    gate = engine.lake.read("logprob_checks").filter(model_version=1).tail(2)
    assert gate["passed"].to_list() == [True, True] and max(gate["mean_abs_delta"]) <= FP32_GATE
    assert delta(engine, 1, sampled(engine.full[1], "policy")) <= FP32_GATE
    assert all(httpx.get(f"{url}/is_paused").json() == {"is_paused": False} for url in engine.full)  # resumed
    again = publish_version(engine.lake, rollout, PublishConfig(), 1)
    assert [row["action"] for row in again] == ["already_served"] * 2
    client = OpenAIPolicy(rollout.openai)
    try:
        with pytest.raises(Exception, match=r"holds version \[1\]"):  # v0 is out of rotation now
            client.generate(PROMPTS, 2, SAMPLER, seed=1, model_version=0)
    finally:
        client.close()


def test_a_server_without_the_extension_refuses_full_weights_and_says_how_to_start_it(engine):
    from flows.publishing import publish_version
    from policy.publish import PublishFailed
    from tasks.rollout.stage import RolloutConfig

    fresh(engine)  # the adapter server: no dev mode, no worker extension
    assert "/collective_rpc" not in httpx.get(f"{engine.lora}/openapi.json").json()["paths"]
    rollout = RolloutConfig(
        backend="openai", sampler=SAMPLER, openai=OpenAIBackendConfig(endpoints=[engine.lora], model_name="v0")
    )
    with pytest.raises(PublishFailed, match="VLLM_SERVER_DEV_MODE=1.*WEIGHTS=full"):
        publish_version(engine.lake, rollout, PublishConfig(weights="full"), 1)
    assert engine.lake.read("publications").filter(endpoint=engine.lora)["action"].to_list()[-1] == "failed"


def test_servers_sleep_during_training_and_wake_after_even_when_it_fails(engine):
    from policy.layout import LayoutRefused, servers_asleep

    fresh(engine)
    url = engine.full[0]
    openai = OpenAIBackendConfig(endpoints=[url], model_name="policy", sleep_while_training=True)
    with pytest.raises(RuntimeError, match="the step failed"), servers_asleep(openai):
        assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": True}
        raise RuntimeError("the step failed")
    assert httpx.get(f"{url}/is_sleeping").json() == {"is_sleeping": False}
    assert delta(engine, 0, sampled(url, "policy")) <= FP32_GATE  # awake, with its weights
    with (
        pytest.raises(LayoutRefused, match="--enable-sleep-mode.*SLEEP=1"),
        servers_asleep(openai.model_copy(update={"endpoints": [engine.lora]})),
    ):
        pass
