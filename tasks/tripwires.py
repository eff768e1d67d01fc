"""A tripwire's checks as sentences: each signal's value against its configured bound, shared by the collapse
tripwires of a self-rewarded run (`reward.tripwire`, tasks/rewards/collapse.py) and of self-play
(`selfplay.tripwire`, tasks/selfplay/health.py). Pure; below every stage package, so neither imports the other."""

from __future__ import annotations

from typing import NamedTuple


class Check(NamedTuple):
    """One tripwire check: a signal's value against its configured bound (None: not measured, or off)."""

    label: str
    value: float | None
    bound: float | None
    field: str
    shown: str = "{:.1%}"  # how the value reads
    bound_shown: str = "{:g}"  # how the bound reads
    is_max: bool = False  # fires above the bound (else below)


def fired(checks: list[Check], section: str) -> list[str]:
    """A sentence for each check past its bound, naming the signal, its value and `section`.field with the bound."""
    return [
        f"{c.label} {c.shown.format(c.value)} {'above' if c.is_max else 'below'} {section}.{c.field} "
        f"{c.bound_shown.format(c.bound)}"
        for c in checks
        if c.bound is not None and c.value is not None and ((c.value > c.bound) if c.is_max else (c.value < c.bound))
    ]
