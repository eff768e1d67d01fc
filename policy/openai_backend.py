"""The `openai` backend: groups sampled from OpenAI-compatible completions servers (vLLM first).

One request per prompt (or per `prompts_per_request` prompts) asks for `n` samples of each, with the
sampled tokens' ids and log-probs (`logprobs: 0` plus vLLM's `return_tokens_as_token_ids` / `return_token_ids`). Requests run
concurrently over several endpoints (data parallelism); a failed request (connection refused,
timeout, 429 or 5xx) is retried with exponential backoff and jitter on the next endpoint, so one
server going down slows the stage instead of failing it; a refused request (other 4xx) fails at
once and cancels the rest. The model version picks the served model per request: a LoRA adapter
or checkpoint name, from the registry's `served_name` or else `model_name`. Before each round the
endpoints are asked what they serve (`GET /v1/models`): one that answers without listing the
version is out of rotation for the round (it never loaded it, or lost it in a restart), one that
does not answer stays in (the retries handle it), and if none lists it the round is refused.

Every request states every sampling parameter (`completion_request`): penalties neutral, `min_p` 0, no
special tokens added to the prompt text.
vLLM must run with `--logprobs-mode processed_logprobs`: its default returns log-probs of the raw
logits, before temperature, top-k and top-p, which are not the behaviour log-probs whenever the
sampler is not plain temperature-1 sampling (`infra/vllm/serve.sh` sets it).
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Literal

import httpx
from pydantic import Field, field_validator

from policy.endpoints import server_root
from policy.sampling import NEUTRAL, Sample, SamplerConfig
from storage.config import Strict
from storage.seeds import derive_seed

RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class OpenAIBackendConfig(Strict):
    """Where the inference servers are and how hard to try them."""

    endpoints: list[str] = Field(
        default_factory=lambda: ["http://127.0.0.1:8000"],
        description="base URLs of the servers (a trailing /v1 is allowed and dropped); requests spread over all",
    )
    model_name: str = Field(
        "v{model_version}",
        description="served model name per version: a LoRA adapter or checkpoint name, formatted with {model_version}",
    )
    api_key_env: str = Field("OPENAI_API_KEY", description="environment variable holding the bearer token, if any")
    concurrency: int = Field(8, ge=1, description="requests in flight at once, over all endpoints")
    max_retries: int = Field(6, ge=0, description="retries of one request before the stage fails")
    backoff_seconds: float = Field(0.5, gt=0, description="first retry delay; doubles each retry (with jitter)")
    max_backoff_seconds: float = Field(20.0, gt=0, description="cap of one retry delay")
    timeout_seconds: float = Field(600.0, gt=0, description="read timeout of one request (a whole group)")
    prompts_per_request: int = Field(
        1,
        ge=1,
        description="prompts sent in one request (n samples each): 1 for "
        "vLLM, which batches across requests itself; more for a server that batches "
        "only within one, such as `rlvr policy serve`",
    )
    confirm_served: bool = Field(
        True,
        description="sample only from endpoints whose GET /v1/models lists the "
        "version (a version is published before anything samples from it)",
    )
    server_devices: list[int] = Field(
        default_factory=list,
        description="GPUs of this host the servers run on "
        "(serve.sh GPUS), for the pre-flight check against train.device; empty: "
        "the servers are on other machines",
    )
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="the share of its GPU's memory "
        "each server takes (serve.sh GPU_MEMORY_UTILIZATION; vLLM's "
        "default 0.9): required when a server shares the trainer's GPU",
    )
    launch: int = Field(
        0,
        ge=0,
        description="vLLM servers the loop starts on this machine for the run, in place of "
        "`endpoints`: infra/vllm/serve.sh from .venv-vllm (make vllm-server), on loopback, on the "
        "newest full checkpoint (after the warm-up), stopped when the loop ends; LoRA adapters by name with train.lora, else full "
        "weights swapped in place under one name (model_name, or policy). 0: the servers at endpoints",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = Field(
        None,
        description="the weights' dtype of the servers `launch` starts (serve.sh DTYPE); null: serve.sh's, "
        "float32 on the CPU build (the trainer's log-probs), vLLM's auto on GPUs. bfloat16 samples with the "
        "gap a GPU server has (train.rollout_correction is built for it)",
    )
    sleep_while_training: bool = Field(
        False,
        description="put the servers to sleep during each training step "
        "(POST /sleep?level=1: weights to CPU, KV cache freed) and wake them after; "
        "serve.sh SLEEP=1. Sync loop only",
    )

    @field_validator("endpoints")
    @classmethod
    def _roots(cls, endpoints: list[str]) -> list[str]:
        """Each server's root: `http://host:8000/v1` (the OpenAI convention) and `http://host:8000` alike."""
        return [server_root(endpoint) for endpoint in endpoints]


