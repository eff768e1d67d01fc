"""Small objects kept beside the tables: leases, process records, checkpoint claims.

They live under `_rlvr/` at the lake root (Delta ignores folders it did not write) and need one
conditional write, create-if-absent: the same primitive Delta's own commits rely on (an atomic
hard link on local disk, `If-None-Match: *` on S3), so local lakes and S3 lakes behave alike.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
import time
from typing import Any

from storage.location import LakeLocation

CONTROL = "_rlvr"


def object_path(location: LakeLocation, *parts: str) -> str:
    """The filesystem path (no `s3://`) of an object under the lake's control folder."""
    return location.path(CONTROL, *parts).removeprefix("s3://")


def put_if_absent(location: LakeLocation, parts: tuple[str, ...], value: dict[str, Any]) -> bool:
    """Create the object with `value` as JSON; False (and nothing written) if it already exists."""
    return create_new(location, object_path(location, *parts), value)


def create_new(location: LakeLocation, path: str, value: dict[str, Any]) -> bool:
    """Create the file at `path` (a path in the lake's filesystem) unless it exists: the conditional write."""
    data = json.dumps(value, sort_keys=True, default=str).encode()
    if location.is_s3:
        try:
            with location.filesystem.open(path, "xb") as handle:
                handle.write(data)
        except FileExistsError:
            return False
        return True
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    staged = _staged_file(folder, data)
    try:
        os.link(staged, path)  # atomic, and refuses an existing name: the object appears whole or not at all
    except FileExistsError:
        return False
    finally:
        os.unlink(staged)
    return True


def put(location: LakeLocation, parts: tuple[str, ...], value: dict[str, Any]) -> None:
    """Create or overwrite the object (readers see the old or the new content, never a mix)."""
    path, data = object_path(location, *parts), json.dumps(value, sort_keys=True, default=str).encode()
    if location.is_s3:
        location.filesystem.pipe_file(path, data)
        return
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    os.replace(_staged_file(folder, data), path)


def get(location: LakeLocation, parts: tuple[str, ...]) -> dict[str, Any] | None:
    """The object's JSON, or None when it does not exist (or was half-written by an older version).

    One whole-object read (`cat_file`: a single GET on S3). s3fs's `open` reads in ranges pinned to the
    ETag it saw first, and fails with EBUSY when another process rewrites the object in between (a
    heartbeat does, every few seconds); a read that still meets a rewrite is tried again."""
    path = object_path(location, *parts)
    for attempt in range(5):
        try:
            return json.loads(location.filesystem.cat_file(path))
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        except OSError as error:
            if error.errno != errno.EBUSY or attempt == 4:
                raise
            time.sleep(0.05 * (attempt + 1))
    return None


def names(location: LakeLocation, parts: tuple[str, ...]) -> list[str]:
    """The object names directly under a folder, sorted; empty when it does not exist."""
    folder = object_path(location, *parts)
    fs = location.filesystem
    fs.invalidate_cache(folder)  # s3fs caches listings
    try:
        listed = [path.rstrip("/").rsplit("/", 1)[-1] for path in fs.ls(folder, detail=False)]
    except FileNotFoundError:
        return []
    return sorted(name for name in listed if not name.startswith(".staged-"))


def delete(location: LakeLocation, parts: tuple[str, ...]) -> None:
    try:
        location.filesystem.rm_file(object_path(location, *parts))
    except FileNotFoundError:
        pass


def _staged_file(folder: str, data: bytes) -> str:
    handle, staged = tempfile.mkstemp(dir=folder, prefix=".staged-")
    with os.fdopen(handle, "wb") as out:
        out.write(data)
    return staged
