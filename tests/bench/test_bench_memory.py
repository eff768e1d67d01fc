"""bench/memory.py: a command's peak resident set as the kernel accounts for it, its own and not its parent's."""

import os
import subprocess
import sys
import time

import pytest

from bench.memory import high_water_mb, peak_rss_mb, rss_mb, run_child

TOUCH = "import sys; block = b'x' * (int(sys.argv[1]) << 20); print(len(block) >> 20); sys.exit(int(sys.argv[2]))"


@pytest.mark.skipif(sys.platform != "linux", reason="how Linux accounts for a child forked from a large process")
def test_a_commands_peak_is_what_it_touched_not_what_its_parent_holds():
    """The parent holds 400 MiB when it starts the command: a child forked from it directly would read at least
    that (Linux folds the forked copy into the child's peak at exec); through the launcher it reads the 100 MiB
    the command wrote, plus an interpreter."""
    held = b"x" * (400 << 20)
    direct = subprocess.Popen([sys.executable, "-c", "pass"])
    inflated = os.wait4(direct.pid, 0)[2].ru_maxrss / 1024
    child = run_child([sys.executable, "-c", TOUCH, "100", "0"])
    assert len(held) and inflated >= 400  # what the launcher is there for
    assert child.returncode == 0 and child.stdout.strip() == "100" and 0 < child.seconds
    assert 100 <= child.peak_rss_mb < 100 + 150


def test_a_command_that_fails_keeps_its_status_and_output():
    child = run_child([sys.executable, "-c", TOUCH, "1", "3"])
    assert (child.returncode, child.stdout.strip(), child.stderr) == (3, "1", "")


def test_a_command_past_its_timeout_is_killed_with_its_launcher():
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_child([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert time.monotonic() - started < 10


def test_this_processs_resident_set_is_at_most_its_peak_and_its_high_water_mark():
    assert 0 < rss_mb() <= peak_rss_mb()
    assert rss_mb() <= high_water_mb(os.getpid()) <= peak_rss_mb() + 1