class BackendUnavailable(RuntimeError):
    """Every retry of a request failed, or a server refused it."""


class RequestRefused(BackendUnavailable):
    """A server answered, and refused the request (a bad model name, a 4xx, a server without token ids):
    retrying the same request cannot help."""


class BadResponse(ValueError):
    """A 200 answer that is not a usable completion (truncated JSON, an aborted sample): retried."""


@dataclass
class OpenAIPolicy:
    config: OpenAIBackendConfig
    api_key: str | None = None
    served_names: dict[int, str] = field(default_factory=dict)  # the registry's names, over `model_name`
    _client: httpx.Client = field(init=False, repr=False)

    def __post_init__(self):
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        limits = httpx.Limits(max_connections=self.config.concurrency)
        self._client = httpx.Client(
            headers=headers, limits=limits, timeout=httpx.Timeout(self.config.timeout_seconds, connect=10.0)
        )

    def close(self) -> None:
        self._client.close()

    def generate(
        self, prompts: list[str], n: int, sampler: SamplerConfig, seed: int, model_version: int
    ) -> list[list[Sample]]:
        model = self.served_names.get(model_version) or self.config.model_name.format(model_version=model_version)
        endpoints = self.rotation(model, model_version) if self.config.confirm_served else self.config.endpoints
        cancelled = threading.Event()  # a refused request stops the others' retries
        size = self.config.prompts_per_request
        with ThreadPoolExecutor(max_workers=self.config.concurrency) as pool:
            futures = [
                pool.submit(
                    self._groups,
                    start,
                    prompts[start : start + size],
                    n,
                    sampler,
                    derive_seed(seed, start) % 2**31,
                    model,
                    cancelled,
                    endpoints,
                )
                for start in range(0, len(prompts), size)
            ]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in done if f.exception() is not None]
            if failed:
                cancelled.set()
                pool.shutdown(cancel_futures=True)
                raise failed[0].exception()
            return [group for future in futures for group in future.result()]

    def rotation(self, model: str, version: int | None = None) -> list[str]:
        """The endpoints to sample `model` from: all but those that answer `GET /v1/models` without it and,
        when one name serves every version (full weights swapped in place), those holding another version."""
        listed, silent, refusing = [], [], []
        for endpoint in self.config.endpoints:
            try:
                served = served_models(self._client, endpoint)
            except (httpx.HTTPError, ValueError):
                silent.append(endpoint)  # down or restarting: the request retries find out
                continue
            if model in served and version is not None and "{model_version}" not in self.config.model_name:
                held = held_versions(self._client, endpoint)  # one name for every version: which one it holds
                if held is not None and set(held) != {version}:
                    refusing.append(f"{endpoint} (holds version {held})")
                    continue
            (listed if model in served else refusing).append(endpoint)
        if not listed and not silent:
            raise RequestRefused(
                f"no endpoint serves model {model!r} version {version} (GET /v1/models of "
                f"{', '.join(refusing)} does not list it, or its workers hold another version): "
                "publish the version first (`rlvr policy publish`)"
            )
        return listed + silent

    def _groups(
        self,
        index: int,
        prompts: list[str],
        n: int,
        sampler: SamplerConfig,
        seed: int,
        model: str,
        cancelled: threading.Event,
        endpoints: list[str],
    ) -> list[list[Sample]]:
        """The groups of consecutive prompts from one request (vLLM orders the choices prompt by prompt)."""
        body = completion_request(model, prompts, n, sampler, seed)
        errors: list[str] = []
        for attempt in range(self.config.max_retries + 1):
            endpoint = server_root(endpoints[(index + attempt) % len(endpoints)])
            try:
                response = self._client.post(f"{endpoint}/v1/completions", json=body)
                if response.status_code == 200:
                    samples = parse_choices(response.json(), n * len(prompts), endpoint)
                    return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]
            except httpx.UnsupportedProtocol as error:
                raise RequestRefused(
                    f"endpoint {endpoint!r}: {error} (endpoints look like http://host:8000)"
                ) from error
            except (httpx.TransportError, BadResponse, ValueError) as error:  # ValueError: a body that is not JSON
                errors.append(f"{endpoint}: {type(error).__name__}: {error}")
            else:
                message = f"{endpoint}: HTTP {response.status_code}: {response.text[:300]}"
                if response.status_code not in RETRYABLE_STATUS:
                    raise RequestRefused(f"request for model {model!r} was refused: {message}")
                errors.append(message)
            if attempt < self.config.max_retries:
                delay = min(self.config.backoff_seconds * 2**attempt, self.config.max_backoff_seconds)
                if cancelled.wait(delay * random.uniform(0.5, 1.0)):
                    raise BackendUnavailable("cancelled: another request of the round failed")
        raise BackendUnavailable(
            f"{self.config.max_retries + 1} attempts over {len(endpoints)} endpoint(s) failed "
            f"for model {model!r}; last errors: " + " | ".join(errors[-3:])
        )


