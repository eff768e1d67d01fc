"""Scoring many (problem, response) pairs across worker processes, with a hard time bound per item.

Each worker runs verifiers in its main thread (so math-verify's signal-based timeouts work) and
owns its own code sandbox. The parent gives each item a deadline; a worker that misses it is
killed and replaced, and the item scores 0 with the reason — one pathological response never
stalls the stage.
"""

from __future__ import annotations

import itertools
import multiprocessing
import time
import traceback
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from multiprocessing.connection import Connection, wait
from typing import Any

from tasks.errors import VerifierUnavailable
from tasks.sandbox.client import Sandbox, require_isolation
from tasks.verification.registry import build_verifier
from tasks.verifiers.base import DEFAULT_VERIFIER, VERIFIERS, Verdict
from tasks.verifiers.deadline import ItemTimeout, Watchdog
from tasks.verifiers.formats import format_reward
from tasks.verifiers.math import warm_up

MAX_RESPONSE_CHARS = 200_000  # longer responses score 0 ("too long") before any verifier reads them
MAX_DETAIL_CHARS = 1_000  # each string in a verdict's details, and each list's items beyond MAX_DETAIL_ITEMS
MAX_DETAIL_ITEMS = 20
READY = "ready"  # a worker's first message, once warm: its items' deadlines start from here
STARTUP_TIMEOUT = 180.0  # seconds a new worker may take to import and warm up on a loaded machine


def own_verifier(problem: Mapping[str, Any]) -> str:
    """The verifier a problem names, else its domain's, else math."""
    return problem.get("verifier") or DEFAULT_VERIFIER.get(problem.get("domain") or "", "math")


def _isolation_checked(items: Iterable[tuple[Mapping[str, Any], str, str | None]]) -> Iterator:
    """The items, unchanged; before the first one a verifier that runs code scores, the host's isolation is
    checked here, in the orchestrator: without any (and without --insecure-sandbox) the stage fails at once
    with the reason instead of scoring every program 0."""
    checked = False
    for item in items:
        if not checked:
            name = item[2] or own_verifier(item[0])
            if getattr(VERIFIERS.get(name), "runs_code", False):
                require_isolation()
                checked = True
        yield item


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


def bounded(value: Any, depth: int = 0) -> Any:
    """A verdict's details with every string cut to MAX_DETAIL_CHARS and every list to MAX_DETAIL_ITEMS: a
    reward row's details stay small whatever the response holds."""
    if isinstance(value, str):
        if len(value) <= MAX_DETAIL_CHARS:
            return value
        return value[:MAX_DETAIL_CHARS] + f"…[{len(value) - MAX_DETAIL_CHARS:,} more characters]"
    if depth > 4:
        return repr(value)[:MAX_DETAIL_CHARS]
    if isinstance(value, dict):
        return {str(key)[:100]: bounded(item, depth + 1) for key, item in list(value.items())[:50]}
    if isinstance(value, (list, tuple)):
        kept = [bounded(item, depth + 1) for item in value[:MAX_DETAIL_ITEMS]]
        return kept + ([f"…[{len(value) - MAX_DETAIL_ITEMS} more]"] if len(value) > MAX_DETAIL_ITEMS else [])
    return value


