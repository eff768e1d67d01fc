"""What the two sandbox test modules share: the budgets their runs get, the isolation modes this host can give
them (probed once, when a sandbox test module is imported), and waiting for a run's processes to be gone."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from tasks.sandbox import client as sandbox_client
from tasks.sandbox.limits import SandboxLimits


def isolation_works(prefix: list[str]) -> bool:
    """Whether this host can start a sandbox behind `prefix` (unshare's namespaces)."""
    if shutil.which("unshare") is None:
        return False
    return subprocess.run([*prefix, "true"], capture_output=True, timeout=30).returncode == 0


# The sandbox tests' budgets, and the isolation modes this host gives them
SANDBOX_LIMITS = SandboxLimits(
    cpu_seconds=2, wall_seconds=4, test_seconds=1.5, memory_mb=512, processes=16, output_bytes=200_000
)
AS_ROOT = os.geteuid() == 0
SANDBOX_MODES = [
    m
    for m in ("namespaces", "userns")
    if (m != "namespaces" or AS_ROOT) and isolation_works(sandbox_client.PREFIXES[m])
]


def still_alive(pids: list[int], wait: float = 10.0) -> list[int]:
    """Those of `pids` still running (not zombies) after up to `wait` seconds: the last exits take a moment."""
    deadline = time.monotonic() + wait
    while True:
        alive = []
        for pid in pids:
            try:
                if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
            except OSError:
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)
