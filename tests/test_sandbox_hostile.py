"""The hostile-program suite: every program is contained, scores 0, and leaves nothing behind.

Each program is a candidate for `solve(x)`, with tests that only a successful attack could pass
(the secret, the answer served over the network, the expected value hidden in the tests), so a
score above 0 would mean the attack worked. After each run: the sandbox server is the same
process, no process of the sandbox's user ids is alive, and no file it tried to plant exists.
"""

import os
import socket
import subprocess
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

from tasks.sandbox.client import Sandbox, isolation_mode
from tasks.sandbox.limits import SandboxLimits
from tasks.sandbox.zygote import UID_BASE
from tasks.verifiers.code import CodeVerifier

SECRET = "s3cr3t-" + uuid.uuid4().hex
MARKER = "rlvr-hostile-" + uuid.uuid4().hex[:8]
LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=4, memory_mb=512, processes=16, output_bytes=200_000)


def expecting(value: str) -> str:
    return f"assert solve(2) == {value!r}\nassert solve(3) == {value!r}\n"


HOSTILE = {
    "exit early with status 0": ("import os\ndef solve(x):\n    os._exit(0)\n", expecting("4")),
    "sys.exit at import": ("import sys\nsys.exit(0)\ndef solve(x):\n    return 0\n", expecting("4")),
    "print fake success": ("def solve(x):\n    print('ALL TESTS PASSED 2/2')\n    print('OK')\n    return None\n",
                           expecting("4")),
    "override __eq__": ("class Yes:\n    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n"
                        "def solve(x):\n    return Yes()\n", expecting("4")),
    "int subclass that equals all": ("class Liar(int):\n    def __eq__(self, other): return True\n"
                                     "def solve(x):\n    return Liar(0)\n", expecting("4")),
    "patch builtins": ("import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n"
                       "builtins.isinstance = lambda *a: True\nbuiltins.len = lambda *a: 0\n"
                       "def solve(x):\n    return -1\n", expecting("4")),
    "patch the test functions": ("import gc, sys\nfor obj in gc.get_objects():\n"
                                 "    if callable(obj) and getattr(obj, '__name__', '') == 'check':\n"
                                 "        obj.__code__ = (lambda candidate: None).__code__\n"
                                 "sys.modules.pop('unittest', None)\ndef solve(x):\n    return -1\n",
                                 "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n"),
    "catch the assertion errors": ("import sys\nsys.excepthook = lambda *a: None\n"
                                   "def solve(x):\n    try:\n        raise AssertionError\n    except AssertionError:\n"
                                   "        return -1\n", expecting("4")),
    "read expected outputs from the test file": (
        "import os, re\ndef solve(x):\n    for root in ('.', '/tmp', '/', os.path.expanduser('~'), REPO):\n"
        "        for base, dirs, files in os.walk(root):\n            for name in files:\n"
        "                try:\n                    text = open(os.path.join(base, name), errors='ignore').read(100000)\n"
        "                except Exception:\n                    continue\n"
        "                found = re.search(r\"solve\\(2\\) == '(hidden-[0-9a-f]+)'\", text)\n"
        "                if found:\n                    return found.group(1)\n            if base.count('/') > 8:\n"
        "                dirs[:] = []\n    return None\n", expecting("hidden-" + uuid.uuid4().hex[:12])),
    "read the tests from its own memory": (
        "import gc\ndef solve(x):\n    for obj in gc.get_objects():\n"
        "        if isinstance(obj, dict) and isinstance(obj.get('tests'), str) and 'hidden' in obj['tests']:\n"
        "            return obj['tests'].split(\"'\")[1]\n"
        "    import re\n    raw = open('/proc/self/maps').read()\n    return None\n",
        expecting("hidden-" + uuid.uuid4().hex[:12])),
    "read other processes' memory": (
        "import os, re\ndef solve(x):\n    for pid in os.listdir('/proc'):\n        if not pid.isdigit():\n"
        "            continue\n        for part in ('cmdline', 'environ'):\n            try:\n"
        "                data = open(f'/proc/{pid}/{part}', 'rb').read().decode(errors='ignore')\n"
        "            except Exception:\n                continue\n"
        "            found = re.search(r's3cr3t-[0-9a-f]+', data)\n            if found:\n                return found.group(0)\n"
        "    return None\n", expecting(SECRET)),
    "read the orchestrator's environment": ("import os\ndef solve(x):\n    return os.environ.get('RLVR_HOSTILE_SECRET')\n",
                                            expecting(SECRET)),
    "read the orchestrator's secret file": ("def solve(x):\n    return open(SECRET_PATH).read()\n", expecting(SECRET)),
    "read the orchestrator's files": ("import os\ndef solve(x):\n    return open(os.path.join(REPO, 'README.md')).readline()\n",
                                      expecting(open(Path(__file__).resolve().parents[1] / "README.md").readline())),
    "open a socket to fetch the answer": (
        "import socket\ndef solve(x):\n    with socket.create_connection(('127.0.0.1', PORT), timeout=2) as s:\n"
        "        return s.recv(100).decode()\n", expecting(SECRET)),
    "write outside its folder": (
        f"import os\ndef solve(x):\n    for path in ('/tmp/{MARKER}', '/var/tmp/{MARKER}', '/dev/shm/{MARKER}',"
        f" os.path.join(REPO, '{MARKER}'), '/root/{MARKER}'):\n        open(path, 'w').write('pwned')\n    return 4\n",
        expecting("4")),
    "kill its parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(1, signal.SIGKILL)\n"
                        "def solve(x):\n    return 4\n", expecting("5")),
    "kill the test runner": ("import os, signal\ndef solve(x):\n    for pid in os.listdir('/proc'):\n"
                             "        if pid.isdigit() and int(pid) != os.getpid():\n            try:\n"
                             "                os.kill(int(pid), signal.SIGKILL)\n            except Exception:\n"
                             "                pass\n    return -1\n", expecting("4")),
    "leave a daemon behind": (
        f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        while True:\n"
        f"            open('/tmp/{MARKER}-daemon', 'w').write(str(time.time()))\n            time.sleep(0.05)\n"
        f"    os._exit(0)\ndef solve(x):\n    return -1\n", expecting("4")),
    "fork bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
                  "def solve(x):\n    return 4\n", expecting("4")),
    "memory bomb": ("hog = bytearray(8 * 1024 ** 3)\ndef solve(x):\n    return 4\n", expecting("4")),
    "infinite loop": ("def solve(x):\n    while True:\n        pass\n", expecting("4")),
    "ignore termination and spin": ("import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGXCPU):\n"
                                    "    signal.signal(s, signal.SIG_IGN)\ndef solve(x):\n    while True:\n        pass\n",
                                    expecting("4")),
    "gigabytes of output": ("import sys\ndef solve(x):\n    chunk = 'x' * 65536\n    for _ in range(20000):\n"
                            "        sys.stdout.write(chunk)\n    return 4\n", expecting("5")),
    "huge file": ("def solve(x):\n    with open('big', 'wb') as f:\n        f.write(b'0' * 512 * 1024 * 1024)\n"
                  "    return 4\n", expecting("5")),
}