class VerifierSet:
    """Verifier instances by name, built on first use with the configured options. `item_timeout` bounds each
    item in this process (a watchdog; see deadline.py); None leaves the bound to whoever runs this process."""

    def __init__(
        self,
        options: Mapping[str, Mapping[str, Any]] | None = None,
        worker: int = 0,
        max_response_chars: int = MAX_RESPONSE_CHARS,
        item_timeout: float | None = None,
    ):
        self.options = {name: dict(value) for name, value in (options or {}).items()}
        self.worker = worker
        self.max_response_chars = max_response_chars
        self._watchdog, self._item_timeout = (Watchdog(), item_timeout) if item_timeout is not None else (None, None)
        self._built: dict[str, Any] = {}

    def get(self, name: str):
        if name not in self._built:
            verifier = build_verifier(name, **self.options.get(name, {}))
            if hasattr(verifier, "_sandbox") and verifier._sandbox is None:
                verifier._sandbox = Sandbox(worker=self.worker, limits=verifier.limits)
            self._built[name] = verifier
        return self._built[name]

    def score(self, index: int, problem: Mapping[str, Any], response: str, verifier_name: str | None) -> Scored:
        name = verifier_name or own_verifier(problem)
        if not isinstance(response, str):
            return Scored(
                index,
                0.0,
                None,
                name,
                version_of(name),
                0.0,
                {"reason": f"skipped: the response is {type(response).__name__}, not text"},
            )
        if len(response) > self.max_response_chars:
            return Scored(
                index,
                0.0,
                False,
                name,
                version_of(name),
                0.0,
                {"reason": f"too long: {len(response):,} characters (limit {self.max_response_chars:,})"},
            )
        try:
            verifier = self.get(name)
            if self._watchdog is not None:
                with self._watchdog.within(self._item_timeout):
                    verdict = verifier.verify(problem, response)
            else:
                verdict = verifier.verify(problem, response)
            identity = (verifier.name, verifier.version)
        except VerifierUnavailable:  # the host or a server, not the item: nothing could be scored
            raise
        except ItemTimeout as error:
            verdict, identity = Verdict(0.0, False, {"reason": f"verification {error}"}), (name, version_of(name))
        except Exception as error:  # noqa: BLE001 - a verifier bug or a bad name must not lose the other items
            verdict = Verdict(
                0.0,
                None,
                {
                    "reason": f"verifier error: {type(error).__name__}: {error}",
                    "traceback": traceback.format_exc(limit=3),
                },
            )
            identity = (name, "unknown")
        return Scored(
            index,
            float(verdict.reward),
            verdict.correct,
            *identity,
            format_reward(problem.get("domain", "math"), response),
            bounded(verdict.details),
        )

    def close(self) -> None:
        for verifier in self._built.values():
            if hasattr(verifier, "close"):
                verifier.close()
        if self._watchdog is not None:
            self._watchdog.close()


def _worker_main(connection: Connection, options: dict, worker: int, max_response_chars: int) -> None:
    """Score each chunk of items it receives, sending every result as soon as it is ready."""
    verifiers = VerifierSet(options, worker, max_response_chars)

    warm_up(verifiers.get("math"))  # sympy and the LaTeX parser, before the first item
    connection.send(READY)
    try:
        while True:
            try:
                chunk = connection.recv()
            except EOFError:
                return
            if chunk is None:
                return
            for item in chunk:
                try:
                    connection.send(verifiers.score(*item))
                except VerifierUnavailable as error:  # the parent stops the stage with the reason
                    connection.send(("unavailable", str(error)))
                    return
    finally:
        verifiers.close()


@cache
def version_of(name: str) -> str:
    try:
        return build_verifier(name).version
    except (ValueError, TypeError):
        return "unknown"


