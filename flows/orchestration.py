"""The Prefect API a command's flows report to, started only when a command needs one.

With `PREFECT_API_URL` set (in the environment or the active Prefect profile: a `prefect server
start`, Prefect Cloud), flows report there. Otherwise the command starts a temporary server of its
own, the same app Prefect's ephemeral mode runs, except that it
- dies with the command, even when the command is killed with SIGKILL (Linux's parent-death
  signal; elsewhere it is stopped at exit), so no server outlives the command that started it;
- gets `RLVR_PREFECT_START_TIMEOUT` seconds (default 90) to answer, then one retry on a fresh port,
  before the command fails with one line that says what to do (a busy machine can take 30 s);
- logs to `$PREFECT_HOME/rlvr-temporary-server.log`, which that line names.
Commands that need no orchestration (`sql`, `lineage`, `bank`, `doctor`, `policy list`, a stage
that will be skipped, a run with nothing left to do) never call this. This module imports no Prefect.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from importlib.util import find_spec
from pathlib import Path

from storage import environment

START_TIMEOUT_ENV = "RLVR_PREFECT_START_TIMEOUT"
DEFAULT_START_TIMEOUT = 90.0
LOG_NAME = "rlvr-temporary-server.log"
PID_NAME = "rlvr-temporary-server.pid"


class OrchestrationUnavailable(RuntimeError):
    """No Prefect API could be reached or started."""


def ensure_api() -> str | None:
    """Make sure flows have an API to report to; returns the temporary server's URL when one was started."""
    if os.environ.get("PREFECT_API_URL") or _profile_api_url() or _configured_in_process():
        return None
    url = start_temporary_server()
    os.environ["PREFECT_API_URL"] = url
    os.environ.setdefault("PREFECT_UI_URL", "")  # it serves no UI: no "View at" links to a page that is not there
    if "prefect" in sys.modules:  # Prefect read its settings when it was imported: read them again
        from prefect.context import refresh_global_settings_context

        refresh_global_settings_context()
    return url


def _configured_in_process() -> bool:
    """An API URL set through Prefect's own settings in this process (tests' `temporary_settings`)."""
    if "prefect" not in sys.modules:
        return False
    from prefect.settings import PREFECT_API_URL

    return bool(PREFECT_API_URL.value())


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()


def _profile_api_url() -> str | None:
    """PREFECT_API_URL from the active profile of profiles.toml, read without importing Prefect."""
    path = Path(os.environ.get("PREFECT_PROFILES_PATH") or prefect_home() / "profiles.toml").expanduser()
    try:
        profiles = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None
    active = os.environ.get("PREFECT_PROFILE") or profiles.get("active") or "ephemeral"
    return (profiles.get("profiles", {}).get(active) or {}).get("PREFECT_API_URL")


def start_temporary_server() -> str:
    """Start a Prefect API server that dies with this process; its URL."""
    timeout = _start_timeout()
    home = prefect_home()
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / LOG_NAME
    for _ in range(2):  # one retry, on a fresh port: a port taken meanwhile, a slow first start
        port = _free_port()
        process = _spawn(port, log_path)
        url = f"http://127.0.0.1:{port}/api"
        if _answers(url, process, timeout):
            (home / PID_NAME).write_text(f"{process.pid}\n")
            atexit.register(_stop, process)  # registered before Prefect's own exit handlers, so it runs after them
            return url
        _stop(process)
    raise OrchestrationUnavailable(
        f"the temporary Prefect server did not answer within {timeout:.0f} s (twice; its log: {log_path}). On a busy "
        f"machine raise {START_TIMEOUT_ENV}, or run one server for every command: `prefect server start`, then "
        "export PREFECT_API_URL=http://127.0.0.1:4200/api"
    )


def _start_timeout() -> float:
    try:
        return environment.seconds(START_TIMEOUT_ENV, DEFAULT_START_TIMEOUT)
    except ValueError as error:
        raise OrchestrationUnavailable(str(error)) from None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spawn(port: int, log_path: Path) -> subprocess.Popen:
    prefect_dir = Path(find_spec("prefect").origin).parent
    env = {
        **os.environ,
        "PREFECT_UI_ENABLED": "0",
        "PREFECT_SERVER_UI_ENABLED": "false",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
    }
    env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--app-dir",
                str(prefect_dir.parent),
                "--factory",
                "prefect.server.api.server:create_app",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "error",
                "--lifespan",
                "on",
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C at the terminal reaches the command, which stops the server last
            preexec_fn=_die_with_parent(os.getpid()),
        )


def _die_with_parent(parent: int):
    """In the child before exec: ask the kernel for SIGTERM when the parent dies (Linux; a no-op elsewhere)."""

    def arrange() -> None:
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arrange


def _answers(url: str, process: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
