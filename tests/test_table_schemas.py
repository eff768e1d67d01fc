"""Existing tables keep their exact schemas: Delta stores each field's metadata (its description),
so even a reworded description makes every write to a lake made before it fail with a schema
mismatch. New tables and new descriptions go to new tables; this snapshot says what is frozen."""

import json
from pathlib import Path

from storage.schemas import TABLES

SNAPSHOT = Path(__file__).with_name("table_schemas.json")


def rendered(name: str) -> list[str]:
    return TABLES[name].schema.to_string(show_field_metadata=True, show_schema_metadata=True).splitlines()


def test_no_existing_table_schema_changed():
    frozen = json.loads(SNAPSHOT.read_text())
    changed = [name for name in frozen if name in TABLES and rendered(name) != frozen[name]]
    assert not changed, f"schemas of existing tables changed (old lakes could no longer be written): {changed}"
    assert set(frozen) <= set(TABLES), f"tables removed: {sorted(set(frozen) - set(TABLES))}"


def test_every_table_is_in_the_snapshot():
    missing = sorted(set(TABLES) - set(json.loads(SNAPSHOT.read_text())))
    assert not missing, f"add the new tables {missing} to {SNAPSHOT.name} (see this test's module docstring)"
