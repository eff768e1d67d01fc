"""Hostile programs for the sandbox, and a runner that scores them in one isolation mode.

Each program is a candidate for `solve(x)`, with tests that only a successful attack could pass
(the secret, the answer served over the network, the expected value hidden in the tests), so a
score above 0 means the attack worked. Resource attacks return a wrong answer on purpose: for them
what counts is that the run is contained (the server survives, nothing is left behind).

Used by the test suite (every program in every isolation mode) and by `rlvr bench sandbox --hostile`.
Run as a module (`python -m bench.hostile_programs MODE < request.json`), it scores the requested
programs and prints one JSON object: how the tests drop privileges to check the non-root mode.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[1])


def expecting(value: str) -> str:
    return f"assert solve(2) == {value!r}\nassert solve(3) == {value!r}\n"


FORGE = (
    "import os, marshal, struct\n"
    "def frame(value):\n    data = marshal.dumps(value)\n    return struct.pack('>I', len(data)) + data\n"
    "FORGED = frame(('total', 2)) + frame(('result', 0, True, '')) + frame(('result', 1, True, '')) + frame(('done',))\n"
    "def forge():\n    for pid in os.listdir('/proc'):\n        if not pid.isdigit() or int(pid) == os.getpid():\n"
    "            continue\n        try:\n            fds = os.listdir(f'/proc/{pid}/fd')\n        except OSError:\n"
    "            continue\n        for fd in fds:\n            try:\n"
    "                if 'pipe' in os.readlink(f'/proc/{pid}/fd/{fd}'):\n"
    "                    out = os.open(f'/proc/{pid}/fd/{fd}', os.O_WRONLY | os.O_NONBLOCK)\n"
    "                    os.write(out, FORGED)\n            except OSError:\n                pass\n"
)
MEMORY_SCAN = (
    "import os, re\n"
    "def scan():\n    for pid in os.listdir('/proc'):\n        if not pid.isdigit() or int(pid) == os.getpid():\n"
    "            continue\n        try:\n            maps = open(f'/proc/{pid}/maps').read().splitlines()\n"
    "            memory = open(f'/proc/{pid}/mem', 'rb')\n        except OSError:\n            continue\n"
    "        for line in maps:\n            start, end = (int(x, 16) for x in line.split()[0].split('-'))\n"
    "            try:\n                memory.seek(start)\n                found = re.search(rb'hidden-[0-9a-f]{12}', memory.read(min(end - start, 1 << 24)))\n"
    "            except (OSError, ValueError, OverflowError):\n                continue\n"
    "            if found:\n                return found.group(0).decode()\n"
)

HOSTILE = {
    # ---- the verdict ----------------------------------------------------------------------------------------
    "exit early with status 0": ("import os\ndef solve(x):\n    os._exit(0)\n", expecting("4")),
    "sys.exit at import": ("import sys\nsys.exit(0)\ndef solve(x):\n    return 0\n", expecting("4")),
    "print fake success": (
        "def solve(x):\n    print('ALL TESTS PASSED 2/2')\n    print('OK')\n    return None\n",
        expecting("4"),
    ),
    "override __eq__": (
        "class Yes:\n    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n"
        "def solve(x):\n    return Yes()\n",
        expecting("4"),
    ),
    "int subclass that equals all": (
        "class Liar(int):\n    def __eq__(self, other): return True\ndef solve(x):\n    return Liar(0)\n",
        expecting("4"),
    ),
    "patch builtins": (
        "import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n"
        "builtins.isinstance = lambda *a: True\nbuiltins.len = lambda *a: 0\n"
        "def solve(x):\n    return -1\n",
        expecting("4"),
    ),
    "patch the test functions": (
        "import gc, sys\nfor obj in gc.get_objects():\n"
        "    if callable(obj) and getattr(obj, '__name__', '') == 'check':\n"
        "        obj.__code__ = (lambda candidate: None).__code__\n"
        "sys.modules.pop('unittest', None)\ndef solve(x):\n    return -1\n",
        "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n",
    ),
    "catch the assertion errors": (
        "import sys\nsys.excepthook = lambda *a: None\n"
        "def solve(x):\n    try:\n        raise AssertionError\n    except AssertionError:\n"
        "        return -1\n",
        expecting("4"),
    ),
    "forge the verdict through /proc/*/fd": (
        FORGE + "forge()\ndef solve(x):\n    forge()\n    return None\n",
        expecting("HIDDEN"),
    ),
    "stop the test runner, then forge its results": (
        FORGE + "import signal\nfor pid in os.listdir('/proc'):\n    if pid.isdigit() and int(pid) != os.getpid():\n"
        "        try:\n            os.kill(int(pid), signal.SIGSTOP)\n        except OSError:\n            pass\n"
        "forge()\ndef solve(x):\n    return None\n",
        expecting("HIDDEN"),
    ),
    "plant a module for the test runner": (
        "import os\nfor folder in ('/', '/tmp', '/usr/lib', os.getcwd(), '/proc/1/cwd', '/tmp/runs', '..'):\n"
        "    try:\n        open(os.path.join(folder, 'rlvr_planted.py'), 'w').write('VALUE = None\\n')\n"
        "    except OSError:\n        pass\n"
        "for base, dirs, files in os.walk('/tmp'):\n    for name in dirs:\n        try:\n"
        "            open(os.path.join(base, name, 'rlvr_planted.py'), 'w').write('VALUE = None\\n')\n"
        "        except OSError:\n            pass\ndef solve(x):\n    return None\n",
        "import rlvr_planted\nassert solve(2) == rlvr_planted.VALUE\nassert solve(3) == rlvr_planted.VALUE\n",
    ),
    "sleep past each test's deadline, then answer right": (
        "import time\ndef solve(x):\n    time.sleep(TEST_SECONDS + 0.3)\n    return x * x\n",
        "assert solve(2) == 4\nassert solve(3) == 9\n",
    ),
    "an answer too large for the pipe": (
        "def solve(x):\n    return 'x' * (65 * 1024 * 1024)\n",
        "assert solve(2) == 'x' * (65 * 1024 * 1024)\n",
    ),
    # ---- reading what it must not see -----------------------------------------------------------------------
    "read expected outputs from the test file": (
        "import os, re\ndef solve(x):\n    for root in ('.', '/tmp', '/', os.path.expanduser('~'), REPO):\n"
        "        for base, dirs, files in os.walk(root):\n            for name in files:\n"
        "                try:\n                    text = open(os.path.join(base, name), errors='ignore').read(100000)\n"
        "                except Exception:\n                    continue\n"
        "                found = re.search(r\"solve\\(2\\) == '(hidden-[0-9a-f]+)'\", text)\n"
        "                if found:\n                    return found.group(1)\n            if base.count('/') > 8:\n"
        "                dirs[:] = []\n    return None\n",
        expecting("HIDDEN"),
    ),
    "read the tests from its own memory": (
        "import gc\ndef solve(x):\n    for obj in gc.get_objects():\n"
        "        if isinstance(obj, dict) and isinstance(obj.get('tests'), str) and 'hidden' in obj['tests']:\n"
        "            return obj['tests'].split(\"'\")[1]\n"
        "    raw = open('/proc/self/maps').read()\n    return None\n",
        expecting("HIDDEN"),
    ),
    "read the test runner's memory through /proc/*/mem": (
        MEMORY_SCAN + "def solve(x):\n    return scan()\n",
        expecting("HIDDEN"),
    ),
    "ptrace every process, then read its memory": (
        MEMORY_SCAN + "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "for pid in os.listdir('/proc'):\n    if pid.isdigit() and int(pid) != os.getpid():\n"
        "        libc.ptrace(16, int(pid), 0, 0)\ndef solve(x):\n    return scan()\n",
        expecting("HIDDEN"),
    ),
    "read other processes' memory": (
        "import os, re\ndef solve(x):\n    for pid in os.listdir('/proc'):\n        if not pid.isdigit():\n"
        "            continue\n        for part in ('cmdline', 'environ'):\n            try:\n"
        "                data = open(f'/proc/{pid}/{part}', 'rb').read().decode(errors='ignore')\n"
        "            except Exception:\n                continue\n"
        "            found = re.search(r's3cr3t-[0-9a-f]+', data)\n            if found:\n                return found.group(0)\n"
        "    return None\n",
        expecting("SECRET"),
    ),
    "read the parent's environment": (
        "import os, re\ndef solve(x):\n    pid = os.getpid()\n    for _ in range(20):\n        try:\n"
        "            environ = open(f'/proc/{pid}/environ', 'rb').read().decode(errors='ignore')\n"
        "            found = re.search(r's3cr3t-[0-9a-f]+', environ)\n            if found:\n                return found.group(0)\n"
        "            pid = int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1])\n"
        "        except (OSError, ValueError):\n            break\n        if pid <= 0:\n            break\n"
        "    return None\n",
        expecting("SECRET"),
    ),
    "read the orchestrator's environment": (
        "import os\ndef solve(x):\n    return os.environ.get('RLVR_HOSTILE_SECRET')\n",
        expecting("SECRET"),
    ),
    "read the orchestrator's secret file": (
        "def solve(x):\n    return open(SECRET_PATH).read()\n",
        expecting("SECRET"),
    ),
    "read the orchestrator's files": (
        "import os\ndef solve(x):\n    return open(os.path.join(REPO, 'README.md')).readline()\n",
        expecting("README_LINE"),
    ),
    "escape through /proc/*/root and /proc/*/cwd": (
        "import os\ndef solve(x):\n    for pid in ['self', *os.listdir('/proc')]:\n        for link in ('root', 'cwd'):\n"
        "            try:\n                return open(f'/proc/{pid}/{link}' + REPO + '/README.md').readline()\n"
        "            except OSError:\n                pass\n    return None\n",
        expecting("README_LINE"),
    ),
    "create a user namespace, then escape the chroot": (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.unshare(0x10000000)\n"
        "def solve(x):\n    try:\n        os.mkdir('up')\n        os.chroot('up')\n        for _ in range(40):\n"
        "            os.chdir('..')\n        os.chroot('.')\n        return open(REPO + '/README.md').readline()\n"
        "    except OSError:\n        return None\n",
        expecting("README_LINE"),
    ),
    "gain capabilities through exec": (
        "import subprocess, sys\ndef caps(text):\n    return int(text.split('CapEff:')[1].split()[0], 16)\n"
        "def solve(x):\n    own = caps(open('/proc/self/status').read())\n"
        "    child = subprocess.run([sys.executable, '-c', \"print(open('/proc/self/status').read())\"],\n"
        "                           capture_output=True, text=True).stdout\n"
        "    return own != 0 or (bool(child) and caps(child) != 0)\n",
        "assert solve(2) is True\n",
    ),
    # ---- the network ------------------------------------------------------------------------------------------
    "open a socket to fetch the answer": (
        "import socket\ndef solve(x):\n    with socket.create_connection(('127.0.0.1', PORT), timeout=2) as s:\n"
        "        return s.recv(100).decode()\n",
        expecting("SECRET"),
    ),
    "reach the host through an abstract unix socket": (
        "import socket\ndef solve(x):\n    s = socket.socket(socket.AF_UNIX)\n    s.settimeout(2)\n"
        "    s.connect('\\0' + ABSTRACT)\n    return s.recv(100).decode()\n",
        expecting("SECRET"),
    ),
    "reach the host through a unix socket file": (
        "import socket\ndef solve(x):\n    s = socket.socket(socket.AF_UNIX)\n    s.settimeout(2)\n"
        "    s.connect(SOCKET_PATH)\n    return s.recv(100).decode()\n",
        expecting("SECRET"),
    ),
    # ---- the machine ------------------------------------------------------------------------------------------
    "write outside its folder": (
        "import os\ndef solve(x):\n    for path in ('/tmp/MARKER', '/var/tmp/MARKER', '/dev/shm/MARKER',"
        " os.path.join(REPO, 'MARKER'), '/root/MARKER', '/usr/MARKER'):\n        try:\n"
        "            open(path, 'w').write('pwned')\n        except OSError:\n            pass\n    return 4\n",
        expecting("5"),
    ),
    "remount the jail read-write": (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "for target in (b'/', b'/usr', b'/tmp'):\n    libc.mount(None, target, None, 32 | 4096, None)\n"
        "libc.mount(b'tmpfs', b'/usr', b'tmpfs', 0, None)\n"
        "try:\n    open('/usr/MARKER', 'w').write('pwned')\nexcept OSError:\n    pass\n"
        "def solve(x):\n    return 4 if os.path.exists('/usr/MARKER') else -1\n",
        expecting("4").replace("'4'", "4"),
    ),
    "kill its parent": (
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(1, signal.SIGKILL)\n"
        "def solve(x):\n    return 4\n",
        expecting("5"),
    ),
    "kill the test runner": (
        "import os, signal\ndef solve(x):\n    for pid in os.listdir('/proc'):\n"
        "        if pid.isdigit() and int(pid) != os.getpid():\n            try:\n"
        "                os.kill(int(pid), signal.SIGKILL)\n            except Exception:\n"
        "                pass\n    return -1\n",
        expecting("4"),
    ),
    "signal every process it may": (
        "import os, signal\nfor sig in (signal.SIGSTOP, signal.SIGKILL):\n    try:\n"
        "        os.kill(-1, sig)\n    except OSError:\n        pass\n"
        "def solve(x):\n    return -1\n",
        expecting("4"),
    ),
    "leave a daemon behind": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        while True:\n"
        "            open('/tmp/MARKER-daemon', 'w').write(str(time.time()))\n            time.sleep(0.05)\n"
        "    os._exit(0)\ndef solve(x):\n    return -1\n",
        expecting("4"),
    ),
    "a thread that outlives the test": (
        "import os, threading, time\ndef spin():\n    while True:\n        print('still here', flush=True)\n"
        "        time.sleep(0.01)\nthreading.Thread(target=spin, daemon=False).start()\n"
        "def solve(x):\n    return -1\n",
        expecting("4"),
    ),
    "fork bomb": (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
        "def solve(x):\n    return 4\n",
        expecting("4"),
    ),
    "memory bomb": ("hog = bytearray(8 * 1024 ** 3)\ndef solve(x):\n    return 4\n", expecting("4")),
    "memory in many children": (
        "import os, time\nfor _ in range(8):\n    if os.fork() == 0:\n        try:\n"
        "            hog = bytearray(300 * 1024 * 1024)\n            for i in range(0, len(hog), 4096):\n"
        "                hog[i] = 1\n        except MemoryError:\n            pass\n        time.sleep(30)\n"
        "        os._exit(0)\ntime.sleep(1)\ndef solve(x):\n    return -1\n",
        expecting("4"),
    ),
    "fill the scratch space": (
        "import os\nfor folder in ('.', '/tmp'):\n    for n in range(200):\n        try:\n"
        "            with open(os.path.join(folder, f'fill{n}'), 'wb') as f:\n                f.write(b'0' * (8 << 20))\n"
        "        except OSError:\n            break\ndef solve(x):\n    return -1\n",
        expecting("4"),
    ),
    "exhaust file descriptors": (
        "import os\nheld = []\nwhile True:\n    try:\n        held.append(os.open('/dev/null', os.O_RDONLY))\n"
        "    except OSError:\n        break\ndef solve(x):\n    return -1\n",
        expecting("4"),
    ),
    "infinite loop": ("def solve(x):\n    while True:\n        pass\n", expecting("4")),
    "ignore termination and spin": (
        "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGXCPU):\n"
        "    signal.signal(s, signal.SIG_IGN)\ndef solve(x):\n    while True:\n        pass\n",
        expecting("4"),
    ),
    "gigabytes of output": (
        "import sys\ndef solve(x):\n    chunk = 'x' * 65536\n    for _ in range(20000):\n"
        "        sys.stdout.write(chunk)\n    return 4\n",
        expecting("5"),
    ),
    "huge file": (
        "def solve(x):\n    with open('big', 'wb') as f:\n        f.write(b'0' * 512 * 1024 * 1024)\n    return 4\n",
        expecting("5"),
    ),
}


def prepare(name: str, context: dict) -> tuple[str, str]:
    """The program and tests of a case with this run's secret, ports, paths and marker filled in."""
    program, tests = HOSTILE[name]
    replacements = {
        "PORT": str(context["port"]),
        "SECRET_PATH": repr(context["secret_path"]),
        "REPO": repr(REPO),
        "ABSTRACT": repr(context["abstract"]),
        "SOCKET_PATH": repr(context["socket_path"]),
        "TEST_SECONDS": repr(context["limits"]["test_seconds"]),
        "MARKER": context["marker"],
    }
    for key, value in replacements.items():
        program = program.replace(key, value)
    values = {
        "'SECRET'": repr(context["secret"]),
        "'HIDDEN'": repr(context["hidden"]),
        "'README_LINE'": repr(context["readme_line"]),
    }
    for key, value in values.items():
        tests = tests.replace(key, value)
    return program, tests


