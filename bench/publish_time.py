"""`rlvr bench publish`: how long making a new model version servable takes, three ways, on this machine.

Against `rlvr policy serve` in its own process (the stand-in that speaks vLLM's protocols), over HTTP, for
`versions` freshly trained-looking versions of the tiny policy (random weights, one seed each):

- full weights swapped in place: `/pause`, `/collective_rpc rlvr_load_checkpoint`, `/reset_prefix_cache`,
  `/resume`, confirmed by every worker's `rlvr_loaded_version` (what `serve.sh WEIGHTS=full` allows);
- a LoRA-style load by name: `POST /v1/load_lora_adapter`, confirmed by `GET /v1/models`;
- the baseline the docs used to prescribe for full checkpoints: restart the server on the new version and
  wait until it answers a completion.

Plus the log-prob agreement gate's time per version (sampling 4 prompts × 2 short responses, recomputing).
On a GPU host with vLLM the same code paths run; the absolute times there are vLLM's (loading weights
into GPU memory, CUDA graphs at restart), so the ratio is what carries over, not the seconds.
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

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = ("bench/publish_time.py", "tasks/rollout/publish.py", "tasks/rollout/server.py",
              "tasks/rollout/agreement.py", "tasks/rollout/openai_backend.py", "tasks/rollout/hf.py",
              "tasks/rollout/sampling.py", "tasks/rollout/logprobs.py", "storage/checkpoints.py",
              "flows/publishing.py", "flows/cli/policy.py")

BIN = Path(sys.executable).parent


def start_server(lake_uri: str, port: int, *options: str) -> subprocess.Popen:
    """`rlvr policy serve`, returned once it answers a completion (the model is loaded and has run once)."""
    process = subprocess.Popen([str(BIN / "rlvr"), "policy", "serve", "--lake", lake_uri, "--port", str(port),
                                *options], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    model = options[options.index("--served-model-name") + 1] if "--served-model-name" in options else "v0"
    while time.monotonic() < deadline:
        try:
            if httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "1+1=", "max_tokens": 1},
                          timeout=30).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"rlvr policy serve on port {port} did not answer within 120 s")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    process.wait(10)


def register_versions(lake, count: int) -> None:
    """Versions 1..count: the tiny policy with other random weights (as big as a trained version)."""
    from storage.checkpoints import load_policy, save_checkpoint
    from storage.registry import register, version_row
    from tasks.rollout.tiny import TinyModelConfig, build_model

    _, tokenizer = load_policy(version_row(lake, 0)["checkpoint_uri"])
    for version in range(1, count + 1):
        with lake.run("bench", "register", {"version": version}) as run:
            uri = save_checkpoint(lake, version, build_model(TinyModelConfig(seed=version), tokenizer), tokenizer)
            register(lake, run, version, uri=uri, kind="bench", parent=version - 1)


def run_benchmark(versions: int = 5) -> dict:
    """Median seconds per publish each way, the gate's, and the restart's ratio to the swap."""
    from flows.publishing import check_agreement
    from storage.lake import Lake
    from storage.registry import version_row
    from tasks.rollout.base_policy import BasePolicyConfig, ensure_base_policy
    from tasks.rollout.openai_backend import OpenAIBackendConfig
    from tasks.rollout.publish import PublishConfig, publish
    from tasks.rollout.stage import RolloutConfig
    from tasks.rollout.sampling import SamplerConfig

    with tempfile.TemporaryDirectory(prefix="rlvr-bench-publish-") as work:
        lake = Lake.open(f"{work}/lake")
        ensure_base_policy(lake, BasePolicyConfig())
        register_versions(lake, versions)
        folders = {v: version_row(lake, v)["checkpoint_uri"] for v in range(1, versions + 1)}
        swap, by_name, gate, restart = [], [], [], []

        port = _free_port()
        server = start_server(lake.uri, port, "--served-model-name", "policy", "--dev-mode")
        url = f"http://127.0.0.1:{port}"
        rollout = RolloutConfig(backend="openai", sampler=SamplerConfig(max_new_tokens=48),
                                openai=OpenAIBackendConfig(endpoints=[url], model_name="policy"))
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
            stop(server)

        port = _free_port()
        server = start_server(lake.uri, port, "--no-on-demand", "--preload", "0")
        url = f"http://127.0.0.1:{port}"
        try:
            for version, folder in folders.items():
                started = time.perf_counter()
                [result] = publish([url], f"v{version}", folder, PublishConfig(weights="adapter", max_loras=versions + 1))
                by_name.append(time.perf_counter() - started)
                if result.action != "loaded":
                    raise RuntimeError(f"version {version} was not loaded by name: {result.error}")
        finally:
            stop(server)

        for version in folders:                      # the baseline: a new server on each version
            started = time.perf_counter()
            stop(start_server(lake.uri, _free_port(), "--served-model-name", "policy", "--preload", str(version)))
            restart.append(time.perf_counter() - started)

    figures = {"versions": versions, "swap_seconds": statistics.median(swap),
               "by_name_seconds": statistics.median(by_name), "restart_seconds": statistics.median(restart),
               "gate_seconds": statistics.median(gate)}
    figures["restart_to_swap_ratio"] = figures["restart_seconds"] / figures["swap_seconds"]
    console.print(f"per publish (median of {versions}): full weights swapped in place {figures['swap_seconds']:.3f} s, "
                  f"loaded by name {figures['by_name_seconds']:.3f} s, server restarted {figures['restart_seconds']:.2f} s "
                  f"(×{figures['restart_to_swap_ratio']:.1f} the swap); the log-prob gate {figures['gate_seconds']:.2f} s")
    return figures


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
