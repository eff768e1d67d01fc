"""One run's memory, processes and CPU, bounded as a whole.

With root and a cgroup hierarchy that accepts children (v2, or v1's `memory` and `pids` controllers),
the orchestrator's client makes one cgroup per sandbox server, and each run's candidate processes
join it: the kernel then caps the memory of all of them together, tmpfs pages they write included,
and their number. Without cgroups (no root, or a host that refuses), the server polls the run's
processes (`usage`) and stops the run when their summed resident memory or CPU time passes the
budget; each process is also held to `memory_mb` of address space, and the run's private tmpfs has
a fixed size, so the sum stays within the budget up to what one poll interval lets through.
Standard library only.
"""

from __future__ import annotations

import os
import time

CGROUP_ROOT = "/sys/fs/cgroup"
PREFIX = "rlvr-sandbox-"
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICKS = os.sysconf("SC_CLK_TCK")


# ---- the client's side: one cgroup (set) per sandbox server ------------------------------------------------
def create_cgroups(name: str) -> dict | None:
    """A cgroup for one sandbox server's runs under this process's own cgroup, or None where that is not
    possible (not root, no writable hierarchy). v2 where its memory and pids controllers are delegated,
    else v1's memory and pids hierarchies."""
    if os.geteuid() != 0:
        return None
    for make in (_create_v2, _create_v1):
        try:
            groups = make(PREFIX + name)
        except OSError:
            continue
        if groups is not None:
            _reap_stale(groups)
            return groups
    return None


def _own_path(controller: str) -> str | None:
    for line in open("/proc/self/cgroup"):
        _, controllers, path = line.rstrip("\n").split(":", 2)
        if controller in controllers.split(","):
            return path
    return None


def _create_v2(name: str) -> dict | None:
    path = _own_path("")
    base = os.path.join(CGROUP_ROOT, (path or "/").lstrip("/"))
    if path is None or not os.path.exists(os.path.join(base, "cgroup.subtree_control")):
        return None
    enabled = open(os.path.join(base, "cgroup.subtree_control")).read().split()
    if not {"memory", "pids"} <= set(enabled):
        return None
    group = os.path.join(base, name)
    os.makedirs(group, exist_ok=True)
    return {"version": 2, "memory": group, "pids": group}


def _create_v1(name: str) -> dict | None:
    groups = {"version": 1}
    for controller in ("memory", "pids"):
        path = _own_path(controller)
        mount = os.path.join(CGROUP_ROOT, controller)
        if path is None or not os.path.exists(os.path.join(mount, "cgroup.procs")):
            return None
        group = os.path.join(mount, path.lstrip("/"), name)
        os.makedirs(group, exist_ok=True)
        groups[controller] = group
    probe = os.path.join(groups["memory"], "memory.limit_in_bytes")
    with open(probe, "w") as handle:  # a hierarchy that refuses limits is no use
        handle.write(str(1 << 40))
    return groups


def remove_cgroups(groups: dict | None) -> None:
    if not groups:
        return
    for path in {groups["memory"], groups["pids"]}:
        for _ in range(50):
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError:  # its last processes are still exiting
                time.sleep(0.02)


def _reap_stale(groups: dict) -> None:
    """Remove empty sibling cgroups of dead clients (a client killed before it could remove its own)."""
    for path in {groups["memory"], groups["pids"]}:
        parent = os.path.dirname(path)
        for entry in os.listdir(parent):
            if not entry.startswith(PREFIX):
                continue
            owner = entry[len(PREFIX) :].split("-", 1)[0]
            if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
                try:
                    os.rmdir(os.path.join(parent, entry))
                except OSError:
                    pass


# ---- the server's side ------------------------------------------------------------------------------------
def _write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def set_limits(groups: dict, memory_bytes: int, processes: int) -> None:
    """Apply a run's limits to the (empty) cgroup, and reset its peak and OOM counters' baseline."""
    if groups["version"] == 2:
        _write(os.path.join(groups["memory"], "memory.max"), str(memory_bytes))
        swap = os.path.join(groups["memory"], "memory.swap.max")
        if os.path.exists(swap):
            _write(swap, "0")
        _write(os.path.join(groups["pids"], "pids.max"), str(processes))
        return
    memory = groups["memory"]
    memsw = os.path.join(memory, "memory.memsw.limit_in_bytes")
    if os.path.exists(memsw):
        _write(memsw, "-1")  # memsw ≥ limit at every step
    _write(os.path.join(memory, "memory.limit_in_bytes"), str(memory_bytes))
    if os.path.exists(memsw):
        _write(memsw, str(memory_bytes))  # no swap beyond the limit either
    _write(os.path.join(memory, "memory.max_usage_in_bytes"), "0")
    _write(os.path.join(groups["pids"], "pids.max"), str(processes))


def join(groups: dict) -> None:
    """Move the calling process (and so everything it forks) into the run's cgroup."""
    for path in {groups["memory"], groups["pids"]}:
        _write(os.path.join(path, "cgroup.procs"), str(os.getpid()))


def oom_kills(groups: dict) -> int:
    """How many processes the kernel has killed in this cgroup for passing its memory limit, so far."""
    name = "memory.events" if groups["version"] == 2 else "memory.oom_control"
    try:
        for line in open(os.path.join(groups["memory"], name)):
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except OSError:
        pass
    return 0


def peak_bytes(groups: dict) -> int | None:
    name = "memory.peak" if groups["version"] == 2 else "memory.max_usage_in_bytes"
    try:
        return int(open(os.path.join(groups["memory"], name)).read())
    except (OSError, ValueError):
        return None


def usage(pids: list[int]) -> tuple[int, float]:
    """(summed resident bytes, summed CPU seconds) of these processes; those already gone count 0."""
    resident, cpu = 0, 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as handle:
                resident += int(handle.read().split()[1]) * _PAGE
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / _TICKS
        except (OSError, IndexError, ValueError):
            continue
    return resident, cpu


def descendants(root: int) -> list[int]:
    """`root` and every live process below it (children, theirs, ...), from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        found.append(pid)
        frontier.extend(children.get(pid, []))
    return [pid for pid in found if os.path.exists(f"/proc/{pid}")]
