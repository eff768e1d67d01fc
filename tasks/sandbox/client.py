"""The orchestrator's side of the sandbox: a warm server process and the jobs sent to it.

    with Sandbox() as sandbox:
        result = sandbox.run_tests(program, tests, entry_point, prompt)
        result.passed, result.total, result.status

Model-generated code never runs in this process. The server is restarted whenever a run
outlives its deadline or the server itself dies.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from tasks.sandbox.limits import SandboxLimits
from tasks.sandbox.protocol import recv_json, send_json

NAMESPACE_COMMAND = ["unshare", "--net", "--pid", "--mount", "--fork", "--mount-proc", "--kill-child"]


@dataclass
class SandboxResult:
    status: str                       # ok, timeout, output_limit, incomplete, crashed
    passed: int = 0
    total: int = 0
    exit_code: int | None = None
    output: str = ""
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def all_passed(self) -> bool:
        return self.status == "ok" and self.total > 0 and self.passed == self.total


@lru_cache(maxsize=1)
def isolation_mode() -> str:
    """`namespaces` (root and unshare available: no network, private PID and mount namespaces)
    or `rlimits` (resource limits, a separate session, and an audit-hook network guard)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "rlimits"
    probe = subprocess.run([*NAMESPACE_COMMAND, "true"], capture_output=True, timeout=30)
    return "namespaces" if probe.returncode == 0 else "rlimits"


class Sandbox:
    def __init__(self, worker: int = 0, limits: SandboxLimits | None = None, isolation: str | None = None):
        self.worker = worker
        self.limits = limits or SandboxLimits()
        self.isolation = isolation or isolation_mode()
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self.server_pid: int | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        prefix = NAMESPACE_COMMAND if self.isolation == "namespaces" else []
        command = [*prefix, sys.executable, "-s", "-m", "tasks.sandbox.zygote", str(self.worker), self.isolation]
        # the environment carries nothing of the orchestrator's; the working directory is /
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONPATH": _package_root()}
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/",
                                         stderr=subprocess.DEVNULL, env=env, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        ready = self._receive(time.monotonic() + 60)
        if not ready or not ready.get("ready"):
            self.close()
            raise RuntimeError("the sandbox server did not start")
        self.server_pid = self._process.pid

    def close(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            process.stdin.close()
            process.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait(5)

    def __enter__(self) -> "Sandbox":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- jobs ------------------------------------------------------------------------------
    def run_tests(self, program: str, tests: str, entry_point: str, prompt: str = "",
                  limits: SandboxLimits | None = None) -> SandboxResult:
        """Run `tests` against `entry_point` of `program`, each in its own jailed process."""
        return self._run({"kind": "tests", "program": program, "tests": tests, "entry_point": entry_point,
                          "prompt": prompt}, limits)

    def run_script(self, program: str, limits: SandboxLimits | None = None) -> SandboxResult:
        """Run a program as `__main__`; its exit code and output come back."""
        return self._run({"kind": "script", "program": program}, limits)

    def _run(self, job: dict[str, Any], limits: SandboxLimits | None) -> SandboxResult:
        limits = limits or self.limits
        job["limits"] = limits.to_dict()
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self.close()
                self.start()
            try:
                send_json(self._process.stdin.fileno(), job)
                reply = self._receive(time.monotonic() + limits.wall_seconds + 10)
            except OSError:
                reply = None
            if reply is None:                   # the server hung or died: nothing of it is kept
                self._kill_server()
                return SandboxResult(status="crashed")
        known = SandboxResult.__dataclass_fields__
        return SandboxResult(**{key: value for key, value in reply.items() if key in known})

    def _receive(self, deadline: float) -> dict | None:
        fd = self._process.stdout.fileno()
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            return None
        try:
            return recv_json(fd)
        except (OSError, ValueError):
            return None

    def _kill_server(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            try:
                os.killpg(process.pid, 9)
            except ProcessLookupError:
                pass
            process.wait(10)


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: the server (and, through `unshare --kill-child`, its namespace) is killed with
    the process that started it, so a verification worker killed for a timeout leaves nothing behind."""
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def _package_root() -> str:
    import tasks

    return os.path.dirname(os.path.dirname(os.path.abspath(tasks.__file__)))
