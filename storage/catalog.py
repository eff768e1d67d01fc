"""The SQL catalog: every lake table as a DuckDB view over its Delta snapshot.

Tables are read through delta-rs (never a raw Parquet glob, which would also count files a
later commit removed) and handed to DuckDB as Arrow datasets, so filters push down.
"""

from __future__ import annotations

import duckdb
from storage.lake import Lake
from storage.schemas import TABLES
from storage.views import VIEWS


def open_catalog(lake: Lake, as_of: int | str | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with one view per table that exists (at `as_of`, if given), and the
    predefined analytics views (`storage/views.py`) whose tables all exist."""
    connection = duckdb.connect()
    versions = lake.versions_as_of(as_of) if as_of is not None else None
    present = set()
    for name in TABLES:
        if versions is not None and name not in versions:
            continue
        table = lake.table(name, None if versions is None else versions[name])
        if table is not None:
            connection.register(name, table.to_pyarrow_dataset())
            present.add(name)
    for view in VIEWS:
        if set(view.needs) <= present:
            connection.execute(f"create view {view.name} as {view.sql}")
    return connection
