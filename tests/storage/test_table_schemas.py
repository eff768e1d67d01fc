"""Existing tables keep their exact schemas: Delta stores each field's metadata (its description),
so even a reworded description makes every write to a lake made before it fail with a schema
mismatch. A table may only grow, by nullable columns at its end (the lake merges them into an older
table's schema at its next write, and reads give them as nulls before); this snapshot says what is
frozen."""

import json
from pathlib import Path

import tasks.interop.tracking  # noqa: F401  (registers `tracked_runs`, a table beside the loop's)
from storage.schemas import TABLES

SNAPSHOT = Path(__file__).with_name("table_schemas.json")


def rendered(name: str) -> list[str]:
    return TABLES[name].schema.to_string(show_field_metadata=True, show_schema_metadata=True).splitlines()


def test_no_existing_table_schema_changed():
    frozen = json.loads(SNAPSHOT.read_text())
    changed = [name for name in frozen if name in TABLES and rendered(name)[: len(frozen[name])] != frozen[name]]
    assert not changed, f"schemas of existing tables changed (old lakes could no longer be written): {changed}"
    assert set(frozen) <= set(TABLES), f"tables removed: {sorted(set(frozen) - set(TABLES))}"


def test_tables_grow_only_by_nullable_columns_at_their_end():
    frozen = json.loads(SNAPSHOT.read_text())
    for name, lines in frozen.items():
        known = {line.split(":")[0] for line in lines if line and not line.startswith((" ", "-"))}
        added = [field for field in TABLES[name].schema if field.name not in known]
        assert all(field.nullable for field in added), f"{name}: added columns must be nullable: {added}"
        names = TABLES[name].schema.names
        assert names[len(names) - len(added) :] == [f.name for f in added], f"{name}: add columns at the end"


def test_every_table_is_in_the_snapshot():
    missing = sorted(set(TABLES) - set(json.loads(SNAPSHOT.read_text())))
    assert not missing, f"add the new tables {missing} to {SNAPSHOT.name} (see this test's module docstring)"
