"""Memory a benchmark can report: this process's resident set now and at its peak, and a child's peak.

A child's peak is the kernel's own account of it (`ru_maxrss` from `wait4`, no sampling: a short `rlvr sql` is
measured as exactly as a long one, and a loaded machine changes the seconds, not the figure), taken through a
small launcher. A child of a large process starts as a copy of it (vfork), and Linux folds that copy's resident
set into the child's `ru_maxrss` at exec: taken directly, every command would weigh at least what the benchmark
weighs (a 300 MiB child of a 500 MiB test process read 507 MiB). The launcher, a bare interpreter, is that copy
instead, and the command is forked from it. A server left running (moto) is read from its own high-water mark
(`VmHWM`, Linux) before it is stopped. `ru_maxrss` is KiB on Linux and bytes on macOS.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024

# `python -I -S -c LAUNCH REPORT COMMAND...`: runs COMMAND (its output is the launcher's own) and writes its
# peak resident set, exit status and wall time to REPORT.
LAUNCH = """
import os, sys, time
started = time.perf_counter()
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - started
with open(sys.argv[1], "w") as report:
    report.write(f"{usage.ru_maxrss} {os.waitstatus_to_exitcode(status)} {seconds}")
"""


def maxrss_mb(maxrss: int) -> float:
    """`ru_maxrss` in MiB."""
    return maxrss / MIB if sys.platform == "darwin" else maxrss / 1024


def peak_rss_mb() -> float:
    """This process's largest resident set so far, in MiB."""
    return maxrss_mb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def rss_mb() -> float | None:
    """This process's resident set now, in MiB (None where /proc is absent)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB
    except (OSError, ValueError, IndexError):
        return None


def memory_now() -> dict[str, float | None]:
    """The resident set now and at its peak so far, in MiB (the kernel updates the peak lazily: it may lag the
    current size by a few pages, so the peak is at least the current)."""
    now = rss_mb()
    return {"rss_mb": now, "peak_rss_mb": max(peak_rss_mb(), now or 0.0)}


def high_water_mb(pid: int) -> float | None:
    """A running process's largest resident set so far, in MiB (its `VmHWM`; None where /proc is absent)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@dataclass
class Child:
    """A finished command: its exit status, output, wall time (from its start to its end, the launcher's own
    start-up not counted) and peak resident set."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float
    peak_rss_mb: float


def run_child(argv: list[str], timeout: float = 600, **popen) -> Child:
    """`subprocess.run(argv, capture_output=True, text=True)` with the command's peak resident set, through the
    launcher; the output goes through temporary files (no pipe to drain while waiting). A command past
    `timeout` is killed with its launcher and raises `subprocess.TimeoutExpired`."""
    with tempfile.TemporaryDirectory(prefix="rlvr-child-") as folder:
        report = Path(folder) / "report"
        with open(Path(folder) / "out", "w+") as out, open(Path(folder) / "err", "w+") as err:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", LAUNCH, str(report), *argv],
                stdout=out,
                stderr=err,
                text=True,
                start_new_session=True,
                **popen,
            )
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                raise
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        if not report.exists():
            raise RuntimeError(f"{argv[0]} could not be started: {stderr[-2000:]}")
        maxrss, returncode, seconds = report.read_text().split()
        return Child(int(returncode), stdout, stderr, float(seconds), maxrss_mb(int(maxrss)))
