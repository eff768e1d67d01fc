"""One torch process, one share of the cores: intra-op threads = the cores this process may run on.

torch's default is the machine's physical cores, whatever the process was given (a container's CPU
set, `taskset`, a Dask worker's slice); two such processes on 2 cores would each run 2 threads and
slow each other down. `RLVR_TORCH_THREADS` overrides. Results are bit-reproducible only at the same
thread count on the same machine (float sums are reduced in a different order otherwise), which is
why the count is recorded with every trained version.
"""

from __future__ import annotations

import os


def cores_given() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def torch_threads() -> int:
    """The thread count torch should use here: RLVR_TORCH_THREADS, else the cores this process may use."""
    text = os.environ.get("RLVR_TORCH_THREADS")
    if text is None:
        return cores_given()
    try:
        threads = int(text)
    except ValueError:
        raise ValueError(f"RLVR_TORCH_THREADS={text!r}: give a whole number of threads, e.g. 2") from None
    if threads < 1:
        raise ValueError(f"RLVR_TORCH_THREADS={text!r}: at least 1 thread")
    return threads


def use_given_cores() -> int:
    """Set torch's intra-op thread count (idempotent, cheap); returns it."""
    import torch

    threads = torch_threads()
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
