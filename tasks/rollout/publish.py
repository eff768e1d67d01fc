"""Publishing a model version to inference servers: load it on every endpoint, confirm it, keep few.

The protocol is vLLM's. `POST /v1/load_lora_adapter` {lora_name, lora_path} loads a LoRA adapter
folder under a name (`rlvr policy serve` loads a full checkpoint folder the same way),
`POST /v1/unload_lora_adapter` {lora_name} forgets one, and `GET /v1/models` lists what a server
serves. A version counts as published on an endpoint only once that endpoint lists its name; the
`openai` backend samples only from endpoints that list the version it asks for, so nothing samples
from a version a server has not confirmed, and a server that failed to load it is out of rotation.

vLLM loads only LoRA adapters at runtime: for unattended runs on vLLM, train with `train.lora`.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
from pydantic import Field

from tasks.config import Strict
from tasks.rollout.openai_backend import RequestRefused, served_models


class PublishConfig(Strict):
    """How each trained version is made servable on the `openai` backend's endpoints."""

    enabled: bool = Field(True, description="publish every version the loop samples to the rollout endpoints "
                          "(only with rollout.backend openai; the hf backend loads versions itself)")
    max_loras: int = Field(4, ge=1, description="versions kept loaded per server, the newest; older ones are "
                           "unloaded (the base model never is). Keep it above the staleness bound")
    min_endpoints: int = Field(1, ge=1, description="endpoints that must confirm a version, or the stage fails")
    path_map: dict[str, str] = Field(default_factory=dict, description="prefix replacements from the lake's "
                                     "checkpoint paths to the paths the servers read (e.g. /lake -> /mnt/lake)")
    timeout_seconds: float = Field(300.0, gt=0, description="time one load may take on one server")


class PublishFailed(RequestRefused):
    """Fewer endpoints than `min_endpoints` confirmed the version."""


@dataclass
class Publication:
    """What one endpoint did with one version."""

    endpoint: str
    served_name: str
    path: str                                # the folder the server was told to load
    action: str                              # loaded, already_served or failed
    error: str | None = None
    unloaded: list[str] = field(default_factory=list)

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
            return replacement + path[len(prefix):]
    return path


def publish_to(client: httpx.Client, endpoint: str, name: str, path: str, template: str, max_loras: int,
               protected: set[str]) -> Publication:
    """Load `name` from `path` on one endpoint unless it is listed already, confirm it is listed, then
    unload the oldest versions past `max_loras` (never `protected` names nor the one just published)."""
    base = endpoint.rstrip("/")
    try:
        action, served = "already_served", served_models(client, endpoint)
        if name not in served:
            response = client.post(f"{base}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
            if response.status_code != 200 and "already been loaded" not in response.text:
                return Publication(endpoint, name, path, "failed", f"HTTP {response.status_code}: {response.text[:300]}")
            served = served_models(client, endpoint)       # the confirmation, and what is resident now
            if name not in served:
                return Publication(endpoint, name, path, "failed", "the load was answered but GET /v1/models does not "
                                   f"list {name!r}")
            action = "loaded"
        versions = sorted((version, other) for other in served
                          if other not in protected | {name} and (version := version_of(other, template)) is not None)
        unloaded = []
        for _, old in versions[:max(0, len(versions) + 1 - max_loras)]:   # + 1: the version just published
            if client.post(f"{base}/v1/unload_lora_adapter", json={"lora_name": old}).status_code == 200:
                unloaded.append(old)
        return Publication(endpoint, name, path, action, unloaded=unloaded)
    except (httpx.HTTPError, ValueError) as error:          # down, timed out, or an answer that is not JSON
        return Publication(endpoint, name, path, "failed", f"{type(error).__name__}: {error}")


def publish(endpoints: list[str], name: str, path: str, config: PublishConfig, template: str = "v{model_version}",
            protected: set[str] = frozenset(), api_key: str | None = None) -> list[Publication]:
    """Publish one version on every endpoint at once (the folder sent is `path` after `config.path_map`)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    sent = server_path(path, config.path_map)
    with httpx.Client(headers=headers, timeout=httpx.Timeout(config.timeout_seconds, connect=10.0)) as client, \
            ThreadPoolExecutor(max_workers=max(1, len(endpoints))) as pool:
        return list(pool.map(lambda endpoint: publish_to(client, endpoint, name, sent, template, config.max_loras,
                                                         set(protected)), endpoints))


def require_confirmed(results: list[Publication], min_endpoints: int) -> None:
    """Fail unless `min_endpoints` endpoints confirmed the version, naming each failure."""
    confirmed = [result for result in results if result.confirmed]
    if len(confirmed) < min_endpoints:
        name = results[0].served_name if results else "?"
        raise PublishFailed(f"model {name!r} is served by {len(confirmed)} of {len(results)} endpoint(s), "
                            f"{min_endpoints} needed: " + "; ".join(f"{r.endpoint}: {r.error}" for r in results
                                                                    if not r.confirmed)
                            + " (vLLM loads only LoRA adapters at runtime: train with train.lora)")
