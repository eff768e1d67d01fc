"""Length-prefixed messages over pipes: JSON between the orchestrator and the sandbox server,
`marshal` (builtin types only, so no object can fake equality) between the test runner and the
candidate process."""

from __future__ import annotations

import json
import marshal
import os
import struct

_HEADER = struct.Struct(">I")
MAX_MESSAGE = 64 * 1024 * 1024


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, remaining = [], size
    while remaining:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def send_bytes(fd: int, payload: bytes) -> None:
    data = _HEADER.pack(len(payload)) + payload
    while data:
        written = os.write(fd, data)
        data = data[written:]


def recv_bytes(fd: int) -> bytes | None:
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_MESSAGE:
        raise ValueError(f"message of {size} bytes exceeds {MAX_MESSAGE}")
    return _read_exactly(fd, size)


def send_json(fd: int, message: dict) -> None:
    send_bytes(fd, json.dumps(message).encode())


def recv_json(fd: int) -> dict | None:
    payload = recv_bytes(fd)
    return None if payload is None else json.loads(payload)


def send_value(fd: int, value: object) -> None:
    send_bytes(fd, marshal.dumps(value))


def recv_value(fd: int) -> object:
    payload = recv_bytes(fd)
    if payload is None:
        raise EOFError("the other side closed the pipe")
    return marshal.loads(payload)
