"""Which rows a reader sees: every data row carries the run that wrote it, and a row is visible only once its run
has completed, or to the run itself while it works (this process's runs in progress). A stage killed before its
run row says `completed` leaves rows no reader, SQL view, training mix or deduplication sees."""

from __future__ import annotations

import pyarrow.compute as pc
from deltalake import DeltaTable, QueryBuilder

from storage import runs_table
from storage.schemas import TABLES
from storage.snapshots import SNAPSHOT_LOCK

# Runs in progress in this process: their own rows are visible to them before they complete.
ACTIVE_RUNS: set[str] = set()


def not_completed(runs: DeltaTable) -> frozenset[str]:
    known = runs_table.not_completed(runs)
    if known is not None:
        return known
    rows = (
        QueryBuilder().register("runs", runs).execute("select run_id from runs where status <> 'completed'").read_all()
    )
    return frozenset(rows["run_id"].to_pylist())


class Visibility:
    """`Lake`'s visibility rule, over its snapshot of `runs` (`SnapshotReads`)."""

    def hidden_runs(self, runs_version: int | None = None) -> frozenset[str]:
        """Runs whose rows readers must not see: every run not `completed` (running elsewhere, killed,
        failed, abandoned, rolled back), except this process's own runs in progress."""
        if runs_version is not None:
            runs = self.table("runs", runs_version)
            return frozenset() if runs is None else not_completed(runs) - ACTIVE_RUNS
        with SNAPSHOT_LOCK:
            entry = self._cached("runs")
            if entry is None:
                return frozenset()
            if entry.hidden is None or entry.hidden[0] != entry.table.version():  # no Arrow dataset to build
                entry.hidden = (entry.table.version(), not_completed(entry.table))
            return entry.hidden[1] - ACTIVE_RUNS

    def _visible(self, name: str, runs_version: int | None = None) -> pc.Expression | None:
        if name == "runs" or "run_id" not in TABLES[name].schema.names:
            return None
        hidden = self.hidden_runs(runs_version)
        return ~pc.field("run_id").isin(sorted(hidden)) if hidden else None
