"""Time travel: the lake's history as versions of `runs` (a *lake version*), and each table's version as of one,
so that a read as of a lake version is consistent across tables."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from storage.arrow_reads import arrow_dataset
from storage.errors import LakeError


class TimeTravel:
    """`Lake`'s versions as of a point in its history."""

    def runs_version(self) -> int | None:
        table = self.table("runs")
        return None if table is None else table.version()

    def versions_as_of(self, as_of: int | str) -> dict[str, int]:
        """The version of each table at a point in the lake's history.

        An integer is a *lake version*: the version of the `runs` table, which advances with every
        run start and end. Each table is taken at the last version written by a run that had
        completed by then, so the snapshot is consistent across tables. An ISO timestamp means
        the lake version current at that instant (from the commits' own millisecond timestamps,
        not the object store's file times).
        """
        lake_version = self.lake_version_at(as_of) if isinstance(as_of, str) and not as_of.isdigit() else int(as_of)
        latest = self.runs_version()
        if latest is None or not 0 <= lake_version <= latest:
            raise LakeError(f"lake version {lake_version} does not exist (latest is {latest})")
        runs = arrow_dataset(self.table("runs", lake_version)).to_table(columns=["status", "table_versions"])
        versions: dict[str, int] = {"runs": lake_version}
        for status, table_versions in zip(runs["status"].to_pylist(), runs["table_versions"].to_pylist()):
            if status != "completed" or not table_versions:
                continue
            for table, version in json.loads(table_versions).items():
                versions[table] = max(version, versions.get(table, -1))
        return versions

    def lake_version_at(self, moment: str) -> int:
        try:
            instant = datetime.fromisoformat(moment)
        except ValueError:
            raise LakeError(f"--as-of {moment!r} is neither a lake version nor an ISO timestamp") from None
        if instant.tzinfo is None:
            instant = instant.replace(tzinfo=UTC)
        runs = self.table("runs")
        history = runs.history() if runs is not None else []
        before = [c["version"] for c in history if c["timestamp"] <= instant.timestamp() * 1000]
        if not before:
            raise LakeError(f"the lake at {self.uri} has no version at or before {instant.isoformat()}")
        return max(before)
