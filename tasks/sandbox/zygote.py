"""The sandbox server: a warm Python process that forks one jailed child per sandboxed program.

Started by `client.Sandbox`, with an empty environment. Where it can (root, util-linux `unshare`),
it runs as PID 1 of its own network, PID and mount namespaces: no network interface is up, the
world-writable folders (/tmp, /var/tmp, /dev/shm, /run/lock) are private tmpfs mounts wiped after
each run, and every process a run leaves behind — daemons included — is killed after it, since
they all live in this PID namespace. Children drop to unprivileged user ids (one for the
candidate, another for the tests), so they cannot signal this server, read each other's memory,
or read the orchestrator's private files.

Without namespaces (not root) the same jail is applied minus those three namespaces, and a
Python audit hook refuses socket connections: a guard, not isolation (see the README).
"""

from __future__ import annotations

import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

from tasks.sandbox import harness
from tasks.sandbox.protocol import recv_json, recv_value, send_json

JAIL = "/run/rlvr-jail"
# What a jailed program sees of the machine: the system's libraries and Python's own, read-only.
# Not the orchestrator's files, the lake, the repository, /etc or anyone's home.
JAIL_READ_ONLY = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")
JAIL_FILES = ("/etc/ld.so.cache", "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
PRELOADED = ("math", "re", "collections", "itertools", "functools", "typing", "string", "hashlib", "heapq",
             "bisect", "random", "statistics", "fractions", "decimal", "copy", "json", "operator")
UID_BASE = 61000


class Zygote:
    def __init__(self, worker: int, namespaces: bool):
        self.namespaces = namespaces
        self.root = os.geteuid() == 0
        self.candidate_uid = UID_BASE + 2 * worker
        self.tests_uid = UID_BASE + 2 * worker + 1
        for module in PRELOADED:
            __import__(module)
        if namespaces:
            _build_jail()
            self.scratch = os.path.join(JAIL, "tmp", "runs")
            os.makedirs(self.scratch)
        else:
            self.scratch = tempfile.mkdtemp(prefix="rlvr-sandbox-")

    # ---- one job ---------------------------------------------------------------------------
    def run(self, job: dict) -> dict:
        limits = job["limits"]
        started = time.monotonic()
        try:
            if job["kind"] == "tests":
                result = self._run_tests(job, limits)
            else:
                result = self._run_script(job, limits)
        finally:
            self._clean_up()
        result["seconds"] = round(time.monotonic() - started, 4)
        return result

    def _run_script(self, job: dict, limits: dict) -> dict:
        out_read, out_write = os.pipe()
        pid = self._spawn(self.candidate_uid, limits, stdout=out_write, keep=(),
                          body=lambda: harness.run_script(job["program"]))
        os.close(out_write)
        watch = _Watch(limits)
        watch.output(out_read)
        status = watch.until(lambda: _exited(pid))
        exit_code = _wait_exit(pid) if status == "ok" else None
        return {"status": status, "exit_code": exit_code, "output": watch.text(out_read)}

    def _run_tests(self, job: dict, limits: dict) -> dict:
        request_read, request_write = os.pipe()
        response_read, response_write = os.pipe()
        result_read, result_write = os.pipe()
        out_read, out_write = os.pipe()
        candidate = self._spawn(self.candidate_uid, limits, stdout=out_write, keep=(request_read, response_write),
                                body=lambda: harness.serve_candidate(job["program"], request_read, response_write))
        tester = self._spawn(self.tests_uid, limits, stdout=None, keep=(request_write, response_read, result_write),
                             body=lambda: harness.run_tests(job.get("prompt", ""), job["tests"], job["entry_point"],
                                                            request_write, response_read, result_write))
        for fd in (request_read, request_write, response_read, response_write, result_write, out_write):
            os.close(fd)
        watch = _Watch(limits)
        watch.output(out_read)
        report = {"total": None, "results": {}}
        status = watch.until(lambda: self._collect(result_read, report), extra=(result_read,))
        results = report["results"]
        total = report["total"] or max(1, len(results))
        passed = sum(1 for ok, _ in results.values() if ok)
        failures = [message for ok, message in results.values() if not ok][:3]
        if status == "ok" and len(results) < total:
            status = "incomplete"
        for pid in (candidate, tester):
            _kill_group(pid)
        return {"status": status, "passed": passed, "total": total, "failures": failures,
                "output": watch.text(out_read)}

    def _collect(self, result_fd: int, report: dict) -> bool:
        """Read what the test process reported; True once it is done (or gone)."""
        while select.select([result_fd], [], [], 0)[0]:
            try:
                message = recv_value(result_fd)
            except (EOFError, ValueError):
                return True
            if message[0] == "total":
                report["total"] = message[1]
            elif message[0] == "result":
                report["results"][message[1]] = (message[2], message[3])
            elif message[0] == "done":
                return True
        return False

    # ---- the jail --------------------------------------------------------------------------
    def _spawn(self, uid: int, limits: dict, stdout: int | None, keep: tuple[int, ...], body) -> int:
        workdir = tempfile.mkdtemp(dir=self.scratch)
        if self.root:
            os.chown(workdir, uid, uid)
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:                                   # the child: never returns into the server's loop
            self._enter_jail(uid, workdir, limits, stdout, keep)
            body()
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except BaseException:                  # noqa: BLE001 - the program's own failure, shown in its output
            traceback.print_exc(limit=5)
            code = 1
        finally:
            try:
                sys.stdout.flush()
            finally:
                os._exit(code)

    def _enter_jail(self, uid: int, workdir: str, limits: dict, stdout: int | None, keep: tuple[int, ...]) -> None:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(stdout if stdout is not None else devnull, 1)
        os.dup2(stdout if stdout is not None else devnull, 2)
        for fd in range(3, 1024):              # nothing of the server's survives but the job's own pipes
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        if self.namespaces:
            os.chroot(JAIL)
            workdir = workdir[len(JAIL):]
        os.chdir(workdir)
        mb = 1024 * 1024
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mb, limits["memory_mb"] * mb))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_mb"] * mb, limits["file_size_mb"] * mb))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"], limits["processes"]))
        if self.root:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        os.umask(0o077)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8", "TMPDIR": workdir})
        if not self.namespaces:
            sys.addaudithook(_refuse_network)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)

    def _clean_up(self) -> None:
        """Kill whatever the run left behind and remove every file it wrote."""
        if self.namespaces:
            for entry in os.listdir("/proc"):
                if entry.isdigit() and int(entry) != os.getpid():
                    try:
                        os.kill(int(entry), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        _reap()
        if self.namespaces:                    # everything a run can write lives under the jail's /tmp
            _empty_folder(os.path.join(JAIL, "tmp"))
        else:
            shutil.rmtree(self.scratch, ignore_errors=True)
        os.makedirs(self.scratch, exist_ok=True)


class _Watch:
    """Collects a child's output up to the limit while waiting, and enforces the wall clock."""

    def __init__(self, limits: dict):
        self.deadline = time.monotonic() + limits["wall_seconds"]
        self.limit = limits["output_bytes"]
        self.buffers: dict[int, bytearray] = {}
        self.open: set[int] = set()

    def output(self, fd: int) -> None:
        self.buffers[fd] = bytearray()
        self.open.add(fd)

    def until(self, finished, extra: tuple[int, ...] = ()) -> str:
        while True:
            if finished():
                self._drain()
                return "ok"
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            ready = select.select(list(self.open) + list(extra), [], [], min(remaining, 0.05))[0]
            for fd in ready:
                if fd in self.open and not self._read(fd):
                    return "output_limit"

    def _read(self, fd: int) -> bool:
        chunk = os.read(fd, 65536)
        if not chunk:
            self.open.discard(fd)
            return True
        self.buffers[fd] += chunk
        return len(self.buffers[fd]) <= self.limit

    def _drain(self) -> None:
        for fd in list(self.open):
            while select.select([fd], [], [], 0)[0]:
                if not os.read(fd, 65536):
                    break

    def text(self, fd: int) -> str:
        os.close(fd)
        return bytes(self.buffers[fd][: min(len(self.buffers[fd]), 4000)]).decode("utf-8", "replace")


_EXIT_CODES: dict[int, int] = {}


def _exited(pid: int) -> bool:
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    if done:
        _EXIT_CODES[pid] = os.waitstatus_to_exitcode(status)
    return bool(done)


def _wait_exit(pid: int) -> int | None:
    return _EXIT_CODES.pop(pid, None)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(seconds: float = 1.0) -> None:
    """Collect exited children (and, as PID 1, orphans) for up to `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.001)


def _empty_folder(folder: str) -> None:
    for entry in os.listdir(folder):
        path = os.path.join(folder, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass


def _mount(*arguments: str) -> None:
    subprocess.run(["mount", *arguments], check=True, capture_output=True)


def _build_jail() -> None:
    """A root for the children: a private tmpfs holding read-only binds of the system and of Python."""
    os.makedirs(JAIL, exist_ok=True)
    _mount("-t", "tmpfs", "-o", "mode=755,size=512m", "tmpfs", JAIL)
    python_roots = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    for source in [*JAIL_READ_ONLY, *sorted(python_roots)]:
        if not os.path.isdir(source) or any(source.startswith(r + "/") for r in JAIL_READ_ONLY):
            continue
        target = JAIL + source
        os.makedirs(target, exist_ok=True)
        _mount("--bind", source, target)
        _mount("-o", "remount,bind,ro", target)
    for source in JAIL_FILES:
        if os.path.exists(source):
            os.makedirs(os.path.dirname(JAIL + source), exist_ok=True)
            open(JAIL + source, "a").close()
            _mount("--bind", source, JAIL + source)
    os.makedirs(JAIL + "/proc")
    _mount("-t", "proc", "proc", JAIL + "/proc")
    os.makedirs(JAIL + "/tmp", mode=0o1777)
    os.chmod(JAIL + "/tmp", 0o1777)


def _refuse_network(event: str, args: tuple) -> None:
    if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo"):
        raise PermissionError(f"network access is not allowed in the sandbox ({event})")


def main() -> None:
    worker, mode = int(sys.argv[1]), sys.argv[2]
    zygote = Zygote(worker, namespaces=mode == "namespaces")
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    requests, replies = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)      # stray prints must not corrupt the protocol
    send_json(replies, {"ready": True, "isolation": mode, "pid": os.getpid()})
    while True:
        job = recv_json(requests)
        if job is None:
            return
        send_json(replies, zygote.run(job))


if __name__ == "__main__":
    main()
