"""Full fine-tunes published in place, layouts that fit the GPUs, and checkpoints the servers can read.

End to end over HTTP on CPU: `rlvr policy serve --served-model-name policy --dev-mode` serves one model
under one name as vLLM does, and offers vLLM's dev-mode routes (`/collective_rpc` to the worker
extension's methods, `/reset_prefix_cache`, `/pause`, `/resume`, `/sleep`, `/wake_up`). The worker
extension itself (`infra/vllm/rlvr_weights.py`) runs inside vLLM, which cannot start here: its test
mixes it into a stand-in worker holding a real transformers model."""

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from conftest import BIN, ROOT, free_port, register_sharpened_version, serve_policy, wait_for
from storage.checkpoints import load_policy
from storage.registry import version_row
from tasks.generators.base import derive_seed
from tasks.rollout.base_policy import BasePolicyConfig, ensure_base_policy
from tasks.rollout.hf import HFPolicy
from tasks.rollout.layout import LayoutRefused, preflight, servers_asleep
from tasks.rollout.openai_backend import OpenAIBackendConfig, OpenAIPolicy, RequestRefused, held_versions
from tasks.rollout.publish import PublishConfig, PublishFailed, staged
from tasks.rollout.sampling import SamplerConfig
from tasks.rollout.tiny import TinyModelConfig

SAMPLER = SamplerConfig(max_new_tokens=12)
SMALL = TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2)


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    from storage.lake import Lake

    opened = Lake.open(str(tmp_path_factory.mktemp("full") / "lake"))
    ensure_base_policy(opened, BasePolicyConfig(tiny=SMALL, tokenizer_corpus=50))
    register_sharpened_version(opened, 1)
    return opened


@pytest.fixture
def one_model_server(lake):
    """vLLM as `serve.sh WEIGHTS=full` starts it: one model, `policy`, holding version 0, in dev mode."""
    process, url = serve_policy(lake, "--served-model-name", "policy", "--dev-mode")
    yield url
    process.terminate()
    process.wait(10)


def rollout(url: str, **openai):
    from tasks.rollout.stage import RolloutConfig

    return RolloutConfig(backend="openai", sampler=SAMPLER,
                         openai=OpenAIBackendConfig(endpoints=[url], model_name="policy", **openai))


def test_a_full_checkpoint_is_swapped_in_and_the_next_samples_come_from_it(lake, one_model_server):
    from flows.publishing import publish_version

    client = OpenAIPolicy(rollout(one_model_server).openai)
    with pytest.raises(RequestRefused, match=r"holds version \[0\]"):      # not published yet: out of rotation
        client.generate(["7*8 ="], 2, SAMPLER, seed=3, model_version=1)

    rows = publish_version(lake, rollout(one_model_server), PublishConfig(), 1)
    assert [(r["method"], r["action"]) for r in rows] == [("full", "loaded")] and rows[0]["seconds"] > 0
    assert held_versions(httpx.Client(), one_model_server) == [1]
    assert httpx.get(f"{one_model_server}/is_paused").json() == {"is_paused": False}   # resumed after the swap
    gate = lake.read("logprob_checks").filter(endpoint=one_model_server)
    assert gate["passed"].to_list() == [True] and gate["model_version"].to_list() == [1]

    remote = client.generate(["7*8 ="], 4, SAMPLER, seed=3, model_version=1)[0]
    model, tokenizer = load_policy(version_row(lake, 1)["checkpoint_uri"])
    local = HFPolicy(model, tokenizer, 1).generate(["7*8 ="], 4, SAMPLER, derive_seed(3, 0) % 2**31, 1)[0]
    assert [s.token_ids for s in remote] == [s.token_ids for s in local]   # version 1's weights answer

    again = publish_version(lake, rollout(one_model_server), PublishConfig(), 1)
    assert again[0]["action"] == "already_served"
    recorded = lake.read("publications").filter(endpoint=one_model_server)
    assert recorded["method"].to_list() == ["full", "full"] and recorded["seconds"].null_count() == 1


def test_a_server_without_the_extension_refuses_full_weights_and_says_how_to_start_it(lake):
    from flows.publishing import publish_version

    process, url = serve_policy(lake, "--served-model-name", "policy")                 # no dev mode
    try:
        assert "/collective_rpc" not in httpx.get(f"{url}/openapi.json").json()["paths"]
        with pytest.raises(PublishFailed, match="VLLM_SERVER_DEV_MODE=1.*WEIGHTS=full"):
            publish_version(lake, rollout(url), PublishConfig(weights="full"), 1)
        assert lake.read("publications").filter(endpoint=url)["action"].to_list() == ["failed"]
    finally:
        process.terminate()
        process.wait(10)


def test_servers_sleep_during_training_and_wake_after_even_when_it_fails(lake, one_model_server):
    openai = rollout(one_model_server, sleep_while_training=True).openai
    with pytest.raises(RuntimeError, match="the step failed"), servers_asleep(openai):
        assert httpx.get(f"{one_model_server}/is_sleeping").json() == {"is_sleeping": True}
        answer = httpx.post(f"{one_model_server}/v1/completions", json={"model": "policy", "prompt": "1+1="})
        assert answer.status_code == 503                                         # asleep: no sampling
        raise RuntimeError("the step failed")
    assert httpx.get(f"{one_model_server}/is_sleeping").json() == {"is_sleeping": False}


