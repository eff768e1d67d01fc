"""The jail the sandbox server's children run in: a private tmpfs root holding read-only, nosuid binds of the
system and of Python (`build_jail`), each candidate's own view of it (`private_view`), and the audit hook that
refuses network calls."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from tasks.sandbox import linux

JAIL = "/tmp/rlvr-jail"  # on a tmpfs mounted over /tmp in the server's own mount namespace

# What a jailed program sees of the machine: the system's libraries and Python's own, read-only.
# Not the orchestrator's files, the lake, the repository, /etc or anyone's home.
JAIL_READ_ONLY = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")
JAIL_FILES = ("/etc/ld.so.cache", "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")


def private_view(limits: dict, uid: int | None) -> str:
    """In the candidate's own mount namespace: its own /proc (its PID namespace only), a private tmpfs of
    `scratch_mb` as /tmp and working folder, and the jail's root read-only. Returns the working folder."""
    linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
    hardened = linux.MS_NOSUID | linux.MS_NODEV
    linux.mount("proc", JAIL + "/proc", "proc", hardened | linux.MS_NOEXEC)
    linux.mount("tmpfs", JAIL + "/tmp", "tmpfs", hardened, f"size={limits.get('scratch_mb', 64)}m,mode=1777")
    workdir = JAIL + "/tmp/work"
    os.mkdir(workdir, 0o700)
    if uid is not None:
        os.chown(workdir, uid, uid)
    linux.mount(None, JAIL, None, linux.MS_REMOUNT | linux.MS_BIND | linux.MS_RDONLY | hardened)
    return workdir


def empty_folder(folder: str) -> None:
    for entry in os.listdir(folder):
        path = os.path.join(folder, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass


def mount(*arguments: str) -> None:
    subprocess.run(["mount", *arguments], check=True, capture_output=True)


def build_jail() -> None:
    """A root for the children: a private tmpfs holding read-only, nosuid binds of the system and of Python."""
    mount("-t", "tmpfs", "-o", "mode=1777,size=16m", "tmpfs", "/tmp")  # nothing below is seen by the host
    os.makedirs(JAIL)
    mount("-t", "tmpfs", "-o", "mode=755,size=64m", "tmpfs", JAIL)
    python_roots = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    for source in [*JAIL_READ_ONLY, *sorted(python_roots)]:
        if not os.path.isdir(source) or any(source.startswith(r + "/") for r in JAIL_READ_ONLY):
            continue
        target = JAIL + source
        os.makedirs(target, exist_ok=True)
        mount("--rbind", source, target)
        mount("-o", "remount,bind,ro,nosuid,nodev", target)
    for source in JAIL_FILES:
        if os.path.exists(source):
            os.makedirs(os.path.dirname(JAIL + source), exist_ok=True)
            open(JAIL + source, "a").close()
            mount("--bind", source, JAIL + source)
    os.makedirs(JAIL + "/proc")
    mount("-t", "proc", "-o", "nosuid,nodev,noexec", "proc", JAIL + "/proc")
    os.makedirs(JAIL + "/tmp", mode=0o1777)
    os.chmod(JAIL + "/tmp", 0o1777)


def refuse_network(event: str, args: tuple) -> None:
    if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo"):
        raise PermissionError(f"network access is not allowed in the sandbox ({event})")
