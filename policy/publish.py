"""Publishing a model version to inference servers: load it on every endpoint, confirm it, keep few.

The protocols are vLLM's own, two of them:

- LoRA adapters, by name: `POST /v1/load_lora_adapter` {lora_name, lora_path} loads an adapter folder
  under a name (`rlvr policy serve` loads a full checkpoint folder the same way),
  `POST /v1/unload_lora_adapter` {lora_name} forgets one, and `GET /v1/models` lists what a server
  serves. A version counts as published on an endpoint only once that endpoint lists its name.
- Full weights, in place: a server started with the project's worker extension
  (`--worker-extension-cls rlvr_weights.CheckpointLoader`, `infra/vllm/rlvr_weights.py`) and
  `VLLM_SERVER_DEV_MODE=1` serves one model under one name; `POST /collective_rpc` calls the
  extension's `rlvr_load_checkpoint(folder, version)` on every worker, then `/reset_prefix_cache`
  drops the old weights' KV blocks. Where the server offers `/pause` and `/resume` (vLLM 0.12+),
  generation is paused around the swap so that no response mixes two versions. The version counts as
  published once every worker's `rlvr_loaded_version()` says it. What a server offers is read from
  its routes (`GET /openapi.json`).

The `openai` backend samples only from endpoints that confirm the version it asks for, so nothing
samples from a version a server has not loaded, and a server that failed to load it is out of rotation.
The folder sent is one the server can read: an s3:// checkpoint is copied to `staging_dir` first, then
`path_map` rewrites the trainer's paths into the server's.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import httpx
from pydantic import Field

from policy.checkpoints import adapter_base, local_checkpoint
from policy.openai_backend import RequestRefused, held_versions, served_models, server_routes
from storage.config import Strict


class PublishConfig(Strict):
    """How each trained version is made servable on the `openai` backend's endpoints."""

    enabled: bool = Field(
        True,
        description="publish every version the loop samples to the rollout endpoints "
        "(only with rollout.backend openai; the hf backend loads versions itself)",
    )
    max_loras: int = Field(
        4,
        ge=1,
        description="versions kept loaded per server, the newest; older ones are "
        "unloaded (the base model never is). Keep it above the staleness bound",
    )
    min_endpoints: int = Field(1, ge=1, description="endpoints that must confirm a version, or the stage fails")
    path_map: dict[str, str] = Field(
        default_factory=dict,
        description="prefix replacements from the lake's "
        "checkpoint paths to the paths the servers read (e.g. /lake -> /mnt/lake)",
    )
    timeout_seconds: float = Field(300.0, gt=0, description="time one load may take on one server")
    weights: Literal["auto", "adapter", "full"] = Field(
        "auto",
        description="how a version reaches a server: "
        "adapter: load_lora_adapter by name; full: its full weights "
        "swapped in place through the worker extension (POST "
        "/collective_rpc, dev mode); auto: adapter for a LoRA "
        "checkpoint, full for a full one on a server that offers "
        "the extension, else adapter",
    )
    staging_dir: str | None = Field(
        None,
        description="a folder the servers read, where s3:// checkpoints are "
        "copied before a load (then path_map applies); none: this host's checkpoint "
        "cache, for servers on this host",
    )


class PublishFailed(RequestRefused):
    """Fewer endpoints than `min_endpoints` confirmed the version."""


@dataclass
class Publication:
    """What one endpoint did with one version."""

    endpoint: str
    served_name: str
    path: str  # the folder the server was told to load
    action: str  # loaded, already_served or failed
    error: str | None = None
    unloaded: list[str] = field(default_factory=list)
    method: str = "adapter"  # adapter (load_lora_adapter) or full (weights swapped in place)
    seconds: float | None = None  # how long the load took, confirmation included

    @property
    def confirmed(self) -> bool:
        return self.action != "failed"


def version_of(name: str, template: str) -> int | None:
    """The model version a served name stands for under `template` (e.g. `v{model_version}`), if any."""
    head, _, tail = template.partition("{model_version}")
    match = re.fullmatch(re.escape(head) + r"(\d+)" + re.escape(tail), name)
    return int(match.group(1)) if match else None


