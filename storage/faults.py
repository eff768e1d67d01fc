"""Fault injection for the crash tests and `rlvr bench faults`.

`RLVR_FAULT=PATTERN[@N]` kills this process with SIGKILL the Nth time (default: the first) it
passes a point whose name matches the glob PATTERN. Points are named after what just happened:
`run-started:STAGE`, `committed:STAGE:TABLE`, `run-ending:STAGE`, `checkpoint-saved:STAGE`,
`lease-taken:NAME`. With `RLVR_FAULT_HOLD=PATH` the process holds there instead: it writes
`PATH.reached` and waits until PATH exists, then goes on (a test's way to act while a command is
at a known point, e.g. holding the loop lease). Unset (always, outside tests and the benchmark), a
point costs one dict lookup.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import time
from pathlib import Path

FAULT_ENV = "RLVR_FAULT"
HOLD_ENV = "RLVR_FAULT_HOLD"
_passed: dict[str, int] = {}


def point(name: str) -> None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    pattern, _, nth = spec.partition("@")
    if not fnmatch.fnmatchcase(name, pattern):
        return
    _passed[pattern] = _passed.get(pattern, 0) + 1
    if _passed[pattern] != int(nth or 1):
        return
    hold = os.environ.get(HOLD_ENV)
    if not hold:
        os.kill(os.getpid(), signal.SIGKILL)
    Path(hold + ".reached").write_text(name)
    while not Path(hold).exists():
        time.sleep(0.1)
