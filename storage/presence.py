"""Which processes are at work on a lake, and whether they are still alive.

A process that runs stages or holds a lease keeps a record under `_rlvr/processes/`: its host, pid,
command, the runs it has in progress and a heartbeat that a background thread rewrites every few
seconds. Another process judges it
- on the same machine (same host name and boot id) by its pid and that pid's start time, at once:
  a process killed with SIGKILL is dead the moment it dies, and a reused pid is not mistaken for it;
- elsewhere by its heartbeat: silent for `RLVR_LEASE_TIMEOUT` seconds (default 60) means dead.
Runs and leases of a dead process are abandoned and taken over (`storage/leases.py`, `Lake.reap`).
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from storage import environment, objects
from storage.location import LakeLocation

TIMEOUT_ENV = "RLVR_LEASE_TIMEOUT"
DEFAULT_TIMEOUT = 60.0


def lease_timeout() -> float:
    """Seconds without a heartbeat after which a process on another machine counts as dead."""
    return environment.seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT)


def heartbeat_interval() -> float:
    return max(0.5, lease_timeout() / 6)


@dataclass(frozen=True)
class Identity:
    """A process, told apart from any other that ever ran: a pid is reused, (pid, start time) is not."""

    host: str
    boot_id: str
    pid: int
    started: str

    @property
    def process_id(self) -> str:
        return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', self.host)}-{self.pid}-{self.started}"

    def as_record(self) -> dict[str, Any]:
        return {
            "process_id": self.process_id,
            "host": self.host,
            "boot_id": self.boot_id,
            "pid": self.pid,
            "started": self.started,
        }


@lru_cache(maxsize=1)
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return None if fields[0] in ("Z", "X") else fields[19]  # a zombie has exited


_IDENTITIES: dict[int, Identity] = {}


def this_process() -> Identity:
    pid = os.getpid()  # recomputed after a fork
    if pid not in _IDENTITIES:
        _IDENTITIES[pid] = Identity(socket.gethostname(), _boot_id(), pid, _start_time(pid) or "0")
    return _IDENTITIES[pid]


def command_line() -> str:
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return " ".join([program, *sys.argv[1:]])[:300]


def alive(record: dict[str, Any], now: float | None = None) -> bool:
    """Is the process a record describes still running?"""
    me = this_process()
    if record.get("host") == me.host and record.get("boot_id") == me.boot_id and me.boot_id:
        started = _start_time(int(record["pid"]))
        return started is not None and (started == "" or started == str(record.get("started")))
    heartbeat = float(record.get("heartbeat_at") or 0)
    return (time.time() if now is None else now) - heartbeat < lease_timeout()


def current_record(location: LakeLocation, record: dict[str, Any]) -> dict[str, Any] | None:
    """The process's own record (fresher than a copy kept elsewhere, e.g. in a lease epoch), else the copy when
    the process ran on this machine; None when it ran elsewhere and its record is gone (it left, or was reaped)."""
    if not record:
        return None
    current = objects.get(location, ("processes", f"{record.get('process_id')}.json"))
    if current is not None:
        return current
    me = this_process()
    return record if record.get("host") == me.host and record.get("boot_id") == me.boot_id else None


def still_alive(location: LakeLocation, record: dict[str, Any]) -> bool:
    """Is the process a (possibly stale) copy of its record describes still running?"""
    current = current_record(location, record)
    return current is not None and alive(current)


def describe(record: dict[str, Any]) -> str:
    """`host pid 123 (rlvr run --config ...)` for messages."""
    command = f" ({record['command']})" if record.get("command") else ""
    return f"{record.get('host')} pid {record.get('pid')}{command}"


def process_records(location: LakeLocation) -> list[dict[str, Any]]:
    """Every process record in the lake (live or not)."""
    records = []
    for name in objects.names(location, ("processes",)):
        record = objects.get(location, ("processes", name))
        if record is not None:
            records.append(record)
    return records


def forget(location: LakeLocation, process_id: str) -> None:
    objects.delete(location, ("processes", f"{process_id}.json"))


class Presence:
    """This process's record in one lake, kept fresh while it has runs in progress or leases.

    `hooks` run after each heartbeat (the lease module checks there that its leases are still its own).
    """

    def __init__(self, location: LakeLocation):
        self.location = location
        self.runs: set[str] = set()
        self.holds: dict[str, int] = {}  # lease name -> epoch
        self.hooks: list[Callable[[], None]] = []
        self.started_at = time.time()
        self._lock = threading.RLock()
        self._stop: threading.Event | None = None

    def record(self) -> dict[str, Any]:
        return {
            **this_process().as_record(),
            "command": command_line(),
            "started_at": self.started_at,
            "heartbeat_at": time.time(),
            "runs": sorted(self.runs),
            "leases": dict(self.holds),
        }

    def add_run(self, run_id: str) -> None:
        with self._lock:
            self.runs.add(run_id)
            self._publish_and_beat()

    def remove_run(self, run_id: str) -> None:
        with self._lock:
            self.runs.discard(run_id)
            self._settle()

    def add_lease(self, name: str, epoch: int) -> None:
        with self._lock:
            self.holds[name] = epoch
            self._publish_and_beat()

    def remove_lease(self, name: str) -> None:
        with self._lock:
            self.holds.pop(name, None)
            self._settle()

    def publish(self) -> None:
        """Write the record now (before anything that others must be able to attribute to this process)."""
        objects.put(self.location, ("processes", f"{this_process().process_id}.json"), self.record())

    def _publish_and_beat(self) -> None:
        self.publish()
        if self._stop is None:
            self._stop = threading.Event()
            threading.Thread(target=self._beat, args=(self._stop,), name="rlvr-heartbeat", daemon=True).start()

    def _settle(self) -> None:
        """Nothing in progress: stop the heartbeat and remove the record (this process left cleanly)."""
        if self.runs or self.holds:
            self.publish()
            return
        if self._stop is not None:
            self._stop.set()
            self._stop = None
        forget(self.location, this_process().process_id)

    def _beat(self, stop: threading.Event) -> None:
        while not stop.wait(heartbeat_interval()):
            with self._lock:
                if stop.is_set():
                    return
                try:
                    self.publish()
                    for hook in list(self.hooks):
                        hook()
                except Exception:  # noqa: BLE001 - a missed beat is retried at the next; the lease timeout allows several
                    continue


_PRESENCES: dict[tuple[int, str], Presence] = {}
_PRESENCES_LOCK = threading.Lock()


def presence(location: LakeLocation) -> Presence:
    """This process's presence in the lake (one per process and lake)."""
    key = (os.getpid(), location.uri)
    with _PRESENCES_LOCK:
        if key not in _PRESENCES:
            _PRESENCES[key] = Presence(location)
        return _PRESENCES[key]
