"""Leases: one writer at a time where the lake needs one, enforced by the lake itself.

A lease is a numbered series of epoch objects under `_rlvr/leases/NAME/`, each created with
put-if-absent (`storage/objects.py`), so only one process can create epoch N+1: whoever created the
newest epoch holds the lease until it writes `N.released` or its process dies
(`storage/presence.py`). A second writer is refused at once, or waits; a dead holder is taken over;
two processes racing for a free lease cannot both win. At each heartbeat a holder checks that no
newer epoch appeared (a holder paused past the timeout on another machine was taken over); the
lake then refuses its writes (`LeaseLost`). Nothing here depends on the Prefect server.

The platform's leases:
- `loop`: everything that writes an iteration or trains (`rlvr run`, `stage`, `iterate`, `verify`, ...);
- `bank`: bank-version allocation, deduplication against the bank and the `problems` commit.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from storage import objects, presence
from storage.errors import LeaseHeld, LeaseLost
from storage.location import LakeLocation

LOOP = "loop"
BANK = "bank"
KEPT_EPOCHS = 20  # older epochs are pruned: only the newest says who holds the lease


@dataclass
class Holder:
    """The newest epoch of a lease and what it says."""

    epoch: int
    record: dict[str, Any]
    released: bool
    alive: bool

    @property
    def free(self) -> bool:
        return self.released or not self.alive


@dataclass
class Grant:
    """A lease this thread holds."""

    name: str
    epoch: int
    thread: int
    count: int = 1
    lost: bool = False
    taken_from: dict[str, Any] | None = field(default=None)
    helpers: set[int] = field(default_factory=set)  # other threads of the holder's own work (`helping`)
    joined: bool = False  # another process holds this epoch; this one works for it

    def held_by(self, thread: int) -> bool:
        return thread == self.thread or thread in self.helpers


_HELD: dict[tuple[int, str, str], Grant] = {}
_LOCK = threading.RLock()


def _epoch_name(epoch: int, suffix: str = "json") -> str:
    return f"{epoch:010d}.{suffix}"


def holder(location: LakeLocation, name: str) -> Holder | None:
    """Who holds the lease now (None: it was never taken)."""
    listed = objects.names(location, ("leases", name))
    epochs = sorted({int(entry.split(".")[0]) for entry in listed if entry.split(".")[0].isdigit()})
    if not epochs:
        return None
    top = epochs[-1]
    record = objects.get(location, ("leases", name, _epoch_name(top))) or {}
    released = _epoch_name(top, "released") in listed
    return Holder(top, record, released, not released and presence.still_alive(location, record))


def describe_holder(location: LakeLocation, name: str, found: Holder) -> str:
    record = presence.current_record(location, found.record) or found.record
    runs = record.get("runs") or []
    since = datetime.fromtimestamp(float(found.record.get("since", 0)), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    run = f", run {runs[-1]}" if runs else ""
    return f"the lake's {name} lease is held by {presence.describe(record)}{run}, since {since}"


def acquire(location: LakeLocation, name: str, wait: bool | float = False, poll: float = 1.0) -> Grant:
    """Take the lease (re-entrant within a thread). `wait`: False refuses at once when another live process
    holds it, True waits for as long as it takes, a number waits that many seconds."""
    key = (os.getpid(), location.uri, name)
    thread = threading.get_ident()
    with _LOCK:
        held = _HELD.get(key)
        if held is not None and held.held_by(thread):
            held.count += 1
            return held
    deadline = None if wait is True else time.monotonic() + (0 if wait is False else float(wait))
    mine = presence.presence(location)
    while True:
        with _LOCK:
            busy_here = key in _HELD  # another thread of this process holds it
        found = holder(location, name)
        if not busy_here and (found is None or found.free):
            epoch = 1 if found is None else found.epoch + 1
            mine.add_lease(name, epoch)  # the process record names the lease before the epoch does
            record = {
                **presence.this_process().as_record(),
                "command": presence.command_line(),
                "since": time.time(),
                "thread": thread,
                "epoch": epoch,
                "taken_from": None if found is None or found.released else found.record,
            }
            if objects.put_if_absent(location, ("leases", name, _epoch_name(epoch)), record):
                grant = Grant(name, epoch, thread, taken_from=record["taken_from"])
                with _LOCK:
                    _HELD[key] = grant
                _watch(location, mine)
                _prune(location, name, epoch)
                return grant
            mine.remove_lease(name)  # another process won the race for this epoch
            continue
        if deadline is not None and time.monotonic() >= deadline:
            if busy_here:
                raise LeaseHeld(
                    f"the lake's {name} lease is held by another thread of this process (pid {os.getpid()})"
                )
            raise LeaseHeld(
                describe_holder(location, name, found) + ": one writer at a time (--wait queues "
                "behind it; a holder that dies is taken over)"
            )
        time.sleep(poll)


def release(location: LakeLocation, name: str) -> None:
    key = (os.getpid(), location.uri, name)
    with _LOCK:
        grant = _HELD.get(key)
        if grant is None or not grant.held_by(threading.get_ident()):
            return
        grant.count -= 1
        if grant.count:
            return
        del _HELD[key]
    if grant.joined:  # not ours to release: the holder does
        presence.presence(location).remove_lease(f"{name}:joined")
        return
    if not grant.lost:
        objects.put(location, ("leases", name, _epoch_name(grant.epoch, "released")), {"at": time.time()})
    presence.presence(location).remove_lease(name)


@contextmanager
def helping(location: LakeLocation, name: str, owner: int) -> Iterator[None]:
    """This thread works for the thread `owner`, which holds the lease: within it, the lease is this thread's
    too (the overlapped loop's trainer beside its sampler). Refused when `owner` does not hold it."""
    key = (os.getpid(), location.uri, name)
    me = threading.get_ident()
    with _LOCK:
        grant = _HELD.get(key)
        if grant is None or grant.thread != owner:
            raise LeaseHeld(f"the lake's {name} lease is not held by the thread this one helps")
        grant.helpers.add(me)
    try:
        yield
    finally:
        with _LOCK:
            grant.helpers.discard(me)


@contextmanager
def joining(location: LakeLocation, name: str, epoch: int) -> Iterator[Grant]:
    """This process works for the process that holds epoch `epoch` of the lease: a flow run the holder started
    on a worker (the overlapped loop's producer and trainer, `flows/async_workers.py`). Within it the lease is
    this thread's; refused unless that epoch is the newest and its holder alive, and lost (the lake refuses
    this process's writes) once the holder releases it, dies, or is taken over."""
    found = holder(location, name)
    if found is None or found.epoch != epoch or found.free:
        now = (
            "was never taken"
            if found is None
            else (f"is at epoch {found.epoch}" if found.epoch != epoch else "was released or its holder died")
        )
        raise LeaseHeld(
            f"this flow run works under epoch {epoch} of the lake's {name} lease, which {now}: "
            "it is started by the run that holds the lease, not on its own"
        )
    key = (os.getpid(), location.uri, name)
    grant = Grant(name, epoch, threading.get_ident(), joined=True)
    with _LOCK:
        if key in _HELD:
            raise LeaseHeld(f"this process (pid {os.getpid()}) already holds the lake's {name} lease")
        _HELD[key] = grant
    mine = presence.presence(location)
    mine.add_lease(f"{name}:joined", epoch)  # its record (and heartbeat) tells others it is alive
    _watch(location, mine)
    try:
        yield grant
    finally:
        with _LOCK:
            if _HELD.get(key) is grant:
                del _HELD[key]
        mine.remove_lease(f"{name}:joined")


def check(location: LakeLocation) -> None:
    """Refuse to write when a lease this process holds on the lake was taken over."""
    with _LOCK:
        lost = [
            grant for (pid, uri, _), grant in _HELD.items() if pid == os.getpid() and uri == location.uri and grant.lost
        ]
    if lost:
        found = holder(location, lost[0].name)
        who = describe_holder(location, lost[0].name, found) if found else f"the {lost[0].name} lease is gone"
        raise LeaseLost(
            f"this process lost the {lost[0].name} lease (epoch {lost[0].epoch}) while it ran: {who}; "
            "its writes are refused"
        )


def epoch_held(location: LakeLocation, name: str) -> int:
    """The epoch of the lease this process holds (or joined); refused when it holds none."""
    with _LOCK:
        grant = _HELD.get((os.getpid(), location.uri, name))
    if grant is None:
        raise LeaseHeld(f"this process does not hold the lake's {name} lease")
    return grant.epoch


def holding_thread(location: LakeLocation, name: str) -> int:
    """The thread that holds the lease this thread holds or helps with: the one a new helper thread helps."""
    with _LOCK:
        grant = _HELD.get((os.getpid(), location.uri, name))
    if grant is None or not grant.held_by(threading.get_ident()):
        raise LeaseHeld(f"this thread does not hold the lake's {name} lease")
    return grant.thread


def held_here(location: LakeLocation, name: str) -> bool:
    with _LOCK:
        grant = _HELD.get((os.getpid(), location.uri, name))
    return grant is not None and not grant.lost


def _watch(location: LakeLocation, mine: presence.Presence) -> None:
    """After each heartbeat: is each lease still ours (no newer epoch)?"""

    def still_ours() -> None:
        with _LOCK:
            grants = [g for (pid, uri, _), g in _HELD.items() if pid == os.getpid() and uri == location.uri]
        for grant in grants:
            found = holder(location, grant.name)
            if found is not None and (found.epoch != grant.epoch or (grant.joined and found.free)):
                grant.lost = True

    if not any(getattr(hook, "__name__", "") == "still_ours" for hook in mine.hooks):
        mine.hooks.append(still_ours)


def _prune(location: LakeLocation, name: str, newest: int) -> None:
    for entry in objects.names(location, ("leases", name)):
        number = entry.split(".")[0]
        if number.isdigit() and int(number) <= newest - KEPT_EPOCHS:
            objects.delete(location, ("leases", name, entry))
