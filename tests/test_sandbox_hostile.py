"""The hostile-program suite (`hostile_programs.py`), in every isolation mode this host offers.

Every program scores 0, its sandbox server survives, no process of that sandbox is left, and no
file it tried to plant exists. Modes: `namespaces` (root), `userns` started by root, and `userns`
started by an unprivileged user (the tests drop to `nobody` with setpriv, reaching this Python
through a bind mount in a mount namespace of their own). Each test looks only at its own sandbox's
processes, so two suites can share a host.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from bench.hostile_programs import HOSTILE, REPO, planted_files, score_all
from tasks.sandbox import client
from tasks.sandbox.client import Sandbox, SandboxUnavailable
from tasks.sandbox.limits import SandboxLimits
from tasks.sandbox.zygote import UID_BASE, UID_SLOTS

LIMITS = SandboxLimits(
    cpu_seconds=2, wall_seconds=4, test_seconds=1.5, memory_mb=512, processes=16, output_bytes=200_000
)
NOBODY = 65534


def _works(prefix: list[str]) -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run([*prefix, "true"], capture_output=True, timeout=30).returncode == 0


ROOT = os.geteuid() == 0
MODES = [m for m in ("namespaces", "userns") if (m != "namespaces" or ROOT) and _works(client.PREFIXES[m])]
UNPRIVILEGED = ROOT and "userns" in MODES and shutil.which("setpriv") is not None
ALL_MODES = MODES + (["userns as nobody"] if UNPRIVILEGED else [])


def _serve(server: socket.socket, secret: str, stop: threading.Event) -> None:
    server.settimeout(0.2)
    while not stop.is_set():
        try:
            connection, _ = server.accept()
        except OSError:
            continue
        connection.sendall(secret.encode())
        connection.close()


@pytest.fixture(scope="module")
def context():
    """The secrets and servers a successful attack would reach: a TCP port and unix sockets on the host
    that hand out the secret, a secret file only the orchestrator may read."""
    secret, marker = "s3cr3t-" + uuid.uuid4().hex, "rlvr-hostile-" + uuid.uuid4().hex[:8]
    folder = Path(tempfile.mkdtemp(prefix="rlvr-hostile-"))
    tcp, abstract, unix = socket.socket(), socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    tcp.bind(("127.0.0.1", 0))
    abstract_name = "rlvr-hostile-" + uuid.uuid4().hex
    abstract.bind("\0" + abstract_name)
    socket_path = str(folder / "answer.sock")
    unix.bind(socket_path)
    os.chmod(socket_path, 0o777)
    os.chmod(folder, 0o755)  # the unprivileged orchestrator reaches it; the sandbox must not
    stop = threading.Event()
    threads = []
    for server in (tcp, abstract, unix):
        server.listen()
        threads.append(threading.Thread(target=_serve, args=(server, secret, stop), daemon=True))
        threads[-1].start()
    yield {
        "secret": secret,
        "hidden": "hidden-" + uuid.uuid4().hex[:12],
        "marker": marker,
        "port": tcp.getsockname()[1],
        "abstract": abstract_name,
        "socket_path": socket_path,
        "readme_line": open(Path(REPO) / "README.md").readline(),
        "limits": LIMITS.to_dict(),
        "folder": str(folder),
    }
    stop.set()
    for thread in threads:
        thread.join(2)
    for server in (tcp, abstract, unix):
        server.close()
    shutil.rmtree(folder, ignore_errors=True)


def _secret_file(context: dict, owner: int | None) -> str:
    """A file only the orchestrator can read: in root's home (0600), or for the unprivileged run a folder
    of its own (0700)."""
    folder = Path(tempfile.mkdtemp(dir=os.path.expanduser("~") if owner is None else context["folder"]))
    path = folder / "credentials"
    path.write_text(context["secret"])
    path.chmod(0o600)
    if owner is not None:
        os.chown(folder, owner, owner)
        os.chown(path, owner, owner)
    folder.chmod(0o700)
    return str(path)


def run_unprivileged(flag: str, arguments: list[str], stdin: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `python FLAG ARGUMENTS...` (-m module or -c code) as nobody with no capabilities. This Python lives under root's home, which nobody may
    not enter, so a mount namespace of the test's own binds it at a world-readable folder first."""
    mount_point = tempfile.mkdtemp(prefix="rlvr-python-")
    os.chmod(mount_point, 0o755)
    site = [p for p in sys.path if p.endswith("site-packages")]
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/nonexistent",
        "PYTHONPATH": os.pathsep.join([REPO, *site]),
    }
    try:
        return subprocess.run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                'mount --bind "$1" "$2" && shift 2 && exec setpriv --reuid=65534 --regid=65534 --clear-groups '
                '--inh-caps=-all --bounding-set=-all "$@"',
                "sh",
                sys.base_prefix,
                mount_point,
                f"{mount_point}/bin/python3",
                flag,
                *arguments,
            ],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    finally:
        os.rmdir(mount_point)


