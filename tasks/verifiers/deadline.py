"""A time bound for scoring in the calling process (`verify.workers: 0`), in any thread.

Worker processes are bounded from outside (the pool kills a worker that misses its deadline). In
the orchestrator's own process nothing can be killed, so a watchdog thread raises `ItemTimeout`
in the scoring thread once its deadline passes (CPython's asynchronous exceptions: delivered at the
next bytecode, which is enough for the pure-Python parsers and sympy a verifier spends its time in;
the answer extraction itself is linear in the response). Signals are not used: math-verify's own
timeouts use SIGALRM, and signals work in the main thread only.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class ItemTimeout(Exception):
    """Scoring one item took longer than its deadline."""


_raise_in = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)
_withdraw_from = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(  # NULL: clear a pending one
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)


class Watchdog:
    """One background thread that bounds successive `within(seconds)` blocks of any thread, until `close()`
    (each in-process scoring call makes one: without it, a loop would leave a thread behind per round)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._armed: tuple[int, float] | None = None  # (thread id, deadline)
        self._fired: int | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._watch, name="rlvr-verify-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def within(self, seconds: float) -> Iterator[None]:
        me = threading.get_ident()
        with self._lock:
            self._armed, self._fired = (me, time.monotonic() + seconds), None
            self._wake.notify()
        try:
            yield
        except ItemTimeout:
            raise ItemTimeout(f"timed out after {seconds:g} s") from None
        finally:
            with self._lock:
                self._armed = None
                if self._fired == me:  # raised but not yet delivered: withdraw it
                    _withdraw_from(me, None)
                    self._fired = None

    def close(self) -> None:
        """End the thread (a block still running is no longer bounded) and wait for it."""
        with self._lock:
            self._closed = True
            self._wake.notify()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _watch(self) -> None:
        with self._lock:
            while not self._closed:
                if self._armed is None:
                    self._wake.wait()
                    continue
                thread, deadline = self._armed
                remaining = deadline - time.monotonic()
                if remaining > 0:
                    self._wake.wait(remaining)
                    continue
                _raise_in(thread, ItemTimeout)
                self._fired, self._armed = thread, None
