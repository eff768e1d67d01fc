"""Real vLLM servers for the `vllm` tests and `rlvr bench publish --engine vllm`, started as users start them:
`infra/vllm/serve.sh` from `.venv-vllm` (`make vllm-server`, vLLM's CPU build), on loopback, each in a process
group of its own that is stopped afterwards. Without the environment the tests skip, naming `make vllm-server`.

Each server's log is kept in the run's temporary folder and its tail is in the error when a server does not come
up. vLLM's compile cache is this checkout's `build/vllm-cache`, so a second run starts in about half the time."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench.results import ROOT

VLLM_ENV = Path(os.environ.get("RLVR_VLLM_ENV") or ROOT / ".venv-vllm")
SERVE = ROOT / "infra" / "vllm" / "serve.sh"
START_SECONDS = 420                      # three servers compiling at once on two cores


def free_port() -> int:
    """A TCP port free on loopback now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def missing() -> str | None:
    """Why the `vllm` tests cannot run here, or None."""
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

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


def start(model: str, logs: Path, port: int, **settings: str) -> Server:
    """`MODEL=model serve.sh` with `settings` (WEIGHTS, GENERATION_CONFIG, DTYPE, ...) on `port`; returns at once."""
    folder = logs / f"server-{port}"
    folder.mkdir(parents=True, exist_ok=True)
    cache = ROOT / "build" / "vllm-cache"
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MODEL": model, "BASE_PORT": str(port), "HOST": "127.0.0.1", "GPUS": "0",
           "LOG_DIR": str(folder), "VLLM_ENV": str(VLLM_ENV), "VLLM_CACHE_ROOT": str(cache),
           "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", **settings}
    env.pop("PYTHONPATH", None)                      # the platform's paths never reach vLLM's interpreter
    process = subprocess.Popen(["bash", str(SERVE)], env=env, stdout=subprocess.DEVNULL,
                               stderr=open(folder / "serve.err", "w"), start_new_session=True)
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