@pytest.fixture(scope="module")
def outcomes(context):
    """Every hostile program scored once per mode: {mode: {case: outcome}}, computed on first use."""
    cache: dict[str, dict] = {}

    def of(mode: str) -> dict:
        if mode not in cache:
            if mode == "userns as nobody":
                request = {**context, "secret_path": _secret_file(context, NOBODY)}
                done = run_unprivileged(
                    "-m", ["bench.hostile_programs", "userns"], json.dumps({"context": request, "names": list(HOSTILE)})
                )
                assert done.returncode == 0, done.stderr[-3000:]
                cache[mode] = json.loads(done.stdout.strip().splitlines()[-1])
            else:
                os.environ["RLVR_HOSTILE_SECRET"] = context["secret"]  # in the orchestrator's environment
                try:
                    cache[mode] = score_all(
                        mode, {**context, "secret_path": _secret_file(context, None)}, list(HOSTILE)
                    )
                finally:
                    os.environ.pop("RLVR_HOSTILE_SECRET", None)
        return cache[mode]

    return of


@pytest.mark.parametrize("name", list(HOSTILE))
@pytest.mark.parametrize("mode", ALL_MODES)
def test_hostile_program_is_contained(mode, name, outcomes, context):
    outcome = outcomes(mode)[name]
    assert outcome["reward"] == 0.0 and outcome["correct"] is False, outcome
    assert not outcome["server_replaced"] and outcome["crashes"] == 0, outcome
    assert outcome["leftovers"] == 0, outcome
    assert outcome["planted"] == [] and planted_files(context["marker"]) == []
    assert outcome["isolation"] == mode.split()[0]


def test_the_suite_is_large_enough():
    assert len(HOSTILE) >= 40
    assert len(ALL_MODES) >= (3 if ROOT else 1)  # root hosts check all three modes


@pytest.mark.parametrize("mode", MODES)
def test_deadlines_end_a_run_early(mode, outcomes):
    """A program that answers each test after its deadline costs one deadline: the rest fail at once."""
    outcome = outcomes(mode)["sleep past each test's deadline, then answer right"]
    assert outcome["failures"][0] == f"CandidateTimeout: timed out after {LIMITS.test_seconds:g} s"
    assert outcome["seconds"] < 2 * LIMITS.test_seconds


@pytest.mark.parametrize("mode", MODES)
def test_an_honest_program_passes_in_every_mode(mode):
    from tasks.verifiers.code import CodeVerifier

    verifier = CodeVerifier(limits=LIMITS, _sandbox=Sandbox(isolation=mode, limits=LIMITS))
    try:
        verdict = verifier.verify(
            {"prompt": "", "tests": "assert solve(2) == 4\nassert solve(3) == 9\n", "entry_point": "solve"},
            "import math\ndef solve(x):\n    return int(math.pow(x, 2))\n",
        )
    finally:
        verifier.close()
    assert verdict.reward == 1.0 and verdict.correct and verdict.details["isolation"] == mode


@pytest.mark.parametrize("mode", MODES)
def test_the_sandbox_has_no_network_and_sees_no_other_process(mode):
    with Sandbox(limits=LIMITS, isolation=mode) as sandbox:
        result = sandbox.run_script(
            "import os\nprint([line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]])\n"
            "print([p for p in os.listdir('/proc') if p.isdigit()])\n"
            "print(os.getuid(), os.environ.get('RLVR_HOSTILE_SECRET'))\nprint(sorted(os.listdir('/')))\n"
            "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
        )
    interfaces, processes, identity, root, capabilities = result.output.strip().splitlines()
    assert interfaces == "['lo']"
    assert processes == "['1']"  # itself, PID 1 of its own namespace: not the test runner
    assert "home" not in root and "run" not in root and "etc" in root
    uid, secret = identity.split()
    assert secret == "None"
    if mode == "namespaces":  # a user id of its own server, never root's
        assert UID_BASE <= int(uid) < UID_BASE + 2 * UID_SLOTS and int(uid) % 2 == UID_BASE % 2
    else:
        assert uid == "0"
    assert int(capabilities, 16) == 0


