"""Publishing model versions to inference servers over vLLM's protocol, end to end over HTTP:
`rlvr policy serve --no-on-demand` loads and unloads versions as vLLM does, the publish stage
confirms each one through `GET /v1/models`, and nothing samples from a server that has not."""

import subprocess
import threading

import httpx
import pyarrow.compute as pc
import pytest
import yaml
from conftest import BIN, free_port, register_random_version, wait_for
from helpers import CONFIG, SMALL_POLICY, Scripted

from policy.openai_backend import OpenAIBackendConfig, OpenAIPolicy, RequestRefused
from policy.publish import PublishConfig, PublishFailed, publish, require_confirmed, version_of
from policy.sampling import SamplerConfig
from tasks.rollout.base_policy import BasePolicyConfig, ensure_base_policy

SAMPLER = SamplerConfig(max_new_tokens=8)


@pytest.fixture(scope="module")
def versions_lake(tmp_path_factory):
    """A lake with model versions 0-3 (different random weights)."""
    from storage.lake import Lake

    lake = Lake.open(str(tmp_path_factory.mktemp("published") / "lake"))
    ensure_base_policy(lake, BasePolicyConfig.model_validate(SMALL_POLICY))
    for version in (1, 2, 3):
        register_random_version(lake, version, seed=version)
    return lake


def checkpoint(lake, version: int) -> str:
    from storage.registry import version_row

    return version_row(lake, version)["checkpoint_uri"]


@pytest.fixture
def vllm_like(versions_lake):
    """Two servers that behave as vLLM does (only v0 at start, the rest loaded by path), in threads."""
    from policy.server import PolicyServer, folder_loader, lake_loader

    servers = [
        PolicyServer(
            ("127.0.0.1", 0), lake_loader(versions_lake.uri), on_demand=False, load_path=folder_loader(), preload=(0,)
        )
        for _ in range(2)
    ]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield [f"http://127.0.0.1:{server.server_port}" for server in servers]
    for server in servers:
        server.shutdown()
        server.server_close()


def listed(endpoint: str) -> list[str]:
    return [entry["id"] for entry in httpx.get(f"{endpoint}/v1/models").json()["data"]]


def test_publishing_confirms_each_endpoint_and_takes_a_failing_one_out_of_rotation(versions_lake, vllm_like):
    refusing = Scripted(lambda body, count: (500, {"error": {"message": "out of GPU memory"}}), models=["v0"])
    dead = f"http://127.0.0.1:{free_port()}"
    endpoints = [*vllm_like, refusing.url, dead]
    try:
        results = publish(endpoints, "v1", checkpoint(versions_lake, 1), PublishConfig(), protected={"v0"})
        assert [r.action for r in results] == ["loaded", "loaded", "failed", "failed"]
        assert "HTTP 500: " in results[2].error and "out of GPU memory" in results[2].error
        assert "ConnectError" in results[3].error
        require_confirmed(results, 2)
        with pytest.raises(PublishFailed, match=r"served by 2 of 4 endpoint\(s\), 3 needed.*out of GPU memory"):
            require_confirmed(results, 3)
        again = publish(endpoints[:2], "v1", checkpoint(versions_lake, 1), PublishConfig(), protected={"v0"})
        assert [r.action for r in again] == ["already_served"] * 2

        # sampling v1 goes only to the servers that list it: the refusing one is out of rotation, the dead
        # one stays in (the request retries find out), and a version nobody lists is refused at once
        policy = OpenAIPolicy(OpenAIBackendConfig(endpoints=endpoints, concurrency=4, backoff_seconds=0.05))
        assert policy.rotation("v1") == [*vllm_like, dead]
        groups = policy.generate([f"{i}+1=" for i in range(8)], 2, SAMPLER, 0, model_version=1)
        assert {sample.backend for group in groups for sample in group} == {f"openai:{e}" for e in vllm_like}
        assert [set(r) for r in refusing.requests] == [{"lora_name", "lora_path"}]  # its load, no completion
        with pytest.raises(RequestRefused, match="no endpoint serves model 'v2'.*publish the version first"):
            OpenAIPolicy(OpenAIBackendConfig(endpoints=[*vllm_like, refusing.url])).generate(["x"], 2, SAMPLER, 0, 2)
    finally:
        refusing.close()


def test_only_the_newest_versions_stay_loaded_and_the_base_never_goes(versions_lake, vllm_like):
    endpoint = vllm_like[0]
    for version in (1, 2, 3):
        results = publish(
            [endpoint], f"v{version}", checkpoint(versions_lake, version), PublishConfig(max_loras=2), protected={"v0"}
        )
        assert results[0].confirmed
    assert results[0].unloaded == ["v1"] and listed(endpoint) == ["v0", "v2", "v3"]
    assert version_of("v12", "v{model_version}") == 12 and version_of("qwen-v3-lora", "qwen-v{model_version}-lora") == 3
    assert version_of("v0-base", "v{model_version}") is None


