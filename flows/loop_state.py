"""Where the RL loop stands in a lake, read without Prefect: what `rlvr run` resumes from, and whether
it has anything left to do (a run with nothing to do starts no orchestration at all)."""

from __future__ import annotations

import pyarrow.compute as pc

from storage.lake import Lake
from storage.registry import BRANCH


def resume_point(lake: Lake) -> tuple[int, int | None]:
    """(next iteration, version it already trained or None)."""
    done = lake.read("iteration_metrics", columns=["iteration"])["iteration"]
    iteration = int(done.max() or 0) + 1
    trained = lake.read(
        "model_versions",
        filter=(pc.field("iteration") == iteration) & (pc.field("kind") != BRANCH),
        columns=["model_version"],
    )
    return iteration, (int(trained["model_version"].max()) if not trained.is_empty() else None)


def nothing_left(lake: Lake, target: int, warmup: bool) -> bool:
    """The lake already holds `target` recorded iterations (and the warm-up's starting point, if one is asked for)."""
    if warmup and lake.read("iteration_metrics", filter=pc.field("iteration") == 0, columns=["iteration"]).is_empty():
        return False
    return resume_point(lake)[0] > target