def server_path(path: str, path_map: dict[str, str]) -> str:
    for prefix, replacement in sorted(path_map.items(), key=lambda item: -len(item[0])):
        if path.startswith(prefix):
            return replacement + path[len(prefix) :]
    return path


def staged(uri: str, staging_dir: str | None) -> str:
    """A folder holding the checkpoint that servers can read: an s3:// one downloaded (this host's cache) and,
    with `staging_dir`, copied there once (under its bucket and key, through a temporary name)."""
    if not uri.startswith("s3://"):
        return uri
    local = local_checkpoint(uri)
    if not staging_dir:
        return local
    target = os.path.join(staging_dir, uri.removeprefix("s3://").strip("/"))
    if not os.path.isdir(target):
        partial = f"{target}.partial-{os.getpid()}"
        shutil.copytree(local, partial, dirs_exist_ok=True)
        os.replace(partial, target)
    return target


def full_weights(client: httpx.Client, endpoint: str, weights: str, adapter: bool) -> tuple[set[str], list[int]] | None:
    """When this version goes to this endpoint as full weights swapped in place: the server's routes and the
    versions its workers hold now (asked once, for `swap_weights` too); None when it goes as an adapter."""
    if weights == "adapter" or (weights == "auto" and adapter):
        return None
    routes = server_routes(client, endpoint)
    held = held_versions(client, endpoint) if "/collective_rpc" in routes else None
    if held is None and weights == "full":
        raise RequestRefused(
            f"{endpoint} cannot swap full weights: start vLLM with VLLM_SERVER_DEV_MODE=1 and "
            "--worker-extension-cls rlvr_weights.CheckpointLoader (infra/vllm/serve.sh WEIGHTS=full)"
        )
    return None if held is None else (routes, held)


def swap_weights(
    client: httpx.Client, endpoint: str, name: str, path: str, version: int, routes: set[str], held: list[int]
) -> Publication:
    """Load a full checkpoint into every worker of a one-model server (its `routes`, the versions its workers
    `held` before), then drop the old KV blocks; paused around the swap where the server can pause. Confirmed
    when every worker says it holds `version`."""
    base, started = endpoint.rstrip("/"), time.monotonic()

    def failed(error: str) -> Publication:
        return Publication(endpoint, name, path, "failed", error, method="full")

    served = served_models(client, endpoint)
    if name not in served:
        return failed(
            f"it serves {served} and swaps weights in place under that one name: set "
            f"rollout.openai.model_name (and the base version's served_name) to it"
        )
    if set(held) == {version}:
        return Publication(endpoint, name, path, "already_served", method="full")
    pausing = {"/pause", "/resume"} <= routes

    def call(route: str, **request) -> str | None:
        """POST one dev-mode route; what went wrong, naming the route, or None when it answered 200. One
        connection each: vLLM closes a connection after a failed RPC's 500, and a `/resume` sent into it would
        be lost, leaving the server paused."""
        response = client.post(f"{base}{route}", headers={"Connection": "close"}, **request)
        return None if response.status_code == 200 else f"{route}: HTTP {response.status_code}: {response.text[:300]}"

    # Each answer is checked: a pause that failed would swap weights under running requests, a prefix cache
    # not reset would serve the old weights' KV blocks, a resume that failed leaves the server paused.
    if pausing and (error := call("/pause", params={"mode": "wait", "wait_for_inflight_requests": "true"})):
        return failed(f"{error} (nothing was loaded)")  # vLLM 0.16+ reads mode, 0.12-0.14 the other
    try:
        error = call("/collective_rpc", json={"method": "rlvr_load_checkpoint", "args": [path, version]})
        error = error and f"rlvr_load_checkpoint through {error}"
        error = error or call("/reset_prefix_cache")
    finally:
        resumed = call("/resume") if pausing else None
    if error or resumed:
        return failed("; ".join(filter(None, [error, resumed and f"{resumed} (the server stays paused)"])))
    held = held_versions(client, endpoint)
    if set(held or []) != {version}:
        return failed(f"after the load its workers hold version(s) {held}, not {version}")
    return Publication(endpoint, name, path, "loaded", method="full", seconds=time.monotonic() - started)


