"""Resource limits of one sandboxed run. Memory, processes, CPU time, wall time and output are budgets
of the whole run (all its processes together), not of each process."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 5  # CPU time of the whole run (every process summed); also each process's RLIMIT_CPU
    wall_seconds: float = 10.0  # the whole run, all processes, then everything is killed
    test_seconds: float = 3.0  # one test case (a call of the candidate, its load included): then it fails
    memory_mb: int = 1024  # memory of the whole run: every process and its private tmpfs together
    scratch_mb: int = 64  # the run's private tmpfs (its working folder and /tmp), inside memory_mb
    file_size_mb: int = 16  # RLIMIT_FSIZE: the largest file it may write
    processes: int = 16  # processes of the run at once (its first one included)
    open_files: int = 64  # RLIMIT_NOFILE of each process
    output_bytes: int = 1_000_000  # stdout + stderr of all its processes; beyond this the run is killed

    def __post_init__(self) -> None:
        if self.scratch_mb >= self.memory_mb:
            raise ValueError(f"scratch_mb ({self.scratch_mb}) must be below memory_mb ({self.memory_mb})")
        if self.processes < 1 or self.test_seconds <= 0 or self.wall_seconds <= 0:
            raise ValueError("processes, test_seconds and wall_seconds must be positive")

    def to_dict(self) -> dict:
        return asdict(self)
