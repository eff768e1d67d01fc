"""Scoring many (problem, response) pairs across worker processes, with a hard time bound per item.

Each worker runs verifiers in its main thread (so math-verify's signal-based timeouts work) and
owns its own code sandbox. The parent gives each item a deadline; a worker that misses it is
killed and replaced, and the item scores 0 with the reason — one pathological response never
stalls the stage.
"""

from __future__ import annotations

import multiprocessing
from functools import lru_cache
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from tasks.verifiers.base import Verdict, build_verifier
from tasks.verifiers.formats import format_reward

DEFAULT_VERIFIER = {"math": "math", "code": "code", "logic": "gym", "qa": "qa"}


@dataclass(frozen=True)
class Scored:
    """One scored item: the verdict plus the verifier's identity, as a reward row needs them."""

    index: int
    reward: float
    correct: bool | None
    verifier: str
    verifier_version: str
    format_reward: float
    details: dict[str, Any]


class VerifierSet:
    """Verifier instances by name, built on first use with the configured options."""

    def __init__(self, options: Mapping[str, Mapping[str, Any]] | None = None, worker: int = 0):
        self.options = {name: dict(value) for name, value in (options or {}).items()}
        self.worker = worker
        self._built: dict[str, Any] = {}

    def get(self, name: str):
        if name not in self._built:
            verifier = build_verifier(name, **self.options.get(name, {}))
            if hasattr(verifier, "_sandbox") and verifier._sandbox is None:
                from tasks.sandbox.client import Sandbox

                verifier._sandbox = Sandbox(worker=self.worker, limits=verifier.limits)
            self._built[name] = verifier
        return self._built[name]

    def score(self, index: int, problem: Mapping[str, Any], response: str, verifier_name: str | None) -> Scored:
        name = verifier_name or problem.get("verifier") or DEFAULT_VERIFIER.get(problem.get("domain", ""), "math")
        verifier = self.get(name)
        try:
            verdict = verifier.verify(problem, response)
        except Exception as error:  # noqa: BLE001 - a verifier bug must not lose the other items
            verdict = Verdict(0.0, None, {"reason": f"verifier error: {type(error).__name__}: {error}",
                                          "traceback": traceback.format_exc(limit=3)})
        return Scored(index, float(verdict.reward), verdict.correct, verifier.name, verifier.version,
                      format_reward(problem.get("domain", "math"), response), verdict.details)

    def close(self) -> None:
        for verifier in self._built.values():
            if hasattr(verifier, "close"):
                verifier.close()


def _worker_main(connection: Connection, options: dict, worker: int) -> None:
    verifiers = VerifierSet(options, worker)
    try:
        while True:
            try:
                item = connection.recv()
            except EOFError:
                return
            if item is None:
                return
            connection.send(verifiers.score(*item))
    finally:
        verifiers.close()


@lru_cache(maxsize=None)
def _version_of(name: str) -> str:
    return build_verifier(name).version


class VerifierPool:
    """`workers` processes scoring items in parallel; `workers=0` scores in this process, unbounded."""

    def __init__(self, workers: int = 2, item_timeout: float = 30.0,
                 options: Mapping[str, Mapping[str, Any]] | None = None):
        self.workers = workers
        self.item_timeout = item_timeout
        self.options = {name: dict(value) for name, value in (options or {}).items()}
        self._context = multiprocessing.get_context("spawn")
        self._slots: list[dict[str, Any]] = []

    def _start(self, worker: int) -> dict[str, Any]:
        parent, child = self._context.Pipe()
        process = self._context.Process(target=_worker_main, args=(child, self.options, worker), daemon=True)
        process.start()
        child.close()
        return {"worker": worker, "process": process, "connection": parent, "item": None, "deadline": None}

    def score(self, items: Iterable[tuple[Mapping[str, Any], str, str | None]],
              on_result: Callable[[Scored], None] | None = None) -> Iterator[Scored]:
        """Yield a `Scored` per (problem, response, verifier name or None), in completion order."""
        if self.workers == 0:
            verifiers = VerifierSet(self.options)
            try:
                for index, (problem, response, name) in enumerate(items):
                    yield verifiers.score(index, problem, response, name)
            finally:
                verifiers.close()
            return
        pending = iter(enumerate(items))
        self._slots = [self._start(w) for w in range(self.workers)]
        try:
            busy = 0
            for slot in self._slots:
                busy += self._feed(slot, pending)
            while busy:
                now = time.monotonic()
                timeout = max(0.0, min(s["deadline"] for s in self._slots if s["item"] is not None) - now)
                ready = wait([s["connection"] for s in self._slots if s["item"] is not None], timeout)
                for slot in self._slots:
                    if slot["item"] is None:
                        continue
                    if slot["connection"] in ready:
                        result = self._receive(slot)
                    elif time.monotonic() >= slot["deadline"]:
                        result = self._timed_out(slot)
                    else:
                        continue
                    yield result
                    busy -= 1
                    busy += self._feed(slot, pending)
        finally:
            for slot in self._slots:
                self._stop(slot)

    def _feed(self, slot: dict[str, Any], pending: Iterator) -> int:
        try:
            index, (problem, response, name) = next(pending)
        except StopIteration:
            slot["item"] = None
            return 0
        slot["item"] = (index, dict(problem), response, name)
        slot["deadline"] = time.monotonic() + self.item_timeout
        slot["connection"].send(slot["item"])
        return 1

    def _receive(self, slot: dict[str, Any]) -> Scored:
        try:
            return slot["connection"].recv()
        except (EOFError, OSError):
            return self._replace(slot, "the verification worker died")

    def _timed_out(self, slot: dict[str, Any]) -> Scored:
        return self._replace(slot, f"verification timed out after {self.item_timeout:g} s")

    def _replace(self, slot: dict[str, Any], reason: str) -> Scored:
        index, problem, _, name = slot["item"]
        slot["process"].kill()
        slot["process"].join(5)
        slot.update(self._start(slot["worker"]))
        name = name or problem.get("verifier") or DEFAULT_VERIFIER.get(problem.get("domain", ""), "math")
        return Scored(index, 0.0, False, name, _version_of(name), 0.0, {"reason": reason})

    def _stop(self, slot: dict[str, Any]) -> None:
        try:
            slot["connection"].send(None)
        except (OSError, BrokenPipeError):
            pass
        slot["process"].join(10)
        if slot["process"].is_alive():
            slot["process"].kill()
            slot["process"].join(5)
