"""Reading source files row by row, keeping each row's line number for quarantine and lineage."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq


class SourceReadError(RuntimeError):
    """A source file that cannot be read at all (missing, not JSONL or Parquet, unreadable)."""


@dataclass(frozen=True)
class RawRow:
    line: int  # 1-based line of a JSONL file, or 1-based row of a Parquet file
    record: dict[str, Any] | None  # None when the line is not a JSON object
    error: str | None = None
    raw: str | None = None


def read_rows(path: str, limit: int | None = None) -> Iterator[RawRow]:
    """Rows of a JSONL or Parquet file; a file that cannot be opened raises `SourceReadError`."""
    rows = _parquet_rows(path) if path.endswith(".parquet") else _jsonl_rows(path)
    valid = 0
    seen_any = False
    for row in rows:
        seen_any = True
        if row.record is not None:
            valid += 1
        yield row
        if limit is not None and valid >= limit:
            return
    if not seen_any:
        raise SourceReadError(f"cannot read source file {path}: it holds no rows")
    if valid == 0:
        raise SourceReadError(f"cannot read source file {path}: no line is a JSON object (is it JSONL?)")


def probe(path: str) -> None:
    """Fail fast, before any work, on a file that cannot be read at all: missing, unreadable,
    not Parquet, or JSONL whose first 64 KiB hold no JSON object."""
    if path.endswith(".parquet"):
        with _open(path) as handle:
            try:
                pq.ParquetFile(handle)
            except (pa.ArrowException, OSError) as error:
                raise SourceReadError(
                    f"cannot read source file {path}: not a readable Parquet file ({error})"
                ) from None
        return
    with _open(path) as handle:
        head = handle.read(65536).removeprefix(b"\xef\xbb\xbf")
    if not head.strip():
        raise SourceReadError(f"cannot read source file {path}: it holds no rows")
    lines = head.split(b"\n")
    if len(head) == 65536:
        lines = lines[:-1]  # the last line may be cut
    for line in lines:
        try:
            if isinstance(json.loads(line), dict):
                return
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
    raise SourceReadError(f"cannot read source file {path}: no line is a JSON object (is it JSONL?)")


def _open(path: str, mode: str = "rb"):
    try:
        return fsspec.open(path, mode).open()
    except (OSError, ValueError) as error:
        raise SourceReadError(f"cannot read source file {path}: {error.__class__.__name__}: {error}") from None


def _jsonl_rows(path: str) -> Iterator[RawRow]:
    with _open(path) as handle:
        for number, raw_bytes in enumerate(handle, start=1):
            try:
                text = raw_bytes.decode("utf-8-sig" if number == 1 else "utf-8")  # tolerate a byte-order mark
            except UnicodeDecodeError as error:
                yield RawRow(number, None, f"not UTF-8 text: {error.reason}", repr(raw_bytes[:200]))
                continue
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                yield RawRow(number, None, f"invalid JSON: {error.msg} at column {error.colno}", text)
                continue
            if not isinstance(record, dict):
                yield RawRow(number, None, f"a JSON {type(record).__name__}, not an object", text)
                continue
            yield RawRow(number, record, None, text)


def _parquet_rows(path: str) -> Iterator[RawRow]:
    with _open(path) as handle:
        try:
            parquet = pq.ParquetFile(handle)
            batches = parquet.iter_batches(batch_size=4096)
            number = 0
            for batch in batches:
                for record in batch.to_pylist():
                    number += 1
                    yield RawRow(number, record, None, None)
        except (pa.ArrowException, OSError) as error:
            raise SourceReadError(f"cannot read source file {path}: not a readable Parquet file ({error})") from None
