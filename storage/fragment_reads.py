"""Reading a table's latest version by its files, each file's part read once per filter and kept.

Most tables gain a file at every loop step, and several are read whole after each of their writes (the latest
model version, the recorded iterations): a scan opens every file, so such a read grew with the run (about
0.15-0.3 ms a file: 7-17 ms for `model_versions` at 50 steps). A data file never changes, so what a filtered,
projected scan of one file returns never changes either: a read is the files' kept parts, in the dataset's
order, and only the files new since the last read of the same filter are opened. The filter includes the
visibility rule, so a run completing or failing makes new keys, not stale answers. Parts are kept up to
KEPT_BYTES in all, least recently used first out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

KEPT_BYTES = 256 * 1024 * 1024

_PARTS: "OrderedDict[tuple, pa.Table]" = OrderedDict()
_LOCK = threading.Lock()
_kept_bytes = 0


def scan(table_uri: str, dataset: pads.FileSystemDataset, filter: pc.Expression | None,
         columns: list[str]) -> pa.Table:
    """`dataset.to_table(filter=filter, columns=columns)`, the same rows in the same order, from the parts of
    its files read before (`table_uri` and each file's path name a part; a file's path is unique in a table)."""
    condition = str(filter)
    parts = []
    for fragment in dataset.get_fragments(filter=filter) if filter is not None else dataset.get_fragments():
        key = (table_uri, fragment.path, condition, tuple(columns))
        part = _kept(key)
        if part is None:
            part = fragment.to_table(filter=filter, columns=columns, schema=dataset.schema)
            _keep(key, part)
        parts.append(part)
    if not parts:
        return dataset.to_table(filter=filter, columns=columns)
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def _kept(key: tuple) -> pa.Table | None:
    with _LOCK:
        part = _PARTS.get(key)
        if part is not None:
            _PARTS.move_to_end(key)
        return part


def _keep(key: tuple, part: pa.Table) -> None:
    global _kept_bytes
    size = part.nbytes
    if size > KEPT_BYTES // 4:
        return
    with _LOCK:
        if key in _PARTS:
            return
        _PARTS[key] = part
        _kept_bytes += size
        while _kept_bytes > KEPT_BYTES:
            _, dropped = _PARTS.popitem(last=False)
            _kept_bytes -= dropped.nbytes


def forget() -> None:
    global _kept_bytes
    with _LOCK:
        _PARTS.clear()
        _kept_bytes = 0
