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
import threading
import uuid
from pathlib import Path

import pytest
from sandbox_modes import AS_ROOT, still_alive
from sandbox_modes import SANDBOX_LIMITS as LIMITS
from sandbox_modes import SANDBOX_MODES as MODES

from bench.hostile_programs import HOSTILE, REPO, planted_files, score_all
from tasks.sandbox import client
from tasks.sandbox.client import Sandbox, SandboxUnavailable
from tasks.sandbox.zygote import UID_BASE, UID_SLOTS

NOBODY = 65534
UNPRIVILEGED = AS_ROOT and "userns" in MODES and shutil.which("setpriv") is not None
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
    assert len(ALL_MODES) >= (3 if AS_ROOT else 1)  # root hosts check all three modes


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
        assert not still_alive(processes)
        assert not groups or not any(os.path.exists(path) for path in (groups["memory"], groups["pids"]))
    assert set(Path("/tmp").glob("rlvr-sandbox-*")) == before
    assert not Path("/tmp/rlvr-jail").exists()
