"""The GPU check's `vllm_server` part: the part of vLLM's server the platform relies on, on this host's vLLM.

It starts `infra/vllm/serve.sh WEIGHTS=full` from the virtual environment `$VLLM_ENV` on the check's model
(saved with its random weights; `--skip-tokenizer-init`, the prompts are token ids), then checks what
`tests/policy/test_server_contract.py` checks on the CPU build, so that a GPU host tests the same contract:

- completions with token ids and processed log-probs: their gap to the trainer's recomputation
  (`policy/logprobs.py`) on the sampled tokens;
- a full-weight swap as the publish stage does it (`/pause`, `/collective_rpc rlvr_load_checkpoint`,
  `/reset_prefix_cache`, `/resume`, every answer checked), its seconds, the version the workers report
  (`rlvr_loaded_version`, a string as vLLM returns it) and the gap to the new version afterwards: the
  check's model has tied embeddings, so a served output layer left at the old weights shows here.

Only the standard library, torch and the checkout: a GPU host has no httpx nor the platform's stack.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from policy import vllm_servers  # standard library only at import: no pydantic, no httpx

SERVED_NAME = "policy"


def call(url: str, route: str, body: dict | None = None, timeout: float = 120) -> tuple[int, str]:
    """POST `body` (JSON) to `url + route`: (status, text); a refused connection is status 0."""
    request = urllib.request.Request(
        f"{url}{route}",
        data=json.dumps(body or {}).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Connection": "close"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")
    except OSError as error:
        return 0, str(error)


def checked(url: str, route: str, body: dict | None = None) -> str:
    """`call`, or a RuntimeError naming the route and its answer."""
    status, text = call(url, route, body)
    if status != 200:
        raise RuntimeError(f"{route}: HTTP {status}: {text[:300]}")
    return text


def start(folder: str, vllm_env: str, logs: Path, device: str) -> vllm_servers.Server:
    """serve.sh WEIGHTS=full on `folder` from `vllm_env`, as the `vllm` tests start theirs (vllm_servers.start)."""
    return vllm_servers.start(
        folder,
        logs,
        vllm_servers.free_port(),
        WEIGHTS="full",
        SERVED_NAME=SERVED_NAME,
        VLLM_ENV=vllm_env,
        GPUS=device.removeprefix("cuda:") if device.startswith("cuda:") else "0",
        DTYPE="float32",
        MAX_MODEL_LEN="1024",
        EXTRA_ARGS="--skip-tokenizer-init --enforce-eager",
        GPU_MEMORY_UTILIZATION=os.environ.get("GPU_MEMORY_UTILIZATION", "0.4"),
    )  # the model shares it


def sample(url: str, prompts, new_tokens: int, seed: int) -> tuple[list[list[int]], list[list[float]]]:
    """One sample of each prompt (token ids), as the backend asks: temperature 1, no top-k / top-p, no
    penalties, the end token ignored; (token ids, behaviour log-probs) per prompt."""
    body = {
        "model": SERVED_NAME,
        "prompt": prompts.tolist(),
        "max_tokens": new_tokens,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "logprobs": 0,
        "seed": seed,
        "ignore_eos": True,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    choices = sorted(json.loads(checked(url, "/v1/completions", body))["choices"], key=lambda c: c["index"])
    return [c["token_ids"] for c in choices], [c["logprobs"]["token_logprobs"] for c in choices]


def check_server(model, replacement, prompts, new_tokens: int, vllm_env: str, start_seconds: float, gap_of) -> dict:
    """The part's record: start, sampling gap, swap and the gap after it. `replacement` is version 1 (other
    weights, the same shape); `gap_of(model, prompts, tokens, behaviour)` the check's behaviour gap."""
    with tempfile.TemporaryDirectory(prefix="rlvr-gpu-vllm-") as work:
        folders = [str(Path(work) / f"v{version}") for version in (0, 1)]
        for folder, weights in zip(folders, (model, replacement)):
            weights.save_pretrained(folder, safe_serialization=True)
        started = time.perf_counter()
        server = start(folders[0], vllm_env, Path(work) / "logs", str(model.device))
        url = server.url
        try:
            vllm_servers.wait_until_serving([server], start_seconds)
            start_s = time.perf_counter() - started
            tokens, behaviour = sample(url, prompts, new_tokens, seed=0)
            before = gap_of(model, prompts, tokens, behaviour)
            swapping = time.perf_counter()
            checked(url, "/pause?mode=wait&wait_for_inflight_requests=true")
            try:
                checked(url, "/collective_rpc", {"method": "rlvr_load_checkpoint", "args": [folders[1], 1]})
                checked(url, "/reset_prefix_cache")
            finally:
                checked(url, "/resume")
            swap_s = time.perf_counter() - swapping
            loaded = json.loads(checked(url, "/collective_rpc", {"method": "rlvr_loaded_version"}))["results"]
            tokens, behaviour = sample(url, prompts, new_tokens, seed=1)
            after = gap_of(replacement, prompts, tokens, behaviour)
        except RuntimeError as error:  # the cause of a 500 is in the server's log only
            raise RuntimeError(f"{error}\nthe server's log:\n{server.errors()}") from None
        finally:
            server.stop()
    return {
        "start_s": round(start_s, 1),
        "max_abs_gap": before,
        "swap_s": round(swap_s, 3),
        "loaded": loaded,
        "max_abs_gap_after_swap": after,
        "ok": before < 1e-3 and after < 1e-3 and set(loaded) == {"1"},
    }
