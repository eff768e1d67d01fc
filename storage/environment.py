"""Settings read from the environment, with an error that names the variable and what it wants."""

from __future__ import annotations

import os


def seconds(name: str, default: float) -> float:
    """The number of seconds environment variable `name` holds, `default` when it is unset or empty."""
    text = os.environ.get(name)
    try:
        return float(text) if text else default
    except ValueError:
        raise ValueError(f"{name}={text!r}: give a number of seconds") from None
