"""What a stage made, as one value: the slices it replaces, clears or appends to. A stage returns `Outputs` and
writes nothing itself; one lake call, `Lake.commit(outputs, run)`, writes them with the stage's run (Dagster's IO
manager is the model). Each table's write is its own Delta commit, in the order the stage listed them; readers
see none of a run's rows before the run completes (`visibility.py`), so the run's outputs appear together."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import polars as pl

Mode = Literal["replace", "clear", "append"]


@dataclass(frozen=True)
class Write:
    mode: Mode
    table: str
    rows: pl.DataFrame | None  # None for a clear
    key: dict[str, Any]  # the slice a replace or clear swaps out; {} for an append


@dataclass
class Outputs:
    """A stage's outputs, in the order they are committed (a downstream slice cleared after its upstream)."""

    writes: list[Write] = field(default_factory=list)

    def replace(self, table: str, rows: pl.DataFrame, key: dict[str, Any]) -> Outputs:
        self.writes.append(Write("replace", table, rows, key))
        return self

    def clear(self, table: str, key: dict[str, Any]) -> Outputs:
        self.writes.append(Write("clear", table, None, key))
        return self

    def append(self, table: str, rows: pl.DataFrame) -> Outputs:
        self.writes.append(Write("append", table, rows, {}))
        return self

    def tables(self) -> list[str]:
        return [write.table for write in self.writes]
