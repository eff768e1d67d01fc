"""The GPU check's `vllm_server` part: the part of vLLM's server the platform relies on, on this host's vLLM.

It starts `infra/vllm/serve.sh WEIGHTS=full` from the virtual environment `$VLLM_ENV` on the check's model
(saved with its random weights; `--skip-tokenizer-init`, the prompts are token ids), then checks what
`tests/test_server_contract.py` checks on the CPU build, so that a GPU host tests the same contract:

- completions with token ids and processed log-probs: their gap to the trainer's recomputation
  (`tasks/rollout/logprobs.py`) on the sampled tokens;
- a full-weight swap as the publish stage does it (`/pause`, `/collective_rpc rlvr_load_checkpoint`,
  `/reset_prefix_cache`, `/resume`, every answer checked), its seconds, the version the workers report
  (`rlvr_loaded_version`, a string as vLLM returns it) and the gap to the new version afterwards: the
  check's model has tied embeddings, so a served output layer left at the old weights shows here.

Only the standard library, torch and the checkout: a GPU host has no httpx nor the platform's stack.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

SERVE = Path(__file__).resolve().parents[1] / "vllm" / "serve.sh"
SERVED_NAME = "policy"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def call(url: str, route: str, body: dict | None = None, timeout: float = 120) -> tuple[int, str]:
    """POST `body` (JSON) to `url + route`: (status, text); a refused connection is status 0."""
    request = urllib.request.Request(f"{url}{route}", data=json.dumps(body or {}).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Connection": "close"})
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


def start(folder: str, vllm_env: str, log_dir: str, device: str) -> tuple[str, subprocess.Popen]:
    """serve.sh WEIGHTS=full on `folder`, in a process group of its own: (URL, process)."""
    port = free_port()
    env = {**os.environ, "MODEL": folder, "WEIGHTS": "full", "SERVED_NAME": SERVED_NAME, "BASE_PORT": str(port),
           "HOST": "127.0.0.1", "GPUS": device.removeprefix("cuda:") if device.startswith("cuda:") else "0",
           "VLLM_ENV": vllm_env, "LOG_DIR": log_dir, "DTYPE": "float32", "MAX_MODEL_LEN": "1024",
           "GPU_MEMORY_UTILIZATION": os.environ.get("GPU_MEMORY_UTILIZATION", "0.4"),  # the check's model shares it
           "EXTRA_ARGS": "--skip-tokenizer-init --enforce-eager", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    env.pop("PYTHONPATH", None)
    process = subprocess.Popen(["bash", str(SERVE)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    return f"http://127.0.0.1:{port}", process


def wait_until_serving(url: str, process: subprocess.Popen, seconds: float, log: Path) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2):
                return
        except OSError:
            time.sleep(1)
    state = f"exited ({process.returncode})" if process.poll() is not None else f"silent after {seconds:.0f} s"
    raise RuntimeError(f"vLLM at {url} {state}:\n{tail(log)}")


def tail(log: Path, lines: int = 6) -> str:
    """What the server log says went wrong: its exception messages, each once (else its last lines)."""
    if not log.exists():
        return "(no log)"
    text = log.read_text(errors="replace").splitlines()
    messages = dict.fromkeys(line.split("] ", 1)[-1].strip() for line in text if "Error: " in line)
    return "\n".join(list(messages)[:lines] or text[-lines:])


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def sample(url: str, prompts, new_tokens: int, seed: int) -> tuple[list[list[int]], list[list[float]]]:
    """One sample of each prompt (token ids), as the backend asks: temperature 1, no top-k / top-p, no
    penalties, the end token ignored; (token ids, behaviour log-probs) per prompt."""
    body = {"model": SERVED_NAME, "prompt": prompts.tolist(), "max_tokens": new_tokens, "temperature": 1.0,
            "top_p": 1.0, "top_k": 0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "logprobs": 0, "seed": seed, "ignore_eos": True, "return_token_ids": True,
            "return_tokens_as_token_ids": True}
    choices = sorted(json.loads(checked(url, "/v1/completions", body))["choices"], key=lambda c: c["index"])
    return [c["token_ids"] for c in choices], [c["logprobs"]["token_logprobs"] for c in choices]


def check_server(model, replacement, prompts, new_tokens: int, vllm_env: str, start_seconds: float,
                 gap_of) -> dict:
    """The part's record: start, sampling gap, swap and the gap after it. `replacement` is version 1 (other
    weights, the same shape); `gap_of(model, prompts, tokens, behaviour)` the check's behaviour gap."""
    with tempfile.TemporaryDirectory(prefix="rlvr-gpu-vllm-") as work:
        folders = [str(Path(work) / f"v{version}") for version in (0, 1)]
        for folder, weights in zip(folders, (model, replacement)):
            weights.save_pretrained(folder, safe_serialization=True)
        started = time.perf_counter()
        url, process = start(folders[0], vllm_env, work, str(model.device))
        log = Path(work) / "vllm-gpu0.log"
        try:
            wait_until_serving(url, process, start_seconds, log)
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
        except RuntimeError as error:             # the cause of a 500 is in the server's log only
            raise RuntimeError(f"{error}\nthe server's log:\n{tail(log)}") from None
        finally:
            stop(process)
    return {"start_s": round(start_s, 1), "max_abs_gap": before, "swap_s": round(swap_s, 3), "loaded": loaded,
            "max_abs_gap_after_swap": after, "ok": before < 1e-3 and after < 1e-3 and set(loaded) == {"1"}}
