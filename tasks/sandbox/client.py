"""The orchestrator's side of the sandbox: a warm server process and the jobs sent to it.

    with Sandbox() as sandbox:
        result = sandbox.run_tests(program, tests, entry_point, prompt)
        result.passed, result.total, result.status

Model-generated code never runs in this process. The server is restarted whenever a run
outlives its deadline or the server itself dies, and recycled (a fresh one for the next job, no
run failed) when it reports its own descriptors, memory or leftover processes past a limit.

Isolation modes, best first: `namespaces` (root: namespaces, a user id per role, cgroups),
`userns` (no root needed: an unprivileged user namespace), `rlimits` (resource limits only, no
isolation: refused unless `allow_insecure`, `--insecure-sandbox` or RLVR_INSECURE_SANDBOX=1).
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import select
import shutil
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from tasks.errors import VerifierUnavailable
from tasks.sandbox import budget
from tasks.sandbox.limits import SandboxLimits
from tasks.sandbox.protocol import recv_json, send_json
from tasks.sandbox.zygote import UID_SLOTS

NAMESPACE_COMMAND = ["unshare", "--net", "--pid", "--mount", "--fork", "--mount-proc", "--kill-child"]
USERNS_COMMAND = ["unshare", "--user", "--map-root-user", *NAMESPACE_COMMAND[1:]]
PREFIXES = {"namespaces": NAMESPACE_COMMAND, "userns": USERNS_COMMAND, "rlimits": []}
INSECURE_ENV = "RLVR_INSECURE_SANDBOX"
_servers = itertools.count()


class SandboxUnavailable(VerifierUnavailable):
    """No isolation is available here and running code without it was not allowed."""


@dataclass
class SandboxResult:
    status: str  # ok, timeout, output_limit, memory_limit, cpu_limit, incomplete, crashed
    passed: int = 0
    total: int = 0
    exit_code: int | None = None
    output: str = ""
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    health: dict = field(default_factory=dict)  # the server's own state after the run
    peak_mb: float | None = None  # the run's peak memory by the kernel's own count, where a cgroup bounds it
    tests: list[dict] = field(default_factory=list)  # workspace runs: each test's name, passed, message
    leftover_processes: int = 0  # workspace runs: processes the candidate left running when the tests ended

    @property
    def all_passed(self) -> bool:
        return self.status == "ok" and self.total > 0 and self.passed == self.total


@lru_cache(maxsize=1)
def isolation_mode() -> str:
    """The best isolation this host allows: `namespaces` (root), `userns` (an unprivileged user namespace
    with its own network, PID and mount namespaces), else `rlimits` (resource limits and an audit-hook
    network guard only: not isolation)."""
    if shutil.which("unshare") is None:
        return "rlimits"
    for mode in ("namespaces", "userns") if os.geteuid() == 0 else ("userns",):
        probe = subprocess.run([*PREFIXES[mode], "true"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return mode
    return "rlimits"


def insecure_allowed() -> bool:
    return os.environ.get(INSECURE_ENV, "").lower() in ("1", "true", "yes")


def require_isolation(isolation: str | None = None, allow_insecure: bool | None = None) -> str:
    """The isolation code runs under here; refuses (SandboxUnavailable) where that is none and running code
    without it was not explicitly allowed. Called before any code is scored, so a stage fails at once with
    the reason instead of scoring honest programs 0."""
    isolation = isolation or isolation_mode()
    allowed = insecure_allowed() if allow_insecure is None else allow_insecure
    if isolation == "rlimits" and not allowed:
        raise SandboxUnavailable(
            "code verification needs isolation this host does not offer (root, or unprivileged user namespaces "
            "with util-linux `unshare`); to run model-generated code with resource limits only, which does not "
            f"isolate it from this user's files and processes, pass --insecure-sandbox (or set {INSECURE_ENV}=1)"
        )
    return isolation


UID_LOCKS = "/tmp/rlvr-sandbox-uids"  # a lock file per user-id slot, shared by every process on the host


def claim_uid_slot(start: int) -> tuple[int, int | None]:
    """The first slot from `start` on that no other live sandbox holds, and the descriptor whose flock holds it
    (released by closing it, or by the process's death). Where no lock can be taken: `start`, unheld."""
    try:
        os.makedirs(UID_LOCKS, exist_ok=True)
        os.chmod(UID_LOCKS, 0o1777)  # sandboxes of other users claim here too
    except OSError:
        pass
    for offset in range(UID_SLOTS):
        slot = (start + offset) % UID_SLOTS
        try:
            descriptor = os.open(os.path.join(UID_LOCKS, str(slot)), os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return slot, descriptor
        except OSError:
            os.close(descriptor)
    return start, None


class Sandbox:
    def __init__(
        self,
        worker: int = 0,
        limits: SandboxLimits | None = None,
        isolation: str | None = None,
        allow_insecure: bool | None = None,
        health_limits: dict | None = None,
    ):
        if isolation not in (None, *PREFIXES):
            raise ValueError(f"isolation must be one of {sorted(PREFIXES)}, not {isolation!r}")
        self.worker = worker
        self.limits = limits or SandboxLimits()
        self.health_limits = dict(health_limits or {})  # overrides of the server's own (zygote.HEALTH_LIMITS)
        self.isolation = require_isolation(isolation, allow_insecure)
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self.server_pid: int | None = None
        self.recycled = 0  # servers replaced because they reported a limit (no run failed)
        self.crashes = 0  # servers that hung or died during a run
        name = f"{os.getpid()}-{self.worker}-{next(_servers)}"
        self._cgroups = budget.create_cgroups(name) if self.isolation == "namespaces" else None
        # Its runs' user ids, one pair per live sandbox on the host (not per worker index, which every suite
        # repeats): RLIMIT_NPROC counts a user id's processes and threads host-wide, so a fork bomb run under
        # ids another sandbox also used would starve that one.
        self._uid_slot, self._uid_lock = claim_uid_slot(zlib.crc32(name.encode()) % UID_SLOTS)

    @property
    def budget(self) -> str:
        """How a run's memory is bounded as a whole: by a cgroup (`cgroup v1` / `cgroup v2`) or by polling."""
        return f"cgroup v{self._cgroups['version']}" if self._cgroups else "polled"

    @property
    def description(self) -> str:
        """What reward rows record: the isolation, marked insecure where it is none."""
        return "rlimits (insecure: no isolation)" if self.isolation == "rlimits" else self.isolation

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._uid_lock is None:  # closed before: claim a slot again
            self._uid_slot, self._uid_lock = claim_uid_slot(self._uid_slot)
        command = [
            *PREFIXES[self.isolation],
            sys.executable,
            "-s",
            "-m",
            "tasks.sandbox.zygote",
            self.isolation,
            str(self._uid_slot),
            json.dumps(self._cgroups),
        ]
        # the environment carries nothing of the orchestrator's; the working directory is /
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONPATH": _package_root()}
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd="/",
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        ready = self._receive(time.monotonic() + 60)
        if not ready or not ready.get("ready"):
            self.close()
            raise RuntimeError("the sandbox server did not start")
        self.server_pid = self._process.pid

    def close(self) -> None:
        self._stop_server()
        budget.remove_cgroups(self._cgroups)
        lock, self._uid_lock = self._uid_lock, None
        if lock is not None:
            os.close(lock)  # the slot is free again

    def _stop_server(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        try:
            process.stdin.close()
            process.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait(5)
        process.stdout.close()

    def __del__(self) -> None:
        if any(getattr(self, name, None) is not None for name in ("_process", "_cgroups", "_uid_lock")):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - at interpreter exit anything may be half torn down
                pass

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- jobs ------------------------------------------------------------------------------
    def run_tests(
        self,
        program: str,
        tests: str,
        entry_point: str,
        prompt: str = "",
        limits: SandboxLimits | None = None,
        stop_after_failure: bool = False,
    ) -> SandboxResult:
        """Run `tests` against `entry_point` of `program` (program and tests in separate jailed processes);
        `stop_after_failure`: the first failing test ends the run (an all-or-nothing reward needs no more)."""
        return self._run(
            {
                "kind": "tests",
                "program": program,
                "tests": tests,
                "entry_point": entry_point,
                "prompt": prompt,
                "stop_after_failure": stop_after_failure,
            },
            limits,
        )

    def run_suite(
        self,
        files: dict[str, str],
        tests: dict[str, str],
        only: list[str] | None = None,
        limits: SandboxLimits | None = None,
        stop_after_failure: bool = False,
    ) -> SandboxResult:
        """Lay `files` out as the candidate's workspace and run the unittest modules `tests` (or those in
        `only`) against it: the tests in one jailed process, the workspace in another (`remote.py`)."""
        return self._run(
            {"kind": "suite", "files": files, "tests": tests, "only": only, "stop_after_failure": stop_after_failure},
            limits,
        )

    def run_script(self, program: str, limits: SandboxLimits | None = None) -> SandboxResult:
        """Run a program as `__main__`; its exit code and output come back."""
        return self._run({"kind": "script", "program": program}, limits)

    def _run(self, job: dict[str, Any], limits: SandboxLimits | None) -> SandboxResult:
        limits = limits or self.limits
        job["limits"] = limits.to_dict()
        job["health_limits"] = self.health_limits
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._stop_server()
                self.start()
            try:
                send_json(self._process.stdin.fileno(), job)
                reply = self._receive(time.monotonic() + limits.wall_seconds + 10)
            except OSError:
                reply = None
            if reply is None:  # the server hung or died: nothing of it is kept
                self.crashes += 1
                self._kill_server()
                return SandboxResult(status="crashed")
            if reply.get("health", {}).get("recycle"):  # it exits after this reply; the next job gets a new one
                self.recycled += 1
                self._stop_server()
        known = SandboxResult.__dataclass_fields__
        return SandboxResult(**{key: value for key, value in reply.items() if key in known})

    def processes(self) -> list[int]:
        """Pids of this sandbox's own processes (its server and everything under it, daemons included: in
        the jailed modes orphans are adopted by the server, PID 1 of its namespace)."""
        if self._process is None:
            return []
        return budget.descendants(self._process.pid)

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
            process.stdin.close()
            process.stdout.close()


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: the server (and, through `unshare --kill-child`, its namespace) is killed with
    the process that started it, so a verification worker killed for a timeout leaves nothing behind."""
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def _package_root() -> str:
    """The folder holding the `tasks` package (this file is tasks/sandbox/client.py)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
