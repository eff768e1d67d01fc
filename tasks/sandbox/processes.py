"""The sandbox server's process chores: closing inherited descriptors, exiting a child with its status, whether
a process lives, killing a run's process group and reaping what it left, and reading a socket exactly."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time


def close_all(keep: tuple[int, ...]) -> None:
    for fd in range(3, 1024):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    try:  # a descriptor above 1023 (a leak) must not survive either
        for fd in [int(entry) for entry in os.listdir("/proc/self/fd")]:
            if fd >= 1024 and fd not in keep:
                os.close(fd)
    except OSError:
        pass


def exit_with(code: int, status_fd: int | None) -> None:
    try:
        sys.stdout.flush()
        if status_fd is not None:
            os.write(status_fd, str(code).encode())
    finally:
        os._exit(code)


def alive(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def reap(spare: tuple[int, ...], namespaces: bool, seconds: float = 2.0) -> None:
    """Collect exited children (and, as PID 1, orphans). In a PID namespace, wait until no process
    but the spared ones is left; otherwise take the zombies there are."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            while True:
                pid, _ = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
        except ChildProcessError:
            pass
        if not namespaces or not [e for e in os.listdir("/proc") if e.isdigit() and int(e) not in spare]:
            return
        time.sleep(0.0005)


def recv_exactly(connection: socket.socket, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = connection.recv(min(remaining, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the socket")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)
