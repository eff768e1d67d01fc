"""The sandbox server: a warm Python process that forks jailed children for each sandboxed program.

Started by `client.Sandbox` with an empty environment, as PID 1 of its own network, PID and mount
namespaces: as root (`namespaces` mode) or, without root, inside an unprivileged user namespace
(`userns` mode) where it is root of nothing but itself. No network interface is up; the children
see a root of their own (the system's libraries and Python's, read-only, nosuid) and nothing of the
orchestrator's files; every process a run leaves behind — daemons included — is killed after it.

The candidate runs in a PID and mount namespace of its own, nested in the server's: it sees no other
process (not the test runner, not this server), and a private tmpfs as its working folder and /tmp,
with the jail's root read-only. It holds no capability and can gain none. As root it also runs under
its own user id, apart from the test runner's. A run's memory (its processes and its tmpfs), process
count and CPU time are budgets of the whole run (`budget.py`).

`rlimits` mode (no namespaces) is a guard, not isolation: the client refuses it unless asked for it
explicitly (`--insecure-sandbox`).
"""

from __future__ import annotations

import functools
import json
import os
import resource
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback

from tasks.sandbox import budget, harness, linux, remote, suite
from tasks.sandbox.jail import JAIL, build_jail, empty_folder, private_view, refuse_network
from tasks.sandbox.processes import alive, close_all, exit_with, kill_group, reap, recv_exactly
from tasks.sandbox.protocol import recv_json, recv_value, send_json
from tasks.sandbox.watch import MB, Watch, readable

PRELOADED = (
    "math",
    "re",
    "collections",
    "itertools",
    "functools",
    "typing",
    "string",
    "hashlib",
    "heapq",
    "bisect",
    "random",
    "statistics",
    "fractions",
    "decimal",
    "copy",
    "json",
    "operator",
)
# Runs' user ids: far above any a distribution allocates (Debian hands out 60000-64999 to packages, rootless
# containers' subordinate ids usually start at 100000), below 2^31 for tools that read uids as signed.
UID_BASE = 2_000_000_000
UID_SLOTS = 2000  # pairs of ids; each live sandbox on the host holds one (client.claim_uid_slot)
JAILED_MODES = ("namespaces", "userns")
OWN_PROCESSES = 6  # the server's own processes a run's user id shares in userns mode
# The server recycles itself (the client starts a fresh one, no run fails) past any of these.
HEALTH_LIMITS = {"open_fds": 128, "rss_mb": 300, "leftover_processes": 0}


