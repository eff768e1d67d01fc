"""Where the inference servers and the trainer sit on a host's GPUs, checked before a run starts.

vLLM takes 90 % of its GPU's memory by default; a trainer on the same GPU then runs out of memory at
its first step. The pre-flight check refuses a config whose trainer shares a device with a server
unless the split is stated (`rollout.openai.gpu_memory_utilization`, the value `serve.sh` starts the
servers with) and leaves the trainer a real share, or the servers sleep while it trains
(`sleep_while_training`: vLLM's sleep mode frees the KV cache and moves the weights to CPU memory).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from policy.openai_backend import OpenAIBackendConfig

VLLM_DEFAULT_UTILIZATION = 0.9
LEAST_TRAINER_SHARE = 0.2  # below this a trainer of any real model fails at its first step


class LayoutRefused(ValueError):
    """The trainer and the servers would not fit the GPUs as configured."""


def cuda_index(device: str) -> int | None:
    """The GPU index of a torch device string (`cuda` is 0); None for a CPU."""
    if not device.startswith("cuda"):
        return None
    return int(device.partition(":")[2] or 0)


def preflight(
    train_device: str, openai: OpenAIBackendConfig, loop_mode: str = "sync", gpu_memory_gib: float | None = None
) -> list[str]:
    """Refuse a layout that cannot work; otherwise the lines that say how memory is split."""
    if openai.sleep_while_training and loop_mode != "sync":
        raise LayoutRefused(
            "rollout.openai.sleep_while_training: the overlapped loop (loop.mode async) samples while "
            "it trains, so the servers cannot sleep then; use loop.mode sync, or separate GPUs"
        )
    if "{model_version}" not in openai.model_name and loop_mode != "sync":
        raise LayoutRefused(
            f"rollout.openai.model_name {openai.model_name!r} serves every version under one name "
            "(full weights swapped in place), while the overlapped loop samples one version as the "
            "next is published: use LoRA adapters (train.lora, model_name v{model_version}) or "
            "loop.mode sync"
        )
    gpu = cuda_index(train_device)
    if gpu is None or gpu not in openai.server_devices:
        return [
            f"trainer on {train_device}; servers on "
            + (f"GPU(s) {openai.server_devices}" if openai.server_devices else "other machines")
            + ": no device shared"
        ]
    if openai.sleep_while_training:
        return [f"GPU {gpu}: the servers sleep while the trainer trains (weights to CPU, KV cache freed)"]
    share = openai.gpu_memory_utilization
    if share is None:
        raise LayoutRefused(
            f"train.device {train_device} is GPU {gpu}, where a server runs too "
            f"(rollout.openai.server_devices {openai.server_devices}), and no memory split is stated: "
            f"vLLM takes {VLLM_DEFAULT_UTILIZATION:.0%} of it by default and the trainer runs out of "
            "memory. Start the servers with GPU_MEMORY_UTILIZATION (e.g. 0.45) and set "
            "rollout.openai.gpu_memory_utilization to it, or sleep_while_training: true, or train on "
            "another GPU"
        )
    trainer = 1 - share
    if trainer < LEAST_TRAINER_SHARE:
        raise LayoutRefused(
            f"GPU {gpu}: the servers take {share:.0%} of its memory, which leaves the trainer "
            f"{trainer:.0%}; lower GPU_MEMORY_UTILIZATION (and rollout.openai.gpu_memory_utilization)"
        )
    size = f" ({trainer * gpu_memory_gib:.0f} of {gpu_memory_gib:.0f} GiB)" if gpu_memory_gib else ""
    return [f"GPU {gpu}: the servers take {share:.0%} of its memory, the trainer the other {trainer:.0%}{size}"]


def shared_gpus(train_devices: list[str], rollout_devices: list[str]) -> list[int]:
    """The GPUs both the trainer and a local sampler would use (a CPU is shared by design)."""
    trainer = {cuda_index(device) for device in train_devices} - {None}
    return sorted(trainer & ({cuda_index(device) for device in rollout_devices} - {None}))


@contextmanager
def servers_asleep(openai: OpenAIBackendConfig, api_key: str | None = None) -> Iterator[None]:
    """With `sleep_while_training`: every endpoint asleep (level 1) inside, awake again after, even on failure."""
    if not openai.sleep_while_training:
        yield
        return
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(headers=headers, timeout=httpx.Timeout(300.0, connect=10.0)) as client:
        asleep = []
        try:
            for endpoint in openai.endpoints:
                response = client.post(f"{endpoint.rstrip('/')}/sleep", params={"level": 1})
                if response.status_code != 200:
                    raise LayoutRefused(
                        f"{endpoint} cannot sleep (HTTP {response.status_code}): start it with "
                        "--enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 (serve.sh SLEEP=1)"
                    )
                asleep.append(endpoint)
            yield
        finally:
            for endpoint in asleep:
                client.post(f"{endpoint.rstrip('/')}/wake_up")
