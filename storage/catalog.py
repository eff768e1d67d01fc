"""The SQL catalog: every lake table as a DuckDB view over its Delta snapshot, and nothing else.

Tables are read through delta-rs (never a raw Parquet glob, which would also count files a later
commit removed) and handed to DuckDB as Arrow datasets of their visible rows (rows of runs that
never completed are left out, as every other reader leaves them out), so filters push down.

The connection is locked down before any query runs: no file system or network access of its own
(no `COPY … TO`, `read_csv('/etc/passwd')`, `ATTACH 'file'`, `INSTALL`), no extension loading, and
a locked configuration (no `SET`). `read_only_statements` refuses anything but queries. SQL reads
the lake through the catalog and cannot change it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from storage.lake import Lake, LakeError
from storage.schemas import TABLES
from storage.views import VIEWS

LOCKED_DOWN = {
    "enable_external_access": False,  # no files, URLs or secrets: only the Arrow data registered here
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "allow_unsigned_extensions": False,
}
READ_STATEMENTS = ("SELECT", "EXPLAIN")


@dataclass
class Catalog:
    """An open catalog: the connection, and the tables that could not be read (by name, with why)."""

    connection: duckdb.DuckDBPyConnection
    damaged: dict[str, str] = field(default_factory=dict)

    def sql(self, query: str) -> duckdb.DuckDBPyRelation | None:
        read_only_statements(query)
        try:
            return self.connection.sql(query)
        except duckdb.CatalogException as error:  # a query over a damaged table says which and why
            for name, why in self.damaged.items():
                if name in str(error):
                    raise LakeError(why) from None
            raise


def tables_for(query: str | None) -> list[str]:
    """The lake tables a query needs (every table when it names none of them, e.g. `show tables`)."""
    try:
        named = duckdb.get_table_names(query) if query else set()
    except duckdb.Error:
        named = set()
    needed = {name for name in named if name in TABLES}
    needed |= {table for view in VIEWS if view.name in named for table in view.needs}
    return [name for name in TABLES if name in needed] if needed else list(TABLES)


def _register(connection: duckdb.DuckDBPyConnection, name: str, dataset) -> None:
    """The table as DuckDB sees it: its Arrow dataset, and — for a table written before the contract gained
    columns (storage/schemas.py lets a table grow by nullable ones) — those columns as typed nulls, so every
    query and view reads one schema whatever the lake's age."""
    stored = set(dataset.schema.names)
    missing = [field for field in TABLES[name].schema if field.name not in stored]
    if not missing:
        connection.register(name, dataset)
        return
    connection.register(f"_stored_{name}", dataset)
    columns = ", ".join(
        f'"{field.name}"'
        if field.name in stored
        else f'CAST(NULL AS {_SQL_TYPES.get(str(field.type), "VARCHAR")}) AS "{field.name}"'
        for field in TABLES[name].schema
    )
    connection.execute(f'create view "{name}" as select {columns} from "_stored_{name}"')


_SQL_TYPES = {
    "double": "DOUBLE",
    "float": "FLOAT",
    "int64": "BIGINT",
    "int32": "INTEGER",
    "int8": "TINYINT",
    "bool": "BOOLEAN",
    "string": "VARCHAR",
    "large_string": "VARCHAR",
}


def read_only_statements(query: str) -> None:
    """Refuse anything but queries (SELECT, WITH, FROM, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN), before it runs."""
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error:
        return  # a syntax error: DuckDB's own message says where
    for statement in statements:
        kind = statement.type.name
        if kind not in READ_STATEMENTS:
            raise LakeError(
                f"rlvr sql only reads: {kind} statements are refused (queries only: SELECT, WITH, FROM, "
                "DESCRIBE, SHOW, SUMMARIZE, EXPLAIN)"
            )


def open_catalog(lake: Lake, as_of: int | str | None = None) -> duckdb.DuckDBPyConnection:
    """A locked-down DuckDB connection with one view per table that exists (at `as_of`, if given), and the
    predefined analytics views (`storage/views.py`) whose tables all exist."""
    return open_lake_catalog(lake, as_of).connection


def open_lake_catalog(lake: Lake, as_of: int | str | None = None, query: str | None = None) -> Catalog:
    """The catalog of `rlvr sql`: like `open_catalog`, and a damaged table is left out (named in `damaged`)
    instead of failing every query. Given the `query`, only the tables it names (and the tables of the
    views it names) are opened: building a table's Arrow dataset is most of a quick query's time."""
    connection = duckdb.connect(config=LOCKED_DOWN)
    versions = lake.versions_as_of(as_of) if as_of is not None else None
    runs_version = None if versions is None else versions["runs"]
    catalog = Catalog(connection)
    present = set()
    for name in tables_for(query):
        if versions is not None and name not in versions:
            continue
        try:
            dataset = lake.dataset(name, None if versions is None else versions[name], runs_version)
        except LakeError as error:
            catalog.damaged[name] = str(error)
            continue
        if dataset is not None:
            _register(connection, name, dataset)
            present.add(name)
    for view in VIEWS:
        if set(view.needs) <= present:
            connection.execute(f"create view {view.name} as {view.sql}")
    connection.execute("set lock_configuration = true")
    return catalog
