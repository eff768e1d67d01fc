"""Arrow filter expressions and Delta SQL predicates of a table's slice (its key columns equal to values): what
reads, visibility and conditional writes combine."""

from __future__ import annotations

from typing import Any

import pyarrow.compute as pc

from storage.runs_table import sql_literal


def both(left: pc.Expression | None, right: pc.Expression | None) -> pc.Expression | None:
    if left is None or right is None:
        return right if left is None else left
    return left & right


def key_expression(key: dict[str, Any]) -> pc.Expression:
    expression = None
    for column, value in key.items():
        expression = both(expression, pc.field(column) == value)
    return expression


def key_predicate(key: dict[str, Any]) -> str:
    """The SQL predicate of a replaced slice: every key column equal to its value."""
    return " AND ".join(f"{column} = {sql_literal(value)}" for column, value in key.items())
