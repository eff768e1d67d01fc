"""Progress bars for long stage work: shown on a terminal, silent in logs and tests."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from rich.console import Console
from rich.progress import track as rich_track

T = TypeVar("T")
_console = Console(stderr=True)


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    return rich_track(items, description=description, total=total, console=_console,
                      disable=not sys.stderr.isatty(), transient=True)
