"""Prefect artifacts of the loop: what each iteration did, visible in the UI without reading logs."""

from __future__ import annotations

import contextvars
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import polars as pl
import pyarrow.compute as pc
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.runtime import task_run

from storage.lake import Lake


def solve_rate_table(lake: Lake, iteration: int) -> list[dict[str, Any]]:
    """Training groups' solve rate by level and by source for one iteration."""
    groups = lake.read(
        "groups",
        filter=pc.field("iteration") == iteration,
        columns=["problem_id", "solve_rate", "kept", "filter_reason"],
    )
    problems = lake.read(
        "problems",
        filter=pc.field("problem_id").isin(groups["problem_id"].unique().to_list()),
        columns=["problem_id", "level", "source"],
    ).unique("problem_id")
    joined = groups.join(problems, on="problem_id")
    by = joined.group_by("level", "source").agg(
        groups=pl.len(), solve_rate=pl.col("solve_rate").mean().round(3), kept=pl.col("kept").sum()
    )
    return by.sort("level", "source").to_dicts()


class Publisher:
    """Runs artifact work (reads of the lake, then Prefect API calls of about 20 ms each against a local server)
    on a thread of its own, in the order asked: the loop need not wait on the UI. The thread runs in the
    caller's context, so each artifact belongs to the caller's flow run. Closing waits for what is queued; a
    failed call is logged, never raised: an artifact must not fail the run it reports on."""

    def __init__(self) -> None:
        self._calls: queue.Queue = queue.Queue()
        self._thread = threading.Thread(
            target=contextvars.copy_context().run, args=(self._work,), name="rlvr-artifacts", daemon=True
        )
        self._thread.start()

    def __call__(self, make: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._calls.put((make, args, kwargs))

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            make, args, kwargs = call
            try:
                make(*args, **kwargs)
            except Exception as error:  # noqa: BLE001
                logging.getLogger("rlvr.artifacts").warning(
                    "artifact %s not published: %s", kwargs.get("key", make.__name__), error
                )

    def close(self, timeout: float = 120.0) -> None:
        self._calls.put(None)
        self._thread.join(timeout)


@contextmanager
def publishing() -> Iterator[Publisher]:
    """A Publisher for the length of the block, closed (its queue drained) when the block ends."""
    publisher = Publisher()
    try:
        yield publisher
    finally:
        publisher.close()


def publish_iteration(lake: Lake, row: dict[str, Any]) -> None:
    """A table of solve rate by level and source, and a markdown summary of the iteration."""
    iteration = row["iteration"]
    create_table_artifact(
        key="rl-iteration-solve-rates",
        table=solve_rate_table(lake, iteration),
        description=f"iteration {iteration}: training groups by level and source",
    )
    filters = lake.read("groups", filter=pc.field("iteration") == iteration, columns=["filter_reason"])
    outcomes = sorted(filters.group_by("filter_reason").len().rows(), key=lambda r: str(r[0]))
    create_table_artifact(
        key="rl-iteration-filters",
        table=[
            {"outcome": reason or "kept", "groups": count, "share": round(count / max(filters.height, 1), 3)}
            for reason, count in outcomes
        ],
        description=f"iteration {iteration}: what dynamic sampling did with the drawn groups",
    )
    freshness = lake.read(
        "advantages", filter=pc.field("iteration") == iteration, columns=["freshness", "staleness", "importance_weight"]
    )
    create_table_artifact(
        key="rl-iteration-staleness",
        table=freshness.group_by("freshness")
        .agg(
            rollouts=pl.len(),
            mean_staleness=pl.col("staleness").mean().round(2),
            mean_importance_weight=pl.col("importance_weight").mean().round(3),
        )
        .sort("freshness")
        .to_dicts(),
        description=f"iteration {iteration}: rollouts by freshness against the training version",
    )
    lines = [
        f"# Iteration {iteration}",
        f"- sampled by model version {row['model_version']}, trained version {row['trained_version']}",
        f"- groups: {row['groups']} drawn, {row['groups_kept']} kept; "
        + ", ".join(f"{reason or 'kept'} {count}" for reason, count in outcomes),
        f"- learning-zone share {_percent(row['learning_zone_share'])}, mean reward {_number(row['mean_reward'])}, "
        f"mean staleness {_number(row['mean_staleness'])}",
        f"- loss {_number(row['loss'])}, clip fraction {_number(row['clip_fraction'])}, "
        f"entropy {_number(row['entropy'])}",
        f"- solve rate by level: {row['solve_rate_by_level']}",
        f"- held-out sampled solve rate: {_percent(row['eval_solve_rate'])}",
    ]
    create_markdown_artifact(
        key="rl-iteration-summary", markdown="\n".join(lines), description=f"iteration {iteration} at a glance"
    )


def _percent(value) -> str:
    return "not measured" if value is None else f"{value:.1%}"


def _number(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys are lowercase letters, digits and dashes; counts are dropped so that the
    same work keeps one key from run to run."""
    words = re.findall(r"[a-z]+(?:[0-9]+[a-z]*)?", " ".join(parts).lower())
    return "-".join(words)[:100]


PROGRESS_AFTER_SECONDS = 2.0  # a tracked loop gets an artifact once it has run this long,
PROGRESS_EVERY_SECONDS = 1.0  # then an update at most this often (and one at the end)


def progress_listener():
    """A listener for `storage.progress.reporting_to`: each tracked loop of a task run that lasts more than a
    couple of seconds is a progress artifact (key `<task>-<loop>`, e.g. `score-rollouts-verifying`),
    updated every 5 % and at most once a second."""
    artifact_ids: dict[str, Any] = {}
    task_name = task_run.task_name or "stage"
    failed: list[str] = []
    first_heard: dict[str, float] = {}
    last_sent: dict[str, float] = {}

    def update(description: str, done: int, total: int) -> None:
        if failed:
            return
        now = time.monotonic()
        started = first_heard.setdefault(description, now)
        if description not in artifact_ids and now - started < PROGRESS_AFTER_SECONDS:
            return  # a loop done within seconds needs no artifact: each API call costs ~10 ms
        if done < total and now - last_sent.get(description, 0.0) < PROGRESS_EVERY_SECONDS:
            return
        last_sent[description] = now
        percent, text = round(100 * done / total, 1), f"{description}: {done:,} of {total:,}"
        try:
            if description in artifact_ids:
                update_progress_artifact(artifact_ids[description], percent, description=text)
            else:
                artifact_ids[description] = create_progress_artifact(
                    percent, key=artifact_key(task_name, description), description=text
                )
        except Exception as error:  # noqa: BLE001 - a progress report must never fail the stage it reports on
            failed.append(str(error))
            logging.getLogger("rlvr.progress").warning("progress artifacts stopped for %s: %s", task_name, error)

    return update
