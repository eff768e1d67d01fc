"""The in-process scoring bound (tasks/verifiers/deadline.py): it bounds a block, and leaves no thread behind."""

from __future__ import annotations

import threading
import time

import pytest

from tasks.verification.engine import VerifierPool
from tasks.verifiers.deadline import ItemTimeout, Watchdog


def watchdog_threads() -> int:
    return sum(thread.name == "rlvr-verify-watchdog" for thread in threading.enumerate())


def test_in_process_scoring_leaves_no_watchdog_thread_behind():
    """Each in-process scoring call (one per generation round of a loop) starts a watchdog: it must end with the
    call (more than 40 such threads were left after 30 overlapped steps)."""
    before = watchdog_threads()
    pool = VerifierPool(workers=0, item_timeout=5.0)
    for _ in range(5):
        scored = list(pool.score([({"domain": "math", "answer": "1/2", "prompt": "?"}, r"\boxed{0.5}", "math")]))
        assert scored[0].reward == 1.0
    assert watchdog_threads() == before


def test_a_watchdog_bounds_a_block_until_it_is_closed():
    watchdog = Watchdog()
    with pytest.raises(ItemTimeout, match="timed out after 0.2 s"):
        with watchdog.within(0.2):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # pure Python: the asynchronous exception lands here
                pass
    with watchdog.within(5):  # a block that ends in time is left alone
        pass
    watchdog.close()
    assert not watchdog._thread.is_alive()