def test_live_sandboxes_never_share_user_ids():
    """Each live sandbox on the host holds its own pair of user ids (an flock per slot): a slot another
    sandbox holds, in this process or any other, is passed over, and closing a sandbox frees its slot."""
    start = UID_SLOTS - 1  # the last slot: the next claim wraps to 0
    first, held = client.claim_uid_slot(start)
    second, also_held = client.claim_uid_slot(first)
    assert held is not None and also_held is not None and second != first
    other = subprocess.run(
        [sys.executable, "-c", f"from tasks.sandbox.client import claim_uid_slot; print(claim_uid_slot({first})[0])"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert int(other.stdout) not in (first, second), other.stderr  # another process passes over both
    os.close(held)
    again, again_held = client.claim_uid_slot(first)
    assert again == first  # free again
    os.close(again_held)
    os.close(also_held)
    sandboxes = [Sandbox(isolation="rlimits", allow_insecure=True) for _ in range(3)]
    try:
        assert len({sandbox._uid_slot for sandbox in sandboxes}) == 3
    finally:
        for sandbox in sandboxes:
            sandbox.close()


@pytest.mark.skipif(not UNPRIVILEGED, reason="needs root (to drop to nobody), setpriv and user namespaces")
def test_an_unprivileged_user_gets_userns_isolation():
    probe = run_unprivileged("-c", ["from tasks.sandbox.client import isolation_mode; print(isolation_mode())"], "")
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "userns"


def test_without_isolation_code_is_refused_unless_explicitly_allowed(monkeypatch):
    monkeypatch.delenv(client.INSECURE_ENV, raising=False)
    with pytest.raises(SandboxUnavailable, match="--insecure-sandbox"):
        Sandbox(isolation="rlimits")
    monkeypatch.setenv(client.INSECURE_ENV, "1")
    sandbox = Sandbox(isolation="rlimits", limits=LIMITS)
    assert sandbox.description == "rlimits (insecure: no isolation)"


def test_the_rlimits_fallback_still_refuses_sockets(context):
    program = (
        f"import socket\ns = socket.create_connection(('127.0.0.1', {context['port']}), timeout=2)\n"
        "print(s.recv(100).decode())\n"
    )
    with Sandbox(limits=LIMITS, isolation="rlimits", allow_insecure=True) as sandbox:
        result = sandbox.run_script(program)
    assert context["secret"] not in result.output and result.exit_code != 0


def test_closing_a_sandbox_leaves_no_folder_process_or_cgroup_behind():
    before = set(Path("/tmp").glob("rlvr-sandbox-*"))
    for isolation in {"rlimits", *MODES}:
        with Sandbox(limits=LIMITS, isolation=isolation, allow_insecure=True) as sandbox:
            assert sandbox.run_script("open('x', 'w').write('1')").exit_code == 0
            processes, groups = sandbox.processes(), sandbox._cgroups
            assert processes
        assert not _still_alive(processes)
        assert not groups or not any(os.path.exists(path) for path in (groups["memory"], groups["pids"]))
    assert set(Path("/tmp").glob("rlvr-sandbox-*")) == before
    assert not Path("/tmp/rlvr-jail").exists()


def _still_alive(pids: list[int], wait: float = 10.0) -> list[int]:
    """Those of `pids` still running (not zombies) after up to `wait` seconds: the last exits take a moment."""
    deadline = time.monotonic() + wait
    while True:
        alive = []
        for pid in pids:
            try:
                if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
            except OSError:
                continue
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


# ---- whole-run budgets ----------------------------------------------------------------------------------------
def _memory_of(pids: list[int]) -> int:
    """Proportional set size of these processes in bytes (shared pages counted once overall)."""
    total = 0
    for pid in pids:
        try:
            for line in open(f"/proc/{pid}/smaps_rollup"):
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def _available() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


@pytest.mark.parametrize("mode", MODES)
def test_many_children_together_stay_within_the_memory_budget(mode):
    """Eight forked children each touch 300 MB (2.4 GB in all) against a 512 MB budget, and the run ends only
    once each child holds its memory or was killed (a byte on its pipe, or the pipe's end), so a slow host
    cannot end it before the children have tried (a fixed 2 s wait once let it end at 315 MB): the run never holds
    more than the budget (by the kernel's own peak where a cgroup bounds it; sampled every few ms from
    outside where the server polls), and the host's available memory never drops by much more (other tests
    share the host: a generous margin)."""
    program = textwrap.dedent("""\
        import os, time
        reports = []
        for _ in range(8):
            report, reported = os.pipe()
            if os.fork() == 0:
                try:
                    hog = bytearray(300 * 1024 * 1024)
                    for i in range(0, len(hog), 4096):
                        hog[i] = 1
                except MemoryError:
                    pass
                os.write(reported, b"1")
                time.sleep(30)
                os._exit(0)
            os.close(reported)
            reports.append(report)
        for report in reports:
            os.read(report, 1)
        print("done")
        """)
    with Sandbox(limits=LIMITS, isolation=mode) as sandbox:
        baseline_processes, baseline_available = _memory_of(sandbox.processes()), _available()
        peaks = {"sandbox": 0, "host": 0}
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peaks["sandbox"] = max(peaks["sandbox"], _memory_of(sandbox.processes()) - baseline_processes)
                peaks["host"] = max(peaks["host"], baseline_available - _available())
                time.sleep(0.005)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            result = sandbox.run_script(program)
        finally:
            stop.set()
            sampler.join()
    budget = LIMITS.memory_mb * 1024 * 1024
    seen = {**peaks, "budget": sandbox.budget, "kernel_peak_mb": result.peak_mb}
    assert result.status == "memory_limit", result
    if sandbox.budget.startswith("cgroup"):  # the kernel's own count of the run's memory, pages it charged
        assert result.peak_mb is not None and result.peak_mb <= LIMITS.memory_mb, seen
    else:  # polled: what one poll interval lets through, sampled from outside
        assert peaks["sandbox"] <= budget + 64 * 1024 * 1024, seen
    assert peaks["host"] <= budget + 700 * 1024 * 1024, seen


@pytest.mark.parametrize("mode", MODES)
def test_cpu_time_is_a_budget_of_the_whole_run(mode):
    """Four processes spinning together pass a 2 s CPU budget in about half a second of wall time each."""
    program = "import os\nfor _ in range(3):\n    if os.fork() == 0:\n        break\nwhile True:\n    pass\n"
    limits = SandboxLimits(cpu_seconds=2, wall_seconds=8, memory_mb=512)
    with Sandbox(limits=limits, isolation=mode) as sandbox:
        result = sandbox.run_script(program)
    assert result.status == "cpu_limit", result
    assert result.seconds < limits.wall_seconds


def test_the_tmpfs_of_a_run_is_private_and_bounded():
    mode = MODES[0] if MODES else pytest.skip("no jailed mode on this host")
    limits = SandboxLimits(memory_mb=512, scratch_mb=32, wall_seconds=8)
    program = (
        "import os\nwritten = 0\nfor n in range(100):\n    try:\n        with open(f'f{n}', 'wb') as f:\n"
        "            f.write(b'0' * (4 << 20))\n        written += 4\n    except OSError:\n        break\n"
        "print(written, sorted(os.listdir('/tmp')))\n"
    )
    with Sandbox(limits=limits, isolation=mode) as sandbox:
        first = sandbox.run_script(program)
        second = sandbox.run_script("import os\nprint(sorted(os.listdir('/tmp')))\n")
    written, listing = first.output.split(" ", 1)
    assert int(written) <= limits.scratch_mb and listing.strip() == "['work']"
    assert second.output.strip() == "['work']"  # the next run starts from an empty tmpfs


# ---- no leaks ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES[:1])
def test_thousands_of_runs_in_one_server_leak_nothing(mode):
    """3,000 consecutive test runs in one server: none crashed, the server never replaced, its descriptor
    count and memory flat."""
    with Sandbox(limits=LIMITS, isolation=mode) as sandbox:
        server = sandbox.server_pid
        first = sandbox.run_tests("def f(x):\n    return x + 1\n", "assert f(1) == 2\n", "f")
        for index in range(3000):
            result = sandbox.run_tests("def f(x):\n    return x + 1\n", "assert f(1) == 2\nassert f(2) == 3\n", "f")
            assert result.all_passed, (index, result)
        assert sandbox.server_pid == server and sandbox.crashes == 0 and sandbox.recycled == 0
    assert result.health["open_fds"] == first.health["open_fds"]
    assert result.health["rss_mb"] <= first.health["rss_mb"] + 20


@pytest.mark.parametrize("mode", MODES)
def test_a_quick_script_never_loses_its_output(mode):
    """A script that prints and exits at once: its output often is still in the pipe when its exit status
    arrives, and must be kept (it was read and dropped, about one run in a hundred); a quick burst past the
    output limit is still the limit."""
    with Sandbox(limits=LIMITS, isolation=mode) as sandbox:
        outputs = [sandbox.run_script(f"print('line {index}')") for index in range(400)]
        burst = sandbox.run_script(f"import sys\nsys.stdout.write('x' * {LIMITS.output_bytes + 10})")
    assert [(r.status, r.output) for r in outputs] == [("ok", f"line {index}\n") for index in range(400)]
    assert burst.status == "output_limit"


def test_a_server_past_a_health_limit_is_replaced_without_failing_a_run():
    mode = MODES[0] if MODES else pytest.skip("no jailed mode on this host")
    with Sandbox(limits=LIMITS, isolation=mode, health_limits={"open_fds": 3}) as sandbox:  # it holds 7
        server = sandbox.server_pid
        first = sandbox.run_script("print('ok')")
        assert first.output.strip() == "ok" and first.health["recycle"] and sandbox.recycled == 1
        after = sandbox.run_script("print('still ok')")
        assert after.output.strip() == "still ok" and sandbox.server_pid != server and sandbox.crashes == 0
