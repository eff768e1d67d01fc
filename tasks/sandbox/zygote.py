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

import json
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

from tasks.sandbox import harness
from tasks.sandbox.protocol import recv_json, recv_value, send_json

JAIL = "/tmp/rlvr-jail"          # on a tmpfs mounted over /tmp in the server's own mount namespace
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
        self._start_template()

    def _start_template(self) -> None:
        """Fork the process that forks candidates, now, while this one has seen no test.

        Programs under test are forked from it, never from this server: a fork copies memory, and
        this server's memory holds the tests of this job and the remains of earlier ones.
        """
        self.template_socket, child_socket = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.template_pid = os.fork()
        if self.template_pid == 0:
            self.template_socket.close()
            try:
                self._template_loop(child_socket)
            finally:
                os._exit(0)
        child_socket.close()

    def _template_loop(self, connection: socket.socket) -> None:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)        # its children are reaped by the kernel
        while True:
            message, fds, _, _ = socket.recv_fds(connection, 8, 3)
            if not message:
                return
            payload = _recv_exactly(connection, int.from_bytes(message, "big"))
            job = json.loads(payload)
            if job["kind"] == "tests":
                request_fd, response_fd, out_fd = fds
                keep = (request_fd, response_fd)
                body = lambda: harness.serve_candidate(job["program"], request_fd, response_fd)  # noqa: E731
            else:
                out_fd, status_fd = fds
                keep = (status_fd,)
                body = lambda: harness.run_script(job["program"])  # noqa: E731
            pid = self._fork_jailed(self.candidate_uid, job["workdir"], job["limits"], out_fd, keep, body,
                                    status_fd=None if job["kind"] == "tests" else fds[1])
            for fd in fds:
                os.close(fd)
            connection.sendall(pid.to_bytes(8, "big"))

    def _spawn_candidate(self, kind: str, program: str, limits: dict, fds: list[int]) -> int:
        """Have the template fork the program's process; returns its pid (also its process group)."""
        workdir = self._workdir(self.candidate_uid)
        payload = json.dumps({"kind": kind, "program": program, "limits": limits, "workdir": workdir}).encode()
        socket.send_fds(self.template_socket, [len(payload).to_bytes(8, "big")], fds)
        self.template_socket.sendall(payload)
        return int.from_bytes(_recv_exactly(self.template_socket, 8), "big")

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
        status_read, status_write = os.pipe()        # the child writes its exit code here; EOF if killed
        pid = self._spawn_candidate("script", job["program"], limits, [out_write, status_write])
        os.close(out_write)
        os.close(status_write)
        watch = _Watch(limits)
        watch.output(out_read)
        status = watch.until(lambda: bool(select.select([status_read], [], [], 0)[0]), extra=(status_read,))
        code = os.read(status_read, 16) if status == "ok" else b""
        os.close(status_read)
        _kill_group(pid)
        return {"status": status, "exit_code": int(code) if code else None, "output": watch.text(out_read)}

    def _run_tests(self, job: dict, limits: dict) -> dict:
        request_read, request_write = os.pipe()
        response_read, response_write = os.pipe()
        result_read, result_write = os.pipe()
        out_read, out_write = os.pipe()
        candidate = self._spawn_candidate("tests", job["program"], limits, [request_read, response_write, out_write])
        tester = self._fork_jailed(self.tests_uid, self._workdir(self.tests_uid), limits, None,
                                   (request_write, response_read, result_write),
                                   lambda: harness.run_tests(job.get("prompt", ""), job["tests"], job["entry_point"],
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
    def _workdir(self, uid: int) -> str:
        workdir = tempfile.mkdtemp(dir=self.scratch)
        if self.root:
            os.chown(workdir, uid, uid)
        return workdir

    def _fork_jailed(self, uid: int, workdir: str, limits: dict, stdout: int | None, keep: tuple[int, ...], body,
                     status_fd: int | None = None) -> int:
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:                                   # the child: never returns into its parent's loop
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
                if status_fd is not None:
                    os.write(status_fd, str(code).encode())
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
                if entry.isdigit() and int(entry) not in (os.getpid(), self.template_pid):
                    try:
                        os.kill(int(entry), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        _reap((os.getpid(), self.template_pid), self.namespaces)
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


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(spare: tuple[int, ...], namespaces: bool, seconds: float = 2.0) -> None:
    """Collect exited children (and, as PID 1, orphans). In a PID namespace, wait until no process
    but the spared ones is left; otherwise take the zombies there are."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        if not namespaces or not [e for e in os.listdir("/proc") if e.isdigit() and int(e) not in spare]:
            return
        time.sleep(0.0005)


def _recv_exactly(connection: socket.socket, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = connection.recv(min(remaining, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the socket")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


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
    _mount("-t", "tmpfs", "-o", "mode=1777,size=16m", "tmpfs", "/tmp")      # nothing below is seen by the host
    os.makedirs(JAIL)
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
    try:
        while True:
            job = recv_json(requests)
            if job is None:
                return
            send_json(replies, zygote.run(job))
    finally:
        if not zygote.namespaces:
            shutil.rmtree(zygote.scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
