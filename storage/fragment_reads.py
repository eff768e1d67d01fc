"""Reading a table's latest version by its files, each file's part read once per filter and kept.

Most tables gain a file at every loop step, and several are read whole after each of their writes (the latest
model version, the recorded iterations): a scan opens every file, so such a read grew with the run (`rlvr
bench lake-scale` measures it). A data file never changes, so what a filtered,
projected scan of one file returns never changes either: a read is the files' kept parts, in the dataset's
order, and only the files new since the last read of the same filter are opened. The filter includes the
visibility rule, so a run completing or failing makes new keys, not stale answers. A key names a filter by its
whole serialized structure (`filter_key`), never by its text: Arrow prints a value set of more than twenty as
its first and last ten, so two filters that differ only in the middle of a set (the runs hidden from readers,
a list of problem ids) print alike. Parts are kept up to KEPT_BYTES in all, least recently used first out.
"""

from __future__ import annotations

import hashlib
import pickle
import threading
from collections import OrderedDict

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

KEPT_BYTES = 256 * 1024 * 1024


class KeptTables:
    """Arrow tables kept by key, the least recently used dropped first past `entries` tables or `max_bytes`
    bytes in all (a table over a quarter of `max_bytes` is not kept)."""

    def __init__(self, entries: int | None = None, max_bytes: int | None = None):
        self.entries, self.max_bytes = entries, max_bytes
        self._kept: OrderedDict[tuple, pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple) -> pa.Table | None:
        with self._lock:
            table = self._kept.get(key)
            if table is not None:
                self._kept.move_to_end(key)
            return table

    def put(self, key: tuple, table: pa.Table) -> None:
        size = table.nbytes if self.max_bytes is not None else 0
        if self.max_bytes is not None and size > self.max_bytes // 4:
            return
        with self._lock:
            if key in self._kept:
                return
            self._kept[key] = table
            self._bytes += size
            while (self.entries is not None and len(self._kept) > self.entries) or (
                self.max_bytes is not None and self._bytes > self.max_bytes
            ):
                _, dropped = self._kept.popitem(last=False)
                self._bytes -= dropped.nbytes if self.max_bytes is not None else 0

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._bytes = 0


_PARTS = KeptTables(max_bytes=KEPT_BYTES)


def filter_key(filter: pc.Expression | None) -> bytes | None:
    """What identifies a filter exactly: a digest of its serialized expression, every value of every value set
    included (its text does not: see the module's docstring)."""
    return None if filter is None else hashlib.blake2b(pickle.dumps(filter), digest_size=20).digest()


def schema_key(schema: pa.Schema) -> bytes:
    return hashlib.blake2b(schema.serialize().to_pybytes(), digest_size=16).digest()


def scan(table: str, dataset: pads.FileSystemDataset, filter: pc.Expression | None, columns: list[str]) -> pa.Table:
    """`dataset.to_table(filter=filter, columns=columns)`, the same rows in the same order, from the parts of
    its files read before. A part is valid for as long as what it was read from and with is the same: the
    table (`table`: its location, storage options included), the file (its path is unique in a table and its
    bytes never change), the exact filter, the columns and the schema they are read with."""
    condition, schema = filter_key(filter), schema_key(dataset.schema)
    parts = []
    for fragment in dataset.get_fragments(filter=filter):
        key = (table, fragment.path, condition, tuple(columns), schema)
        part = _PARTS.get(key)
        if part is None:
            part = fragment.to_table(filter=filter, columns=columns, schema=dataset.schema)
            _PARTS.put(key, part)
        parts.append(part)
    if not parts:
        return dataset.to_table(filter=filter, columns=columns)
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def forget() -> None:
    _PARTS.clear()
