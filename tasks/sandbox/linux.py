"""The Linux system calls the jail needs and Python 3.11 does not expose: unshare, mount, umount,
prctl, capset. Standard library only (the sandbox server imports nothing else)."""

from __future__ import annotations

import ctypes
import os

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
# root gets no capabilities back by exec or setuid, and that cannot be undone
SECURE_NO_ROOT = 0b101111  # NOROOT, NOROOT_LOCKED, NO_SETUID_FIXUP, NO_SETUID_FIXUP_LOCKED, KEEP_CAPS_LOCKED

_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int = 0, data: str | None = None) -> None:
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    _check(
        _libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)),
        f"mount {target}",
    )


def prctl(option: int, argument: int = 0) -> None:
    _check(
        _libc.prctl(
            ctypes.c_int(option), ctypes.c_ulong(argument), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)
        ),
        f"prctl {option}",
    )


def drop_privileges(uid: int | None) -> None:
    """Lose every capability for good, and become `uid` (None: stay the same user): the bounding and
    ambient sets emptied, root's exec and setuid privileges switched off and locked, no new privileges
    from any exec (setuid binaries, file capabilities), then the effective, permitted and inheritable
    sets cleared."""
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for capability in range(last + 1):
        prctl(PR_CAPBSET_DROP, capability)
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    prctl(PR_SET_SECUREBITS, SECURE_NO_ROOT)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def effective_capabilities() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0
