"""Prefect never gets in the way: commands that need no orchestration start no server, a command's
temporary server dies with it (even on SIGKILL), and a server that will not start is one clear line
(test_curation checks that a normal run with a temporary server prints no traceback)."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import BIN, run_cli

from flows.orchestration import LOG_NAME, PID_NAME


@pytest.fixture
def fresh_home(tmp_path):
    """A PREFECT_HOME of the test's own and no API URL: each command must bring its own server."""
    home = tmp_path / "prefect-home"
    home.mkdir()
    return {"PREFECT_HOME": str(home), "PREFECT_API_URL": ""}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_killed_command_takes_its_temporary_server_with_it(tmp_path, fresh_home):
    home = Path(fresh_home["PREFECT_HOME"])
    command = subprocess.Popen(
        [str(BIN / "rlvr"), "curate", "--source", "gen:level3:200000", "--lake", str(tmp_path / "lake")],
        env={**os.environ, **fresh_home},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not (home / PID_NAME).exists() and time.monotonic() < deadline and command.poll() is None:
        time.sleep(0.2)
    server = int((home / PID_NAME).read_text())
    assert alive(server)
    command.send_signal(signal.SIGKILL)  # the command alone, not its process group
    command.wait()
    deadline = time.monotonic() + 15
    while alive(server) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(server), "the temporary Prefect server outlived the command that started it"


def test_a_server_that_does_not_answer_is_one_line(tmp_path, fresh_home):
    result = run_cli(
        "curate",
        "--source",
        "gen:level1:10",
        "--lake",
        str(tmp_path / "lake"),
        env={**fresh_home, "RLVR_PREFECT_START_TIMEOUT": "0.05"},
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "did not answer within 0 s (twice" in result.stderr
    assert LOG_NAME in result.stderr and "prefect server start" in result.stderr


def test_commands_without_orchestration_start_no_server(tmp_path, fresh_home):
    from helpers import write

    from storage.lake import Lake

    lake = str(tmp_path / "lake")
    write(Lake.open(lake), 1, ["a"])
    log = Path(fresh_home["PREFECT_HOME"]) / LOG_NAME
    for args in (
        ["sql", "select count(*) from quarantine"],
        ["bank", "stats"],
        ["doctor"],
        ["policy", "list"],
        ["lineage", "problem", "nope"],
    ):
        result = run_cli(*args, "--lake", lake, env=fresh_home)
        assert "Traceback" not in result.stderr, result.stderr
    assert not log.exists()
