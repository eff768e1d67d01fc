"""Run records: the lineage spine every write hangs from."""

from __future__ import annotations

import json
import secrets
import subprocess
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any


@lru_cache(maxsize=1)
def code_version() -> str:
    """The git commit of this code (suffixed `+dirty` with uncommitted changes), else the package version."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        try:
            return "rlvr-platform==" + metadata.version("rlvr-platform")
        except metadata.PackageNotFoundError:
            return "unknown"


def new_run_id() -> str:
    """Sortable by start time, unique across machines: `20261129T140301-3f9a1c2b`."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(4)


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Run:
    """One execution of one stage. Writes made under it are tagged with its id and recorded here."""

    flow: str
    stage: str
    parameters: dict[str, Any]
    bank_version: int | None = None
    iteration: int | None = None
    prefect_flow_run_id: str | None = None
    run_id: str = field(default_factory=new_run_id)
    started_at: datetime = field(default_factory=utc_now)
    table_versions: dict[str, int] = field(default_factory=dict)
    rows_written: dict[str, int] = field(default_factory=dict)

    slice_rows: dict[tuple[str, str], int] = field(default_factory=dict)

    def record_write(self, table: str, version: int, rows: int, slice_key: str | None = None) -> None:
        """Remember a committed write. Replacing the same slice again (a retried task) counts once."""
        self.table_versions[table] = version
        if slice_key is None:
            self.rows_written[table] = self.rows_written.get(table, 0) + rows
            return
        self.slice_rows[(table, slice_key)] = rows
        self.rows_written[table] = sum(n for (name, _), n in self.slice_rows.items() if name == table)

    def row(self, status: str, ended_at: datetime | None = None, error: str | None = None) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "flow": self.flow,
            "stage": self.stage,
            "bank_version": self.bank_version,
            "iteration": self.iteration,
            "parameters": json.dumps(self.parameters, sort_keys=True, default=str),
            "code_version": code_version(),
            "prefect_flow_run_id": self.prefect_flow_run_id,
            "started_at": self.started_at,
            "ended_at": ended_at,
            "status": status,
            "error": error,
            "table_versions": json.dumps(self.table_versions, sort_keys=True),
            "rows_written": json.dumps(self.rows_written, sort_keys=True),
        }
