"""`rlvr bench publish`: how long making a new model version servable takes, three ways, on this machine.

Against `rlvr policy serve` in its own process (the stand-in that speaks vLLM's protocols), over HTTP, for
`versions` freshly trained-looking versions of the tiny policy (random weights, one seed each):

- full weights swapped in place: `/pause`, `/collective_rpc rlvr_load_checkpoint`, `/reset_prefix_cache`,
  `/resume`, confirmed by every worker's `rlvr_loaded_version` (what `serve.sh WEIGHTS=full` allows);
- a LoRA-style load by name: `POST /v1/load_lora_adapter`, confirmed by `GET /v1/models`;
- the baseline the docs used to prescribe for full checkpoints: restart the server on the new version and
  wait until it answers a completion.

Plus the log-prob agreement gate's time per version (sampling 4 prompts × 2 short responses, recomputing).

`engine="vllm"`: the same three ways against real vLLM servers (its CPU build from `.venv-vllm`, started by
`infra/vllm/serve.sh`: WEIGHTS=full for the swap and the restart, WEIGHTS=adapter for the loads by name, here
LoRA adapters on the base, since vLLM loads only adapters by name). On a GPU host the same code paths run; the
absolute times there are vLLM's on the GPU (weights into GPU memory, CUDA graphs at restart).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from flows.display import console
from policy import vllm_servers

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = (
    "bench/publish_time.py",
    "policy/vllm_servers.py",
    "infra/vllm/serve.sh",
    "infra/vllm/rlvr_weights.py",
    "policy/publish.py",
    "policy/server.py",
    "policy/agreement.py",
    "policy/openai_backend.py",
    "policy/hf.py",
    "policy/sampling.py",
    "policy/logprobs.py",
    "policy/checkpoints.py",
    "flows/publishing.py",
    "flows/cli/policy.py",
)

BIN = Path(sys.executable).parent


def start_server(lake_uri: str, port: int, *options: str) -> subprocess.Popen:
    """`rlvr policy serve`, returned once it answers a completion (the model is loaded and has run once)."""
    process = subprocess.Popen(
        [str(BIN / "rlvr"), "policy", "serve", "--lake", lake_uri, "--port", str(port), *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    model = options[options.index("--served-model-name") + 1] if "--served-model-name" in options else "v0"
    while time.monotonic() < deadline:
        try:
            if (
                httpx.post(
                    f"{url}/v1/completions", json={"model": model, "prompt": "1+1=", "max_tokens": 1}, timeout=30
                ).status_code
                == 200
            ):
                return process
        except httpx.HTTPError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"rlvr policy serve on port {port} did not answer within 120 s")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    process.wait(10)


ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def random_adapter(base: str, rank: int, target_modules: list[str], seed: int, scale: float):
    """(model, tokenizer): a LoRA adapter on the checkpoint at `base` whose B matrices are random (N(0, scale²),
    seeded), since a fresh adapter changes nothing: what `train.lora` writes, with a visible effect."""
    import torch
    from peft import LoraConfig, get_peft_model

    from policy.checkpoints import load_policy, peft_warnings_quiet

    model, tokenizer = load_policy(base)
    with peft_warnings_quiet():
        model = get_peft_model(
            model, LoraConfig(r=rank, lora_alpha=2 * rank, task_type="CAUSAL_LM", target_modules=target_modules)
        )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, scale, generator=generator)
    return model, tokenizer


def register_versions(lake, count: int, adapters: bool = False) -> None:
    """Versions 1..count: the tiny policy with other random weights (as big as a trained version), or with
    `adapters`, LoRA adapters on version 0 (r 8 on every projection, random B) as `train.lora` writes them."""
    from policy.checkpoints import load_policy, save_checkpoint
    from policy.tiny import TinyModelConfig, build_model
    from storage.registry import register, version_row

    base = version_row(lake, 0)["checkpoint_uri"]
    for version in range(1, count + 1):
        if adapters:
            model, tokenizer = random_adapter(base, 8, ALL_PROJECTIONS, seed=version, scale=0.1)
        else:
            _, tokenizer = load_policy(base)
            model = build_model(TinyModelConfig(seed=version), tokenizer)
        with lake.run("bench", "register", {"version": version}) as run:
            uri = save_checkpoint(lake, version, model, tokenizer, adapter_of=base if adapters else None)
            register(lake, run, version, uri=uri, kind="bench", parent=0 if adapters else version - 1)


class Servers:
    """Starts the servers of one engine: (URL, stop) of a one-name dev-mode server on a folder, and of a
    server that loads versions by name."""

    def __init__(self, engine: str, lake, work: str):
        self.engine, self.lake, self.work = engine, lake, Path(work)

    def full(self, version: int):
        if self.engine == "vllm":
            from storage.registry import version_row

            server = vllm_servers.serving(
                version_row(self.lake, version)["checkpoint_uri"],
                self.work / "logs",
                vllm_servers.free_port(),
                WEIGHTS="full",
                BASE_VERSION=str(version),
            )
            httpx.post(
                f"{server.url}/v1/completions", json={"model": "policy", "prompt": "1+1=", "max_tokens": 1}, timeout=120
            ).raise_for_status()  # as the stand-in's start: it has answered once
            return server.url, server.stop
        port = vllm_servers.free_port()
        process = start_server(
            self.lake.uri, port, "--served-model-name", "policy", "--dev-mode", "--preload", str(version)
        )
        return f"http://127.0.0.1:{port}", lambda: stop(process)

    def by_name(self):
        if self.engine == "vllm":
            from storage.registry import version_row

            server = vllm_servers.serving(
                version_row(self.lake, 0)["checkpoint_uri"],
                self.work / "logs",
                vllm_servers.free_port(),
                WEIGHTS="adapter",
            )
            return server.url, server.stop
        port = vllm_servers.free_port()
        process = start_server(self.lake.uri, port, "--no-on-demand", "--preload", "0")
        return f"http://127.0.0.1:{port}", lambda: stop(process)


def run_benchmark(versions: int = 5, engine: str = "stand-in") -> dict:
    """Median seconds per publish each way, the gate's, and the restart's ratio to the swap."""
    from flows.publishing import check_agreement
    from policy.openai_backend import OpenAIBackendConfig
    from policy.publish import PublishConfig, publish
    from policy.sampling import SamplerConfig
    from storage.lake import Lake
    from storage.registry import version_row
    from tasks.rollout.base_policy import BasePolicyConfig, ensure_base_policy
    from tasks.rollout.stage import RolloutConfig

    with tempfile.TemporaryDirectory(prefix="rlvr-bench-publish-") as work:
        lake = Lake.open(f"{work}/lake")
        ensure_base_policy(lake, BasePolicyConfig())
        register_versions(lake, versions)
        folders = {v: version_row(lake, v)["checkpoint_uri"] for v in range(1, versions + 1)}
        by_name_lake = lake  # the stand-in loads full checkpoints by name
        if engine == "vllm":  # vLLM loads only LoRA adapters by name
            by_name_lake = Lake.open(f"{work}/adapters")
            ensure_base_policy(by_name_lake, BasePolicyConfig(checkpoint=version_row(lake, 0)["checkpoint_uri"]))
            register_versions(by_name_lake, versions, adapters=True)
        named = {v: version_row(by_name_lake, v)["checkpoint_uri"] for v in folders}
        servers = Servers(engine, lake, work)
        swap, by_name, gate, restart = [], [], [], []

        url, stop_server = servers.full(0)
        rollout = RolloutConfig(
            backend="openai",
            sampler=SamplerConfig(max_new_tokens=48),
            openai=OpenAIBackendConfig(endpoints=[url], model_name="policy"),
        )
        try:
            for version, folder in folders.items():
                started = time.perf_counter()
                [result] = publish([url], "policy", folder, PublishConfig(weights="full"), "policy", version=version)
                swap.append(time.perf_counter() - started)
                if result.action != "loaded":
                    raise RuntimeError(f"version {version} was not swapped in: {result.error}")
                started = time.perf_counter()
                [agreement] = check_agreement(lake, rollout, version, "policy", [url])
                gate.append(time.perf_counter() - started)
                if not agreement.passed:
                    raise RuntimeError(f"the gate failed after swapping in version {version}: {agreement.causes}")
        finally:
            stop_server()

        url, stop_server = servers.by_name()
        try:
            for version, folder in named.items():
                started = time.perf_counter()
                [result] = publish(
                    [url], f"v{version}", folder, PublishConfig(weights="adapter", max_loras=versions + 1)
                )
                by_name.append(time.perf_counter() - started)
                if result.action != "loaded":
                    raise RuntimeError(f"version {version} was not loaded by name: {result.error}")
        finally:
            stop_server()

        for version in folders:  # the baseline: a new server on each version
            started = time.perf_counter()
            _, stop_server = servers.full(version)
            restart.append(time.perf_counter() - started)
            stop_server()

    figures = {
        "engine": engine,
        "versions": versions,
        "swap_seconds": statistics.median(swap),
        "by_name_seconds": statistics.median(by_name),
        "restart_seconds": statistics.median(restart),
        "gate_seconds": statistics.median(gate),
    }
    figures["restart_to_swap_ratio"] = figures["restart_seconds"] / figures["swap_seconds"]
    console.print(
        f"per publish on {engine} (median of {versions}): full weights swapped in place {figures['swap_seconds']:.3f} s, "
        f"loaded by name {figures['by_name_seconds']:.3f} s, server restarted {figures['restart_seconds']:.2f} s "
        f"(×{figures['restart_to_swap_ratio']:.1f} the swap); the log-prob gate {figures['gate_seconds']:.2f} s"
    )
    return figures