class VerifierPool:
    """`workers` processes scoring items in parallel; `workers=0` scores in this process (bounded by a watchdog
    thread instead of a kill).

    Items travel in chunks (fewer round trips), but results come back one by one, and each item
    has its own deadline: `item_timeout` seconds from the previous result of its worker, or from the
    moment a new worker said it is warm (its imports on a loaded machine are not an item's time).
    When it passes, the worker is killed and replaced, the item scores 0, and the rest of its chunk
    is sent again.
    """

    def __init__(
        self,
        workers: int = 2,
        item_timeout: float = 30.0,
        options: Mapping[str, Mapping[str, Any]] | None = None,
        chunk_size: int = 16,
        max_response_chars: int = MAX_RESPONSE_CHARS,
    ):
        self.workers = workers
        self.item_timeout = item_timeout
        self.max_response_chars = max_response_chars
        self.chunk_size = chunk_size
        self.options = {name: dict(value) for name, value in (options or {}).items()}
        self._context = multiprocessing.get_context("spawn")
        self._slots: list[dict[str, Any]] = []

    def start(self) -> VerifierPool:
        """Start (and warm up) the workers now rather than at the first `score`; they serve every call."""
        if not self._slots and self.workers:
            self._slots = [self._start(w) for w in range(self.workers)]
        return self

    def close(self) -> None:
        for slot in self._slots:
            self._stop(slot)
        self._slots = []

    def __enter__(self) -> VerifierPool:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self, worker: int) -> dict[str, Any]:
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=_worker_main, args=(child, self.options, worker, self.max_response_chars), daemon=True
        )
        process.start()
        child.close()
        return {
            "worker": worker,
            "process": process,
            "connection": parent,
            "in_flight": deque(),
            "ready": False,
            "deadline": time.monotonic() + STARTUP_TIMEOUT,
        }

    def score(self, items: Iterable[tuple[Mapping[str, Any], str, str | None]]) -> Iterator[Scored]:
        """Yield a `Scored` per (problem, response, verifier name or None), in completion order."""
        items = _isolation_checked(items)
        if self.workers == 0:
            verifiers = VerifierSet(
                self.options, max_response_chars=self.max_response_chars, item_timeout=self.item_timeout
            )
            try:
                for index, (problem, response, name) in enumerate(items):
                    yield verifiers.score(index, problem, response, name)
            finally:
                verifiers.close()
            return
        queue = _Queue(
            ((index, dict(problem), response, name) for index, (problem, response, name) in enumerate(items))
        )
        owned = not self._slots
        self.start()
        try:
            for slot in self._slots:
                self._feed(slot, queue)
            while any(slot["in_flight"] for slot in self._slots):
                busy = [slot for slot in self._slots if slot["in_flight"]]
                wait(
                    [slot["connection"] for slot in busy], max(0.0, min(s["deadline"] for s in busy) - time.monotonic())
                )
                for slot in busy:
                    yield from self._collect(slot, queue)
        finally:
            if owned:
                self.close()

    def _feed(self, slot: dict[str, Any], queue: _Queue) -> None:
        chunk = queue.take(self.chunk_size)
        if chunk:
            slot["in_flight"].extend(chunk)
            if slot["ready"]:
                slot["deadline"] = time.monotonic() + self.item_timeout
            slot["connection"].send(chunk)

    def _collect(self, slot: dict[str, Any], queue: _Queue) -> Iterator[Scored]:
        connection = slot["connection"]
        try:
            while slot["in_flight"] and connection.poll():
                result = connection.recv()
                slot["deadline"] = time.monotonic() + self.item_timeout
                if result == READY:
                    slot["ready"] = True
                    continue
                if isinstance(result, tuple) and result[0] == "unavailable":
                    raise VerifierUnavailable(result[1])
                slot["in_flight"].popleft()
                yield result
        except (EOFError, OSError):
            yield self._replace(slot, queue, "the verification worker died")
        else:
            if slot["in_flight"] and time.monotonic() >= slot["deadline"]:
                reason = (
                    f"verification timed out after {self.item_timeout:g} s"
                    if slot["ready"]
                    else f"the verification worker did not start within {STARTUP_TIMEOUT:g} s"
                )
                yield self._replace(slot, queue, reason)
        if not slot["in_flight"]:
            self._feed(slot, queue)

    def _replace(self, slot: dict[str, Any], queue: _Queue, reason: str) -> Scored:
        """Kill the worker; its current item fails, the rest of its chunk goes back in the queue."""
        index, problem, _, name = slot["in_flight"].popleft()
        queue.put_back(slot["in_flight"])
        slot["process"].kill()
        slot["process"].join(5)
        slot.update(self._start(slot["worker"]))
        name = name or own_verifier(problem)
        return Scored(index, 0.0, False, name, version_of(name), 0.0, {"reason": reason})

    def _stop(self, slot: dict[str, Any]) -> None:
        try:
            slot["connection"].send(None)
        except (OSError, BrokenPipeError):
            pass
        slot["process"].join(10)
        if slot["process"].is_alive():
            slot["process"].kill()
            slot["process"].join(5)


class _Queue:
    """Items still to score: returned ones first, then the source, lazily."""

    def __init__(self, source: Iterator):
        self.source = source
        self.returned: deque = deque()

    def take(self, count: int) -> list:
        chunk = [self.returned.popleft() for _ in range(min(count, len(self.returned)))]
        chunk += list(itertools.islice(self.source, count - len(chunk)))
        return chunk

    def put_back(self, items: deque) -> None:
        self.returned.extendleft(reversed(items))
        items.clear()