def test_a_server_that_cannot_sleep_is_named(lake):
    process, url = serve_policy(lake)
    try:
        with pytest.raises(LayoutRefused, match="--enable-sleep-mode.*SLEEP=1"), \
                servers_asleep(rollout(url, sleep_while_training=True).openai):
            pass
    finally:
        process.terminate()
        process.wait(10)


def test_the_preflight_refuses_a_shared_gpu_without_a_memory_split():
    shared = OpenAIBackendConfig(server_devices=[0])
    with pytest.raises(LayoutRefused, match="no memory split is stated.*90%"):
        preflight("cuda", shared)
    with pytest.raises(LayoutRefused, match="leaves the trainer 10%"):
        preflight("cuda:0", shared.model_copy(update={"gpu_memory_utilization": 0.9}))
    assert preflight("cuda:0", shared.model_copy(update={"gpu_memory_utilization": 0.45}), gpu_memory_gib=80) == [
        "GPU 0: the servers take 45% of its memory, the trainer the other 55% (44 of 80 GiB)"]
    assert "sleep" in preflight("cuda", shared.model_copy(update={"sleep_while_training": True}))[0]
    assert "no device shared" in preflight("cuda:4", OpenAIBackendConfig(server_devices=[0, 1, 2, 3]))[0]
    assert "no device shared" in preflight("cpu", shared)[0]
    with pytest.raises(LayoutRefused, match="overlapped loop"):
        preflight("cuda:1", shared.model_copy(update={"sleep_while_training": True}), loop_mode="async")
    with pytest.raises(LayoutRefused, match="one name.*loop.mode sync"):
        preflight("cuda:1", OpenAIBackendConfig(model_name="policy"), loop_mode="async")


@pytest.mark.parametrize("name", ["gpu.yaml", "gpu-8.yaml", "gpu-2x8.yaml"])
def test_the_shipped_gpu_layouts_pass_the_preflight(name):
    from flows.run_config import load_run_config

    from flows.loop import check_layout

    check_layout(load_run_config(ROOT / "configs" / name))     # every rank's device against the servers'



def test_an_s3_checkpoint_is_staged_where_the_server_reads_it(s3_env, tmp_path):
    from storage.lake import Lake
    from tasks.rollout.publish import publish

    lake = Lake.open(f"s3://{s3_env}/lake")
    ensure_base_policy(lake, BasePolicyConfig(tiny=SMALL, tokenizer_corpus=50))
    uri = version_row(lake, 0)["checkpoint_uri"]
    assert uri.startswith("s3://")
    folder = staged(uri, str(tmp_path / "shared"))
    assert folder == str(tmp_path / "shared" / uri.removeprefix("s3://")) and (Path(folder) / "config.json").exists()
    assert staged(uri, str(tmp_path / "shared")) == folder                       # once

    port = free_port()                 # a server without S3 credentials: it reads the shared folder only
    process = subprocess.Popen([str(BIN / "rlvr"), "policy", "serve", "--lake", str(tmp_path / "none"), "--port",
                                str(port), "--no-on-demand"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    try:
        wait_for(f"http://127.0.0.1:{port}/health", process, 60, "rlvr policy serve")
        config = PublishConfig(staging_dir=str(tmp_path / "shared"), path_map={str(tmp_path): "/srv"})
        [result] = publish([f"http://127.0.0.1:{port}"], "v7", uri, config)
        assert result.path == "/srv/shared/" + uri.removeprefix("s3://")        # staged, then path_map
        assert result.action == "failed" and "/srv/shared" in result.error      # the server looked there
        [result] = publish([f"http://127.0.0.1:{port}"], "v7", uri, PublishConfig(staging_dir=str(tmp_path / "shared")))
        assert result.action == "loaded", result.error
    finally:
        process.terminate()
        process.wait(10)


def test_the_worker_extension_loads_a_checkpoint_into_the_workers_model(lake, monkeypatch):
    """`CheckpointLoader` mixed into a worker whose model loads (name, tensor) pairs as vLLM's models do."""
    import torch

    sys.path.insert(0, str(ROOT / "infra" / "vllm"))
    from rlvr_weights import CheckpointLoader

    base, _ = load_policy(version_row(lake, 0)["checkpoint_uri"])
    sharpened, _ = load_policy(version_row(lake, 1)["checkpoint_uri"])
    loaded_names = []

    def load_weights(weights):
        state = dict(weights)
        loaded_names.extend(state)
        base.load_state_dict(state, strict=False)

    base.load_weights = load_weights
    runner = type("Runner", (), {"get_model": lambda self: base})()
    worker = type("Worker", (CheckpointLoader,), {"model_runner": runner})()
    monkeypatch.setenv("RLVR_BASE_VERSION", "0")
    assert worker.rlvr_loaded_version() == 0
    worker.rlvr_load_checkpoint(version_row(lake, 1)["checkpoint_uri"], 1)
    assert worker.rlvr_loaded_version() == 1 and loaded_names
    for name, parameter in sharpened.state_dict().items():
        assert torch.equal(base.state_dict()[name], parameter), name

    calls = []                                         # vLLM 0.16+: its own reload_weights does the load
    native = type("Worker", (CheckpointLoader,), {"reload_weights": lambda self, weights_path=None,
                                                   is_checkpoint_format=True: calls.append(weights_path)})()
    native.rlvr_load_checkpoint("/models/v2", 2)
    assert calls == ["/models/v2"] and native.rlvr_loaded_version() == 2
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        worker.rlvr_load_checkpoint(str(ROOT / "configs"), 3)