def test_the_loop_publishes_every_version_before_sampling_it(cli, tmp_path):
    """`rlvr run` on the openai backend against `rlvr policy serve --no-on-demand` (a separate process that
    knows only v0 at start, as a vLLM server started on the base model does): every trained version is
    loaded, confirmed and recorded before the iteration and evaluation that sample it."""
    from helpers import RUN, curated_with_eval

    from flows.loop import rl_loop
    from policy.layout import LayoutRefused
    from storage.lake import Lake

    lake_uri = str(tmp_path / "lake")
    curated_with_eval(lake_uri)
    lake = Lake.open(lake_uri)
    ensure_base_policy(lake, BasePolicyConfig.model_validate(SMALL_POLICY))
    port = free_port()
    server = subprocess.Popen(
        [
            str(BIN / "rlvr"),
            "policy",
            "serve",
            "--lake",
            lake_uri,
            "--port",
            str(port),
            "--no-on-demand",
            "--preload",
            "0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{endpoint}/health", server, 60, "rlvr policy serve")
        remote = {
            **RUN,
            "rollout": {
                **CONFIG["rollout"],
                "backend": "openai",
                "openai": {"endpoints": [endpoint], "backoff_seconds": 0.05},
            },
            "publish": {"max_loras": 2},
        }
        rows = rl_loop(remote, lake_uri=lake_uri)
        assert [(r["iteration"], r["model_version"], r["trained_version"]) for r in rows] == [(1, 0, 1), (2, 1, 2)]
        assert listed(endpoint) == ["v0", "v1", "v2"]
        gate = lake.read("logprob_checks").sort("created_at")  # the gate ran at start and on each version
        assert gate["model_version"].to_list() == [0, 1, 2] and all(gate["passed"])
        shared = {
            **remote,
            "train": {**RUN.get("train", {}), "device": "cuda"},
            "rollout": {**remote["rollout"], "openai": {**remote["rollout"]["openai"], "server_devices": [0]}},
        }
        with pytest.raises(LayoutRefused, match="no memory split is stated"):  # refused before anything runs
            rl_loop(shared, lake_uri=lake_uri)
        assert lake.read("iteration_metrics").height == 2
        config = tmp_path / "remote.yaml"  # by hand: v2 is served already, v1 goes (max_loras 1)
        config.write_text(yaml.safe_dump({"rollout": remote["rollout"], "publish": {"max_loras": 1}}))
        by_hand = cli("policy", "publish", "2", "--config", str(config), "--lake", lake_uri)
        assert by_hand.returncode == 0, by_hand.stderr[-2000:]
        assert "already_served" in by_hand.stdout and "v1" in by_hand.stdout and listed(endpoint) == ["v0", "v2"]
    finally:
        server.terminate()
        server.wait(10)
    publications = lake.read("publications").sort("created_at")
    assert publications.select("model_version", "action").rows() == [
        (0, "already_served"),
        (1, "loaded"),
        (2, "loaded"),
        (2, "already_served"),
    ]
    assert set(publications["endpoint"]) == {endpoint} and publications["error"].null_count() == 4
    assert publications["unloaded"].to_list()[-1] == ["v1"]
    runs = lake.read("runs", filter=pc.field("stage") == "publish")
    assert runs.height == 4 and set(runs["status"]) == {"completed"}
    rollouts = lake.read("rollouts", columns=["iteration", "model_version", "backend", "created_at"])
    assert set(rollouts["backend"]) == {f"openai:{endpoint}"}
    for version in (1, 2):  # confirmed before anything sampled it
        published = publications.filter(publications["model_version"] == version)["created_at"][0]
        sampled = rollouts.filter(rollouts["model_version"] == version)["created_at"]
        evaluated = lake.read("eval_rollouts", filter=pc.field("model_version") == version)["created_at"]
        assert published < min(sampled.min() or evaluated.min(), evaluated.min())


def test_the_publish_benchmark_measures_each_way_on_the_stand_in(tmp_path):
    """`rlvr bench publish` (its figures are in docs/benchmarks.md): one version each way on the stand-in, every
    figure measured and the ratio the one it reports."""
    import json

    result = subprocess.run(
        [str(BIN / "rlvr"), "bench", "publish", "--versions", "1", "--engine", "stand-in", "--format", "json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout)["figures"]
    assert figures["engine"] == "stand-in" and figures["versions"] == 1
    seconds = [figures[name] for name in ("swap_seconds", "by_name_seconds", "restart_seconds", "gate_seconds")]
    assert all(value > 0 for value in seconds)
    assert figures["restart_to_swap_ratio"] == pytest.approx(figures["restart_seconds"] / figures["swap_seconds"])
