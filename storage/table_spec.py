"""What a lake table is: its name, schema, partitioning, the key a replace swaps out and the columns no two visible
rows share; and how every commit writes (Parquet with zstd, the post-commit hooks)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from deltalake import PostCommitHookProperties, WriterProperties

# Every Parquet file the lake writes (stage writes, the runs table, compaction): zstd, not delta-rs's default
# snappy. Measured on rollouts with token ids and behaviour log-probs (`rlvr bench lake-scale`, docs/guarantees.md
# "What a long run's lake costs"): smaller files, and no slower to write or read.
PARQUET_WRITER = WriterProperties(compression="ZSTD")
# After every lake commit: a checkpoint each 100 commits (delta-rs's default: a reader replays at most 100 commit
# files), but not delta-rs's default sweep of expired commit files, which lists the whole log at each commit
# to remove the files older than the log retention (30 days by default): nothing, in any loop younger than that,
# at a cost that grows with the log (ten commits a loop step go to `runs`; `rlvr bench lake-scale`).
# `rlvr lake maintain` removes them, after its checkpoint and at its retention (storage/maintenance.py).
POST_COMMIT = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)


@dataclass(frozen=True)
class TableSpec:
    name: str
    schema: pa.Schema
    partition_by: tuple[str, ...]  # physical partitions of a table made new (an existing one keeps its own)
    description: str
    unique: tuple[str, ...] = ()  # columns no two visible rows may share (a write that would is refused)
    slice_by: tuple[str, ...] = ()  # the key a replace swaps out, when not the partition columns

    @property
    def replace_key(self) -> tuple[str, ...]:
        """The columns a replace's key must give: the slice one stage run owns."""
        return self.slice_by or self.partition_by


def column(name: str, type_: pa.DataType, nullable: bool = True, doc: str = "") -> pa.Field:
    """A column of the contract, its one-line description kept in the Parquet field's metadata."""
    return pa.field(name, type_, nullable=nullable, metadata={"doc": doc} if doc else None)
