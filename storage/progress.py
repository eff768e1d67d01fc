"""Progress of long stage work: a bar on a terminal (silent in logs and tests), and any listeners
the calling flow registered (the flows publish Prefect progress artifacts through one), so this
module, like every stage, stays free of Prefect."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

from rich.console import Console
from rich.progress import track as rich_track

T = TypeVar("T")
Listener = Callable[[str, int, int], None]  # (description, done, total)
_console = Console(stderr=True)
_listeners: ContextVar[tuple[Listener, ...]] = ContextVar("progress_listeners", default=())
UPDATES = 20  # a listener hears about every 5 %


@contextmanager
def reporting_to(listener: Listener) -> Iterator[None]:
    """While open, every `track` with a known total in this context also reports to `listener`."""
    token = _listeners.set(_listeners.get() + (listener,))
    try:
        yield
    finally:
        _listeners.reset(token)


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    bar = rich_track(
        items, description=description, total=total, console=_console, disable=not sys.stderr.isatty(), transient=True
    )
    listeners = _listeners.get()
    if total is None and hasattr(items, "__len__"):
        total = len(items)
    return _reported(bar, description, total, listeners) if listeners and total else bar


def _reported(items: Iterable[T], description: str, total: int, listeners: tuple[Listener, ...]) -> Iterator[T]:
    every = max(1, total // UPDATES)
    for done, item in enumerate(items, start=1):
        yield item
        if done % every == 0 or done == total:
            for listener in listeners:
                listener(description, done, total)