def publish_to(
    client: httpx.Client,
    endpoint: str,
    name: str,
    path: str,
    template: str,
    max_loras: int,
    protected: set[str],
    version: int = -1,
    weights: str = "adapter",
    adapter: bool = True,
) -> Publication:
    """Publish on one endpoint: swap the full weights in (`full_weights`), or load `name` from `path` unless it
    is listed already, confirm it is listed, then unload the oldest versions past `max_loras` (never
    `protected` names nor the one just published)."""
    base, started = endpoint.rstrip("/"), time.monotonic()
    try:
        server = full_weights(client, endpoint, weights, adapter)
        if server is not None:
            return swap_weights(client, endpoint, name, path, version, *server)
        if "{model_version}" not in template:  # one name for every version: listed says nothing of which
            return Publication(
                endpoint,
                name,
                path,
                "failed",
                f"{endpoint} serves every version as {name!r} but "
                "cannot say which one it holds nor swap weights: start vLLM with "
                "VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls rlvr_weights.CheckpointLoader "
                "(infra/vllm/serve.sh WEIGHTS=full)",
                method="full",
            )
        action, served = "already_served", served_models(client, endpoint)
        if name not in served:
            response = client.post(f"{base}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
            if response.status_code != 200 and "already been loaded" not in response.text:
                return Publication(
                    endpoint, name, path, "failed", f"HTTP {response.status_code}: {response.text[:300]}"
                )
            served = served_models(client, endpoint)  # the confirmation, and what is resident now
            if name not in served:
                return Publication(
                    endpoint, name, path, "failed", f"the load was answered but GET /v1/models does not list {name!r}"
                )
            action = "loaded"
        versions = sorted(
            (version, other)
            for other in served
            if other not in protected | {name} and (version := version_of(other, template)) is not None
        )
        unloaded = []
        for _, old in versions[: max(0, len(versions) + 1 - max_loras)]:  # + 1: the version just published
            if client.post(f"{base}/v1/unload_lora_adapter", json={"lora_name": old}).status_code == 200:
                unloaded.append(old)
        return Publication(
            endpoint,
            name,
            path,
            action,
            unloaded=unloaded,
            seconds=time.monotonic() - started if action == "loaded" else None,
        )
    except (httpx.HTTPError, ValueError, RequestRefused) as error:  # down, timed out, not JSON, cannot swap
        method = "adapter" if weights == "adapter" or (weights == "auto" and adapter) else "full"
        return Publication(endpoint, name, path, "failed", f"{type(error).__name__}: {error}", method=method)


def publish(
    endpoints: list[str],
    name: str,
    path: str,
    config: PublishConfig,
    template: str = "v{model_version}",
    protected: set[str] = frozenset(),
    api_key: str | None = None,
    version: int = -1,
) -> list[Publication]:
    """Publish one version on every endpoint at once (the folder sent: `path` staged, then `config.path_map`)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        adapter = adapter_base(path) is not None
    except OSError:  # not readable here: the server may still read it (path_map)
        adapter = True
    sent = server_path(staged(path, config.staging_dir), config.path_map)
    with (
        httpx.Client(headers=headers, timeout=httpx.Timeout(config.timeout_seconds, connect=10.0)) as client,
        ThreadPoolExecutor(max_workers=max(1, len(endpoints))) as pool,
    ):
        return list(
            pool.map(
                lambda endpoint: publish_to(
                    client,
                    endpoint,
                    name,
                    sent,
                    template,
                    config.max_loras,
                    set(protected),
                    version,
                    config.weights,
                    adapter,
                ),
                endpoints,
            )
        )


def require_confirmed(results: list[Publication], min_endpoints: int) -> None:
    """Fail unless `min_endpoints` endpoints confirmed the version, naming each failure."""
    confirmed = [result for result in results if result.confirmed]
    if len(confirmed) < min_endpoints:
        name = results[0].served_name if results else "?"
        raise PublishFailed(
            f"model {name!r} is served by {len(confirmed)} of {len(results)} endpoint(s), "
            f"{min_endpoints} needed: "
            + "; ".join(f"{r.endpoint}: {r.error}" for r in results if not r.confirmed)
            + " (vLLM loads only LoRA adapters by name: for full checkpoints start it with the "
            "worker extension, infra/vllm/serve.sh WEIGHTS=full)"
        )
