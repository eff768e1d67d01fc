"""moto's S3 server on loopback, in a process of its own (in-process, delta-rs calls that hold the GIL would
deadlock): the S3 of the benchmarks and of the tests' `s3_endpoint` fixture."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent


def start_moto(log: Path | None = None, timeout: float = 30.0) -> tuple[subprocess.Popen, str]:
    """(the server's process, its endpoint), once it answers; `log`: where its access log goes (one line a
    request), else nowhere."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=log.open("w") if log else subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(endpoint + "/moto-api/", timeout=1):
                return process, endpoint
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"moto_server did not answer at {endpoint} within {timeout:g} s")