def completion_request(model: str, prompts: list, n: int, sampler: SamplerConfig, seed: int) -> dict:
    """A completions request that states every sampling parameter: what it omits, vLLM takes from the model's
    generation_config.json (Qwen2.5-Instruct: repetition_penalty 1.1), and the log-probs it returns would no
    longer be softmax(logits / T). Text prompts are tokenized as the hf backend does, without special tokens
    (vLLM's default adds a BOS that a chat template has already written)."""
    return {
        "model": model,
        "prompt": prompts[0] if len(prompts) == 1 else prompts,
        "n": n,
        "max_tokens": sampler.max_new_tokens,
        "temperature": sampler.temperature,
        "top_p": sampler.top_p,
        "top_k": sampler.top_k or -1,
        **NEUTRAL,
        "seed": seed,
        "stop": sampler.stop or None,
        "logprobs": 0,
        "add_special_tokens": False,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }


def server_routes(client: httpx.Client, endpoint: str) -> set[str]:
    """The routes a server offers, from its `GET /openapi.json` (vLLM's FastAPI lists every registered route,
    dev-mode ones included when on); empty when it does not say."""
    try:
        response = client.get(f"{server_root(endpoint)}/openapi.json")
        return set(response.json().get("paths") or {}) if response.status_code == 200 else set()
    except (httpx.HTTPError, ValueError, AttributeError):
        return set()


def held_versions(client: httpx.Client, endpoint: str) -> list[int] | None:
    """The model version each worker of a one-model server holds (the worker extension's
    `rlvr_loaded_version`, through dev mode's `/collective_rpc`); None when the server cannot say. vLLM answers
    each worker's result as `str(result)` (`{"results": ["5"]}`), so a version is a whole number or its digits."""
    try:
        response = client.post(f"{server_root(endpoint)}/collective_rpc", json={"method": "rlvr_loaded_version"})
        results = response.json().get("results") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(results, list) or not results:
        return None
    versions = [as_version(result) for result in results]
    return None if None in versions else versions


def as_version(result) -> int | None:
    """A worker's answer as a model version: 5 or "5" (vLLM's string form); None for anything else."""
    if isinstance(result, int) and not isinstance(result, bool):
        return result
    if isinstance(result, str) and result.strip().isdigit():
        return int(result.strip())
    return None


def served_models(client: httpx.Client, endpoint: str) -> list[str]:
    """The model names an endpoint lists in `GET /v1/models`."""
    response = client.get(f"{server_root(endpoint)}/v1/models")
    response.raise_for_status()
    return [str(entry.get("id")) for entry in response.json().get("data") or []]


def parse_choices(payload: dict, n: int, endpoint: str) -> list[Sample]:
    """Samples from a completions response; token ids from `token_ids` or vLLM's `token_id:N` tokens."""
    choices = sorted(payload.get("choices") or [], key=lambda c: c.get("index", 0))
    if len(choices) != n:
        raise BadResponse(f"{endpoint} returned {len(choices)} choices for n={n}")
    samples = []
    for choice in choices:
        logprobs = choice.get("logprobs") or {}
        token_ids = choice.get("token_ids")
        if token_ids is None:
            tokens = logprobs.get("tokens") or []
            if not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
                raise RequestRefused(
                    f"{endpoint} returned no token ids: start vLLM with a version that "
                    "supports return_tokens_as_token_ids"
                )
            token_ids = [int(t.split(":", 1)[1]) for t in tokens]
        token_logprobs = [float(lp) if lp is not None else 0.0 for lp in logprobs.get("token_logprobs") or []]
        if len(token_logprobs) != len(token_ids):
            raise BadResponse(f"{endpoint} returned {len(token_ids)} tokens but {len(token_logprobs)} log-probs")
        if choice.get("finish_reason") not in ("stop", "length"):  # abort, null: the sample did not finish
            raise BadResponse(f"{endpoint} returned finish_reason {choice.get('finish_reason')!r}")
        samples.append(
            Sample(
                text=choice.get("text", ""),
                token_ids=token_ids,
                logprobs=token_logprobs,
                finish_reason=choice["finish_reason"],
                prompt_token_ids=choice.get("prompt_token_ids"),
                backend=f"openai:{endpoint}",
            )
        )
    return samples
