"""Resource limits of one sandboxed run."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 5              # RLIMIT_CPU of each process
    wall_seconds: float = 10.0        # the whole run, all processes, then everything is killed
    memory_mb: int = 1024             # RLIMIT_AS (address space) of each process
    file_size_mb: int = 16            # RLIMIT_FSIZE: the largest file it may write
    processes: int = 16               # RLIMIT_NPROC for the run's own user id
    open_files: int = 64              # RLIMIT_NOFILE
    output_bytes: int = 1_000_000     # stdout + stderr kept; beyond this the run is killed

    def to_dict(self) -> dict:
        return asdict(self)
