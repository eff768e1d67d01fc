"""Overlapped iterations (`loop.mode: async`): the next iterations are sampled while one trains.

Two workers in the loop's flow run, handing off through the lake:

- the sampler (the calling thread: in-process scoring wants the main thread) samples and scores
  iteration i from the newest version, but never so early that its rollouts would lag the version
  that trains on them by more than `loop.max_staleness`; the iteration's rollouts and rewards are
  committed before its number goes on the queue;
- the trainer (a thread beside it) takes the iterations in order: advantages against the version it
  trains (staleness and freshness classes, truncated importance weights from the stored behaviour
  log-probs), the training step, publishing the new version, then evaluation and the record.

Each stage keeps its own run row and one commit per write, so lineage, SQL views and `rlvr stage`
work as in sync mode. A crash leaves iterations sampled but never trained; a resume samples them
again (the rollout stage replaces its slice), so no iteration is lost or repeated. Torch gets half
the cores in each worker (`RLVR_TORCH_THREADS`, unless set), so the two do not oversubscribe them.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import queue
import threading
from typing import Any
from uuid import UUID

from prefect.artifacts import update_progress_artifact

from flows.artifacts import Publisher
from flows.iteration import compute_advantages, rl_iteration, train_policy
from flows.loop_state import resume_point
from flows.loop_steps import finish_iteration, sampling_config
from flows.publishing import publish_version
from flows.run_config import RunConfig
from storage import leases
from storage.lake import Lake
from storage.registry import latest_version
from trainers.threads import cores_given, use_given_cores


class Versions:
    """The newest trained version, and the trainer's failure, shared by the two workers."""

    def __init__(self, latest: int):
        self.latest = latest
        self.failure: BaseException | None = None
        self.changed = threading.Condition()

    def set(self, latest: int | None = None, failure: BaseException | None = None) -> None:
        with self.changed:
            self.latest = self.latest if latest is None else latest
            self.failure = failure or self.failure
            self.changed.notify_all()

    def wait_for(self, version: int) -> int:
        """Block until `version` (or a newer one) is trained; the trainer's failure is raised here."""
        with self.changed:
            self.changed.wait_for(lambda: self.latest >= version or self.failure is not None)
            if self.failure is not None:
                raise self.failure
            return self.latest


def overlapped_iterations(lake: Lake, settings: RunConfig, iteration_config: dict[str, Any], total: int,
                          progress: UUID, artifacts: Publisher) -> list[dict[str, Any]]:
    """The next `total` iterations, sampling ahead of training by at most `loop.max_staleness` versions."""
    first, already_trained = resume_point(lake)
    start = latest_version(lake)
    versions = Versions(start)
    handed: queue.Queue[tuple[int, int | None] | None] = queue.Queue()
    rows: list[dict[str, Any]] = []

    sampler_thread = threading.get_ident()             # holds the loop lease; the trainer works under it

    def train() -> None:
        try:
            with leases.helping(lake.location, leases.LOOP, sampler_thread):
                train_all()
        except BaseException as error:                 # the sampler stops at its next wait
            versions.set(failure=error)

    def train_all() -> None:
        while (item := handed.get()) is not None:
            iteration, trained = item
            if trained is None:
                trained = train_one(lake, settings, iteration_config, iteration)
            else:
                print(f"iteration {iteration} already trained version {trained}: evaluating and recording it")
            versions.set(trained)
            rows.append(finish_iteration(lake, settings, iteration, trained, artifacts))
            artifacts(update_progress_artifact, progress, 100 * len(rows) / total)

    with half_the_cores():
        trainer = threading.Thread(target=contextvars.copy_context().run, args=(train,), name="rlvr-trainer")
        trainer.start()
        try:
            for offset in range(total):
                iteration = first + offset
                if offset == 0 and already_trained is not None:
                    handed.put((iteration, already_trained))
                    continue
                # the version that trains this iteration is at most `start + offset`: sample no older than k below it
                sampler = versions.wait_for(start + offset - settings.loop.max_staleness)
                rl_iteration.fn(sampling_config(lake, settings, iteration_config), iteration, lake.uri,
                                model_version=sampler, advantages=False)
                handed.put((iteration, None))
        finally:
            handed.put(None)
            trainer.join()
    if versions.failure is not None:                  # it failed after the sampler's last wait
        raise versions.failure
    return rows


def train_one(lake: Lake, settings: RunConfig, iteration_config: dict[str, Any], iteration: int) -> int:
    """Advantages of a sampled iteration against the version about to train on it, the step, the publish."""
    parent = latest_version(lake)
    compute_advantages.fn(iteration, iteration_config, lake.uri, parent)
    version = train_policy.fn(iteration, settings.train.model_dump(mode="json"), lake.uri, parent)["model_version"]
    publish_version(lake, settings.rollout, settings.publish, version, "rl-loop", iteration)
    return version


@contextlib.contextmanager
def half_the_cores():
    """Each of the two workers runs torch on half the cores (at least one), unless RLVR_TORCH_THREADS says."""
    if "RLVR_TORCH_THREADS" in os.environ:
        yield
        return
    os.environ["RLVR_TORCH_THREADS"] = str(max(1, cores_given() // 2))
    try:
        yield
    finally:
        os.environ.pop("RLVR_TORCH_THREADS", None)
        use_given_cores()                             # the whole share again for what follows
