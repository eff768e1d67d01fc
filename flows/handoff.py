"""The overlapped loop's hand-off between its sampler and its trainer, through the lake.

The two roles may be threads of one flow run or flow runs on different workers (`loop.roles`); either
way they talk only through small objects under `_rlvr/handoff/<id>/`, beside the tables they share:

- `sampled-<iteration>.json`: the sampler committed the iteration's rollouts and rewards;
- `published.json`: the newest version the trainer trained and published (the sampler may use it);
- `<role>.json`: the process a role runs in, so the other can tell when it died (`storage/presence.py`);
- `failed-<role>.json`: a role stopped with an error; the other stops at its next wait.

A wait raises as soon as the other role failed or its process died, or this process lost the loop
lease, so neither waits forever. The
objects are removed when the loop's run ends; a crash leaves them, and a resume starts a new id.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from storage import leases, objects, presence
from storage.lake import Lake

ROLES = ("sampler", "trainer")


class RoleFailed(RuntimeError):
    """The other role of the overlapped loop stopped (an error, or its process died)."""


@dataclass(frozen=True)
class Plan:
    """What both roles of one overlapped run agree on: passed to each as it starts."""

    handoff: str  # the hand-off folder's id (one per run of the loop)
    first: int  # the first iteration to run
    total: int  # how many iterations
    start: int  # the version published when the run began (the sampler's first)
    already_trained: int | None  # the first iteration's version, when a crashed run trained it already
    lease_epoch: int  # the loop lease epoch the run holds (workers join it)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Handoff:
    """One role's view of the hand-off folder."""

    def __init__(self, lake: Lake, plan: Plan, role: str, poll: float | None = None):
        self.lake, self.plan, self.role = lake, plan, role
        self.other = ROLES[1 - ROLES.index(role)]
        self.poll = poll if poll is not None else (0.5 if lake.location.is_s3 else 0.05)

    def _parts(self, name: str) -> tuple[str, ...]:
        return ("handoff", self.plan.handoff, name)

    def join(self) -> None:
        """Say which process this role runs in (before anything the other role waits for)."""
        objects.put(self.lake.location, self._parts(f"{self.role}.json"), presence.this_process().as_record())

    def sampled(self, iteration: int) -> None:
        objects.put(self.lake.location, self._parts(f"sampled-{iteration:08d}.json"), {"iteration": iteration})

    def published(self, version: int) -> None:
        objects.put(self.lake.location, self._parts("published.json"), {"version": version})

    def failed(self, error: BaseException) -> None:
        objects.put(
            self.lake.location,
            self._parts(f"failed-{self.role}.json"),
            {"error": f"{type(error).__name__}: {error}"[:2000]},
        )

    def wait_sampled(self, iteration: int) -> None:
        """Until the sampler committed `iteration`."""
        name = f"sampled-{iteration:08d}.json"
        self._wait(
            lambda: objects.get(self.lake.location, self._parts(name)) is not None, f"iteration {iteration}'s rollouts"
        )

    def wait_published(self, version: int) -> int:
        """Until `version` (or a newer one) is trained and published; returns the newest."""
        newest = self.plan.start

        def ready() -> bool:
            nonlocal newest
            found = objects.get(self.lake.location, self._parts("published.json"))
            newest = max(newest, found["version"]) if found else newest
            return newest >= version

        self._wait(ready, f"version {version}")
        return newest

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        checked = 0.0
        while not ready():
            if time.monotonic() - checked > max(1.0, self.poll):  # the other role's health, about once a second
                self._other_is_working(what)
                checked = time.monotonic()
            time.sleep(self.poll)

    def _other_is_working(self, what: str) -> None:
        leases.check(self.lake.location)  # a role whose loop lease was lost stops waiting too
        failure = objects.get(self.lake.location, self._parts(f"failed-{self.other}.json"))
        if failure is not None:
            raise RoleFailed(f"the {self.other} stopped ({failure['error']}); the {self.role} waited for {what}")
        record = objects.get(self.lake.location, self._parts(f"{self.other}.json"))
        if record is not None and not presence.still_alive(self.lake.location, record):
            raise RoleFailed(
                f"the {self.other}'s process ({presence.describe(record)}) died; the {self.role} waited for {what}"
            )

    def close(self) -> None:
        location = self.lake.location
        for name in objects.names(location, ("handoff", self.plan.handoff)):
            objects.delete(location, self._parts(name))
        if not location.is_s3:  # a folder of its own on disk (S3 has none)
            with contextlib.suppress(OSError):
                os.rmdir(objects.object_path(location, "handoff", self.plan.handoff))