class Zygote:
    def __init__(self, mode: str, uid_slot: int, cgroups: dict | None = None):
        self.mode = mode
        self.jailed = mode in JAILED_MODES
        self.own_uids = mode == "namespaces" or (mode == "rlimits" and os.geteuid() == 0)
        self.cgroups = cgroups
        self.candidate_uid = UID_BASE + 2 * uid_slot  # the client draws the slot (see Sandbox.__init__)
        self.tests_uid = self.candidate_uid + 1
        for module in PRELOADED:
            __import__(module)
        if self.jailed:
            build_jail()
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
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its children are reaped by the kernel
        while True:
            message, fds, _, _ = socket.recv_fds(connection, 8, 3)
            if not message:
                return
            payload = recv_exactly(connection, int.from_bytes(message, "big"))
            job = json.loads(payload)
            if job["kind"] in ("tests", "suite"):
                request_fd, response_fd, out_fd = fds
                keep = (request_fd, response_fd)
                status_fd = None
                serve = harness.serve_candidate if job["kind"] == "tests" else remote.serve_workspace
                body = functools.partial(serve, job["program"], request_fd, response_fd)
            else:
                out_fd, status_fd = fds
                keep = (status_fd,)
                body = functools.partial(harness.run_script, job["program"])
            pid = self._fork_candidate(job["limits"], out_fd, keep, body, status_fd)
            for fd in fds:
                os.close(fd)
            connection.sendall(pid.to_bytes(8, "big"))

    def _spawn_candidate(self, kind: str, program: str | dict, limits: dict, fds: list[int]) -> int:
        """Have the template fork the program's process; returns its pid (also its process group)."""
        payload = json.dumps({"kind": kind, "program": program, "limits": limits}).encode()
        socket.send_fds(self.template_socket, [len(payload).to_bytes(8, "big")], fds)
        self.template_socket.sendall(payload)
        return int.from_bytes(recv_exactly(self.template_socket, 8), "big")

    # ---- one job ---------------------------------------------------------------------------
    def run(self, job: dict) -> dict:
        limits = job["limits"]
        started = time.monotonic()
        if self.cgroups:
            budget.set_limits(self.cgroups, limits["memory_mb"] * MB, limits["processes"] + 2)
        kills_before = budget.oom_kills(self.cgroups) if self.cgroups else 0
        try:
            if job["kind"] in ("tests", "suite"):
                result = self._run_tests(job, limits)
            else:
                result = self._run_script(job, limits)
            if self.cgroups and budget.oom_kills(self.cgroups) > kills_before:
                result["status"] = "memory_limit"
            if self.cgroups:
                peak = budget.peak_bytes(self.cgroups)
                result["peak_mb"] = None if peak is None else round(peak / MB, 1)
        finally:
            self._clean_up()
        result["seconds"] = round(time.monotonic() - started, 4)
        result["health"] = self.health({**HEALTH_LIMITS, **job.get("health_limits", {})})
        return result

    def _run_script(self, job: dict, limits: dict) -> dict:
        out_read, out_write = os.pipe()
        status_read, status_write = os.pipe()  # the child writes its exit code here; EOF if killed
        pid = self._spawn_candidate("script", job["program"], limits, [out_write, status_write])
        os.close(out_write)
        os.close(status_write)
        watch = Watch(limits, self._run_usage((pid,)))
        watch.output(out_read)
        status = watch.until(lambda: readable(status_read), extra=(status_read,))
        code = os.read(status_read, 16) if status == "ok" else b""
        os.close(status_read)
        kill_group(pid)
        return {"status": status, "exit_code": int(code) if code.strip() else None, "output": watch.text(out_read)}

    def _run_tests(self, job: dict, limits: dict) -> dict:
        request_read, request_write = os.pipe()
        response_read, response_write = os.pipe()
        result_read, result_write = os.pipe()
        out_read, out_write = os.pipe()
        program = job["program"] if job["kind"] == "tests" else job["files"]
        candidate = self._spawn_candidate(job["kind"], program, limits, [request_read, response_write, out_write])
        if job["kind"] == "tests":
            body = lambda: harness.run_tests(  # noqa: E731
                job.get("prompt", ""),
                job["tests"],
                job["entry_point"],
                request_write,
                response_read,
                result_write,
                limits.get("test_seconds"),
                job.get("stop_after_failure", False),
            )
        else:
            body = lambda: suite.run_suite(  # noqa: E731
                job["tests"],
                list(job["files"]),
                request_write,
                response_read,
                result_write,
                limits.get("test_seconds"),
                job.get("stop_after_failure", False),
                job.get("only"),
            )
        tester = self._fork_tester(limits, (request_write, response_read, result_write), body)
        for fd in (request_read, request_write, response_read, response_write, result_write, out_write):
            os.close(fd)
        watch = Watch(limits, self._run_usage((candidate,), spare=(tester,)))
        watch.output(out_read)
        report = {"total": None, "results": {}}
        try:
            status = watch.until(lambda: self._collect(result_read, report), extra=(result_read,))
        finally:
            os.close(result_read)
        results = report["results"]
        total = report["total"] or max(1, len(results))
        passed = sum(1 for ok, *_ in results.values() if ok)
        failures = [message for ok, message, *_ in results.values() if not ok][:3]
        if status == "ok" and len(results) < total:
            status = "incomplete"
        outcome = {"status": status, "passed": passed, "total": total, "failures": failures}
        if job["kind"] == "suite":  # counted before the kill: processes the candidate left running
            own = 2 if self.jailed else 1  # its own process (and, jailed, the waiter outside its namespace)
            outcome["leftover_processes"] = max(0, len(budget.descendants(candidate)) - own)
            outcome["tests"] = [
                {"name": name, "passed": ok, "message": message, "seconds": seconds}
                for _, (ok, message, name, seconds) in sorted(results.items())
            ]
        for pid in (candidate, tester):
            kill_group(pid)
        outcome["output"] = watch.text(out_read)
        return outcome

    def _collect(self, result_fd: int, report: dict) -> bool:
        """Read what the test process reported; True once it is done (or gone)."""
        while readable(result_fd):
            try:
                message = recv_value(result_fd)
            except (EOFError, ValueError):
                return True
            if message[0] == "total":
                report["total"] = message[1]
            elif message[0] == "result":
                report["results"][message[1]] = (message[2], message[3], *message[4:6])
            elif message[0] == "done":
                return True
        return False

    def _run_usage(self, first: tuple[int, ...], spare: tuple[int, ...] = ()):
        """Where no cgroup bounds the run, a function measuring (resident bytes, CPU seconds) of the run's
        processes: every process in this server's PID namespace but itself, the template and `spare`."""
        if not self.jailed:
            return None
        own = {os.getpid(), self.template_pid, *spare}
        polled_memory = self.cgroups is None

        def measure() -> tuple[int, float]:
            pids = [int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) not in own]
            resident, cpu = budget.usage(pids)
            return (resident if polled_memory else 0), cpu

        return measure

    # ---- health ----------------------------------------------------------------------------
    def health(self, limits: dict = HEALTH_LIMITS) -> dict:
        """The server's own state after a run: open descriptors, resident memory, processes left over, and
        whether any passed its limit (then it is recycled)."""
        leftovers = [e for e in os.listdir("/proc") if e.isdigit() and int(e) not in (os.getpid(), self.template_pid)]
        health = {
            "open_fds": len(os.listdir("/proc/self/fd")),
            "rss_mb": round(budget.usage([os.getpid()])[0] / MB, 1),
            "leftover_processes": len(leftovers) if self.jailed else 0,
            "template_alive": alive(self.template_pid),
        }
        health["recycle"] = (not health["template_alive"]) or any(health[k] > v for k, v in limits.items())
        return health

    # ---- the jail --------------------------------------------------------------------------
    def _fork_candidate(self, limits: dict, stdout: int, keep: tuple[int, ...], body, status_fd: int | None) -> int:
        """The candidate's process, forked by the template. In a jailed mode it makes a PID and mount
        namespace of its own and forks the program's process inside (PID 1 there), then waits for it."""
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            os.setsid()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the template ignores it; programs must not
            if self.cgroups:
                budget.join(self.cgroups)
            if self.jailed:
                linux.unshare(linux.CLONE_NEWNS | linux.CLONE_NEWPID)
                inner = os.fork()
                if inner:  # the waiter outside: nothing of the program's runs here
                    close_all(keep=())
                    _, status = os.waitpid(inner, 0)
                    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
                linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
                workdir = private_view(limits, self.candidate_uid if self.own_uids else None)
            else:
                workdir = self._workdir(self.candidate_uid)
            self._enter_jail(self.candidate_uid, workdir, limits, stdout, keep, candidate=True)
            body()
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except BaseException:  # noqa: BLE001 - the program's own failure, shown in its output
            traceback.print_exc(limit=5)
            code = 1
        finally:
            exit_with(code, status_fd)

    def _fork_tester(self, limits: dict, keep: tuple[int, ...], body) -> int:
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            os.setsid()
            self._enter_jail(self.tests_uid, self._workdir(self.tests_uid), limits, None, keep, candidate=False)
            body()
            code = 0
        except BaseException:  # noqa: BLE001
            traceback.print_exc(limit=5)
        finally:
            exit_with(code, None)

    def _workdir(self, uid: int) -> str:
        workdir = tempfile.mkdtemp(dir=self.scratch)
        if self.own_uids:
            os.chown(workdir, uid, uid)
        return workdir

    def _enter_jail(
        self, uid: int, workdir: str, limits: dict, stdout: int | None, keep: tuple[int, ...], candidate: bool
    ) -> None:
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(stdout if stdout is not None else devnull, 1)
        os.dup2(stdout if stdout is not None else devnull, 2)
        close_all(keep)  # nothing of the server's survives but the job's own pipes
        if self.jailed:
            os.chroot(JAIL)
            workdir = workdir[len(JAIL) :] if workdir.startswith(JAIL) else workdir
        os.chdir(workdir)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))
        memory = limits["memory_mb"] * MB
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        file_size = limits["file_size_mb"] * MB
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))
        if candidate:  # its first process counts; in userns mode so do the server's own
            allowance = limits["processes"] + (2 if self.own_uids else OWN_PROCESSES)
            resource.setrlimit(resource.RLIMIT_NPROC, (allowance, allowance))
        if self.jailed:
            linux.drop_privileges(uid if self.own_uids else None)
        elif self.own_uids:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        os.umask(0o077)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8", "TMPDIR": workdir})
        if not self.jailed:
            sys.addaudithook(refuse_network)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)

    def _clean_up(self) -> None:
        """Kill whatever the run left behind and remove every file it wrote."""
        if self.jailed:
            for entry in os.listdir("/proc"):
                if entry.isdigit() and int(entry) not in (os.getpid(), self.template_pid):
                    try:
                        os.kill(int(entry), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        reap((os.getpid(), self.template_pid), self.jailed)
        if self.jailed:  # everything else a run can write lives under the jail's /tmp
            empty_folder(os.path.join(JAIL, "tmp"))
        else:
            shutil.rmtree(self.scratch, ignore_errors=True)
        os.makedirs(self.scratch, exist_ok=True)


def main() -> None:
    mode, uid_slot = sys.argv[1], int(sys.argv[2])
    cgroups = json.loads(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] != "null" else None
    zygote = Zygote(mode, uid_slot, cgroups)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    requests, replies = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # stray prints must not corrupt the protocol
    send_json(replies, {"ready": True, "isolation": mode, "pid": os.getpid(), "health": zygote.health()})
    try:
        while True:
            job = recv_json(requests)
            if job is None:
                return
            result = zygote.run(job)
            send_json(replies, result)
            if result["health"]["recycle"]:  # the client starts a fresh server for the next job
                return
    finally:
        if not zygote.jailed:
            shutil.rmtree(zygote.scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
