"""Waiting on a sandboxed run: its output collected up to the limit, its wall clock, and (where no cgroup bounds
it) its summed memory and CPU time measured while it runs."""

from __future__ import annotations

import os
import select
import time

POLL_SECONDS = 0.01  # how often a run's processes are measured where no cgroup bounds them,
NEAR_POLL_SECONDS = 0.001  # and how often once they hold half their memory budget (less slips through)
MB = 1024 * 1024


class Watch:
    """Collects a run's output up to the limit while waiting, and enforces its wall clock and, where
    `measure` is given, its summed memory and CPU time."""

    def __init__(self, limits: dict, measure=None):
        self.deadline = time.monotonic() + limits["wall_seconds"]
        self.limit = limits["output_bytes"]
        self.memory = (limits["memory_mb"] - limits.get("scratch_mb", 0)) * MB
        self.cpu = limits["cpu_seconds"]
        self.measure = measure
        self.buffers: dict[int, bytearray] = {}
        self.open: set[int] = set()

    def output(self, fd: int) -> None:
        self.buffers[fd] = bytearray()
        self.open.add(fd)

    def until(self, finished, extra: tuple[int, ...] = ()) -> str:
        tick = POLL_SECONDS if self.measure else 0.05
        while True:
            if finished():
                return "ok" if self._drain() else "output_limit"
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            if self.measure is not None:
                resident, cpu = self.measure()
                if resident > self.memory:
                    return "memory_limit"
                if cpu > self.cpu:
                    return "cpu_limit"
                tick = NEAR_POLL_SECONDS if resident > self.memory / 2 else POLL_SECONDS
            for fd in ready([*self.open, *extra], min(remaining, tick)):
                if fd in self.open and not self._read(fd):
                    return "output_limit"

    def _read(self, fd: int) -> bool:
        chunk = os.read(fd, 65536)
        if not chunk:
            self.open.discard(fd)
            return True
        self.buffers[fd] += chunk
        return len(self.buffers[fd]) <= self.limit

    def _drain(self) -> bool:
        """Keep what the run wrote and was not read yet when it finished (a quick run's whole output, often);
        False when that takes it past the limit."""
        for fd in list(self.open):
            while fd in self.open and readable(fd):
                if not self._read(fd):
                    return False
        return True

    def text(self, fd: int) -> str:
        os.close(fd)
        return bytes(self.buffers[fd][: min(len(self.buffers[fd]), 4000)]).decode("utf-8", "replace")


def ready(fds: list[int], timeout: float) -> list[int]:
    """The descriptors that can be read (or hit end of file) within `timeout` seconds. poll, not select:
    select cannot watch a descriptor numbered 1024 or above."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return [fd for fd, _ in poller.poll(max(0, int(timeout * 1000)))]


def readable(fd: int) -> bool:
    return bool(ready([fd], 0))
