"""The lake: Delta tables with explicit schemas, one transaction per write, a run row per stage. `Lake` is the one
front over its rooms: reads and the process's snapshots (`snapshots.py`), which rows are visible
(`visibility.py`), writes and their conditions (`writes.py`), the run ledger and leases (`ledger.py`) and time
travel (`time_travel.py`).
"""

from __future__ import annotations

import os

from storage.errors import LakeError, LeaseHeld, LeaseLost  # noqa: F401  (re-exported: callers catch them here)
from storage.ledger import RunLedger
from storage.location import LakeLocation
from storage.snapshots import SnapshotReads
from storage.time_travel import TimeTravel
from storage.visibility import Visibility
from storage.writes import Condition, RowData, Writes, retry_on_conflict  # noqa: F401  (re-exported)


class Lake(SnapshotReads, Visibility, Writes, RunLedger, TimeTravel):
    def __init__(self, location: LakeLocation):
        self.location = location

    @classmethod
    def open(cls, uri: str | None = None) -> Lake:
        location = LakeLocation.resolve(uri)
        if not location.is_s3 and os.path.exists(location.uri) and not os.path.isdir(location.uri):
            raise LakeError(f"lake location {location.uri} is a file, not a folder")
        return cls(location)

    @property
    def uri(self) -> str:
        return self.location.uri
