"""Arrow datasets of Delta tables read through Arrow's own filesystems, so that no Python object is ever
freed on one of Arrow's threads.

delta-rs hands out datasets over a Python filesystem (its object store behind `PyFileSystem`). Every file
handle and buffer such a scan holds is then a Python object, and the scan's last pieces are freed on Arrow's
IO and CPU threads a moment after `to_table()` has returned. When that moment falls after the command has
printed its answer and Python has begun to shut down, the thread asks for the GIL, Python ends it with
`pthread_exit`, and the unwinding through Arrow's `noexcept` destructors calls `std::terminate`: the process
aborts with "terminate called without an active exception" (exit -6) after its work is done. It was seen
once in about seventy `rlvr lineage` runs on a loaded host and once in CI (core dumps: `~PyBuffer` and
`~PyReadableFile` on an Arrow thread, taking the GIL; apache/arrow#34314). Turning Parquet's pre-buffering
off only moved it from the buffers to the file handles. With Arrow's local or S3 filesystem the same scan holds
no Python object at all (0 aborts in 300 such runs, against 3 in 300 and 2 in 150 before; a small table reads
in the same time either way).
"""

from __future__ import annotations

import os
from functools import lru_cache
from urllib.parse import unquote, urlparse

import pyarrow.dataset as pads
import pyarrow.fs as pa_fs
from deltalake import DeltaTable


def arrow_dataset(table: DeltaTable, **options) -> pads.FileSystemDataset:
    """`table.to_pyarrow_dataset(**options)` over Arrow's filesystem for the table's location."""
    return table.to_pyarrow_dataset(filesystem=table_filesystem(table.table_uri), **options)


def table_filesystem(table_uri: str) -> pa_fs.FileSystem:
    """Arrow's filesystem rooted at a table (its data files are named relative to it): local or S3."""
    if table_uri.startswith("s3://"):
        return pa_fs.SubTreeFileSystem(table_uri.removeprefix("s3://").rstrip("/"), _s3(*_s3_settings()))
    path = unquote(urlparse(table_uri).path) if table_uri.startswith("file://") else table_uri
    return pa_fs.SubTreeFileSystem(path.rstrip("/") or "/", pa_fs.LocalFileSystem())


def _s3_settings() -> tuple[str | None, ...]:
    """The AWS variables delta-rs reads (see `LakeLocation.storage_options`)."""
    return tuple(os.environ.get(name) or None for name in
                 ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ENDPOINT_URL"))


@lru_cache(maxsize=4)
def _s3(key: str | None, secret: str | None, token: str | None, region: str | None,
        endpoint: str | None) -> pa_fs.S3FileSystem:
    options: dict = {"region": region or "us-east-1"}
    if key and secret:
        options.update(access_key=key, secret_key=secret, session_token=token)
    if endpoint:
        parsed = urlparse(endpoint)
        options.update(endpoint_override=parsed.netloc + parsed.path.rstrip("/"), scheme=parsed.scheme or "https")
    return pa_fs.S3FileSystem(**options)