def planted_files(marker: str) -> list[str]:
    candidates = [
        Path("/tmp") / marker,
        Path("/tmp") / f"{marker}-daemon",
        Path("/var/tmp") / marker,
        Path("/dev/shm") / marker,
        Path(REPO) / marker,
        Path("/root") / marker,
        Path("/usr") / marker,
        Path(REPO) / "rlvr_planted.py",
        Path("/tmp") / "rlvr_planted.py",
    ]
    found = []
    for path in candidates:
        try:
            if path.exists():
                found.append(str(path))
        except OSError:
            continue
    return found


def score_all(mode: str, context: dict, names: list[str]) -> dict[str, dict]:
    """Score each named case in one sandbox of `mode`; per case: reward, status, whether the server was
    replaced, the processes of the sandbox left beside its server, planted files, and the server's health."""
    from tasks.sandbox.client import Sandbox
    from tasks.sandbox.limits import SandboxLimits
    from tasks.verifiers.code import CodeVerifier

    limits = SandboxLimits(**context["limits"])
    verifier = CodeVerifier(limits=limits, _sandbox=Sandbox(isolation=mode, limits=limits))
    verifier.sandbox.start()
    outcomes = {}
    try:
        for name in names:
            program, tests = prepare(name, context)
            server = verifier.sandbox.server_pid
            verdict = verifier.verify({"prompt": "", "tests": tests, "entry_point": "solve"}, program)
            outcomes[name] = {
                "reward": verdict.reward,
                "correct": verdict.correct,
                "status": verdict.details.get("status"),
                "seconds": verdict.details.get("seconds"),
                "failures": verdict.details.get("failures"),
                "server_replaced": verifier.sandbox.server_pid != server,
                "crashes": verifier.sandbox.crashes,
                "leftovers": _leftovers(verifier.sandbox),
                "planted": planted_files(context["marker"]),
                "isolation": verdict.details.get("isolation"),
            }
    finally:
        verifier.close()
    return outcomes


def _leftovers(sandbox) -> int:
    """How many processes of this sandbox are alive besides its own (`unshare`, the server, its template):
    a daemon or a child a run left behind."""
    return len(sandbox.processes()) - (2 if sandbox.isolation == "rlimits" else 3)


if __name__ == "__main__":
    request = json.load(sys.stdin)
    os.environ["RLVR_HOSTILE_SECRET"] = request["context"]["secret"]
    print(json.dumps(score_all(sys.argv[1], request["context"], request["names"])))
