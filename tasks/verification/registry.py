"""Every verifier, registered: building one by name from here imports them all first (the rule-based ones of
`tasks/verifiers/`, the self-play and RISE ones of `tasks/proposals/`, the workspace one of `tasks/workspaces/`).

`base.py` holds the registry itself and knows no verifier; a verifier that wraps another by name (the process
and control verifiers) looks it up there when it runs, by which time whoever built it from here has
registered every one."""

from __future__ import annotations

from typing import Any

from tasks.proposals import verifiers as proposal_verifiers  # noqa: F401
from tasks.verifiers import (  # noqa: F401
    code,
    controls,
    formats,
    games,
    gym,
    judge,
    math,
    process,
    qa,
    sat,
    translation,
)
from tasks.verifiers.base import VERIFIERS, Verifier, build_registered
from tasks.workspaces import verifier as workspace_verifier  # noqa: F401


def build_verifier(name: str, **options: Any) -> Verifier:
    """A verifier by registry name (`math`, `code`, `gym`, `qa`, `random`, ...) with its options."""
    return build_registered(name, **options)


def known_verifiers() -> list[str]:
    """Every registered verifier's name, sorted."""
    return sorted(VERIFIERS)