@pytest.fixture(scope="module")
def answer_server():
    """A loopback TCP server that hands out the secret: reachable from here, not from the sandbox."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                continue
            connection.sendall(SECRET.encode())
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(2)
    server.close()


@pytest.fixture(scope="module")
def secret_file():
    folder = tempfile.mkdtemp(dir=os.path.expanduser("~"))
    path = Path(folder) / "credentials"
    path.write_text(SECRET)
    path.chmod(0o600)
    yield str(path)
    path.unlink()
    os.rmdir(folder)


@pytest.fixture(scope="module")
def verifier(monkeypatch_module):
    monkeypatch_module.setenv("RLVR_HOSTILE_SECRET", SECRET)       # in the orchestrator's environment
    verifier = CodeVerifier(limits=LIMITS)
    verifier.sandbox.start()
    yield verifier
    verifier.close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def sandbox_processes() -> list[str]:
    uids = {str(UID_BASE + i) for i in range(8)}
    listing = subprocess.run(["ps", "-eo", "uid=,pid=,args="], capture_output=True, text=True).stdout.splitlines()
    return [line for line in listing if line.split()[0] in uids]


def planted_files() -> list[str]:
    root = Path(__file__).resolve().parents[1]
    candidates = [Path("/tmp") / MARKER, Path("/tmp") / f"{MARKER}-daemon", Path("/var/tmp") / MARKER,
                  Path("/dev/shm") / MARKER, root / MARKER, Path("/root") / MARKER]
    return [str(p) for p in candidates if p.exists()]


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_is_contained(name, verifier, answer_server, secret_file):
    program, tests = HOSTILE[name]
    root = Path(__file__).resolve().parents[1]
    program = (program.replace("PORT", str(answer_server)).replace("SECRET_PATH", repr(secret_file))
               .replace("REPO", repr(str(root))))
    server_before = verifier.sandbox.server_pid
    verdict = verifier.verify({"prompt": "", "tests": tests, "entry_point": "solve"}, program)
    assert verdict.reward == 0.0, verdict.details
    assert verdict.correct is False
    assert verifier.sandbox.server_pid == server_before, "the sandbox server was replaced"
    assert sandbox_processes() == []
    assert planted_files() == []


def test_the_suite_is_large_enough():
    assert len(HOSTILE) >= 15


def test_an_honest_program_still_passes_after_the_hostile_ones(verifier):
    verdict = verifier.verify({"prompt": "", "tests": expecting("4").replace("'4'", "4"), "entry_point": "solve"},
                              "def solve(x):\n    return 4\n")
    assert verdict.reward == 1.0 and verdict.correct


@pytest.mark.skipif(isolation_mode() != "namespaces", reason="needs root and unshare")
def test_the_sandbox_has_no_network_and_its_own_process_table():
    with Sandbox(limits=LIMITS) as sandbox:
        result = sandbox.run_script(
            "import os, socket\nprint([line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]])\n"
            "print(len([p for p in os.listdir('/proc') if p.isdigit()]))\n"
            "print(os.getuid(), os.environ.get('RLVR_HOSTILE_SECRET'))\nprint(sorted(os.listdir('/')))\n")
    interfaces, processes, identity, root = result.output.strip().splitlines()
    assert interfaces == "['lo']"
    assert "home" not in root and "run" not in root
    assert int(processes) <= 3                     # the server and this program, not the host's processes
    assert identity == f"{UID_BASE} None"


def test_the_rlimits_fallback_still_refuses_sockets(answer_server):
    program = (f"import socket\ns = socket.create_connection(('127.0.0.1', {answer_server}), timeout=2)\n"
               "print(s.recv(100).decode())\n")
    with Sandbox(limits=LIMITS, isolation="rlimits") as sandbox:
        result = sandbox.run_script(program)
    assert SECRET not in result.output and result.exit_code != 0


def test_closing_a_sandbox_leaves_no_folder_or_process_behind():
    before = set(Path("/tmp").glob("rlvr-sandbox-*"))
    for isolation in {"rlimits", isolation_mode()}:
        with Sandbox(limits=LIMITS, isolation=isolation) as sandbox:
            assert sandbox.run_script("open('x', 'w').write('1')").exit_code == 0
            server = sandbox._process.pid
        assert subprocess.run(["ps", "-p", str(server)], capture_output=True).returncode != 0
    assert set(Path("/tmp").glob("rlvr-sandbox-*")) == before
    assert not Path("/run/rlvr-jail").exists() and not Path("/tmp/rlvr-jail").exists()
