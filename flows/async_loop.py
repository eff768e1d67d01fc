"""Overlapped iterations (`loop.mode: async`): the next iterations are sampled while one trains.

Two roles, handing off through the lake (`flows/handoff.py`):

- the sampler samples and scores iteration i from the newest published version, but never so early
  that its rollouts would lag the version that trains on them by more than `loop.max_staleness`; the
  iteration's rollouts and rewards are committed before it is handed over;
- the trainer takes the iterations in order: advantages against the version it trains (staleness and
  freshness classes, truncated importance weights from the stored behaviour log-probs), the training
  step, publishing the new version, then evaluation and the record.

`loop.roles: threads` runs both in the loop's flow run (the sampler in the calling thread: in-process
scoring wants the main thread; the trainer beside it under the sampler's lease); `deployments` runs
each as its own flow run on whatever workers take them (`flows/async_workers.py`).

Each stage keeps its own run row and one commit per write, so lineage, SQL views and `rlvr stage`
work as in sync mode. A crash leaves iterations sampled but never trained; a resume samples them
again (the rollout stage replaces its slice), so no iteration is lost or repeated. Torch gets half
the cores in each role (`RLVR_TORCH_THREADS`, unless set), so the two do not oversubscribe them.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import uuid
from typing import Any, Callable
from uuid import UUID

from prefect.artifacts import update_progress_artifact

from flows.artifacts import Publisher
from flows.handoff import Handoff, Plan, RoleFailed
from flows.iteration import compute_advantages, rl_iteration, train_policy
from flows.loop_state import resume_point
from flows.loop_steps import finish_iteration, sampling_config
from flows.publishing import publish_version
from flows.run_config import RunConfig
from storage import leases
from storage.lake import Lake
from storage.registry import latest_version
from trainers.threads import cores_given, use_given_cores


def overlapped_iterations(lake: Lake, settings: RunConfig, iteration_config: dict[str, Any], total: int,
                          progress: UUID, artifacts: Publisher) -> list[dict[str, Any]]:
    """The next `total` iterations, sampling ahead of training by at most `loop.max_staleness` versions."""
    first, already_trained = resume_point(lake)
    plan = Plan(handoff=uuid.uuid4().hex, first=first, total=total, start=latest_version(lake),
                already_trained=already_trained, lease_epoch=leases.epoch_held(lake.location, leases.LOOP))
    if settings.loop.roles == "deployments":
        from flows.async_workers import on_workers

        return on_workers(lake, settings, plan, progress)
    rows: list[dict[str, Any]] = []
    sampler_thread = threading.get_ident()             # holds the loop lease; the trainer works under it
    trainer_failure: list[BaseException] = []

    def train() -> None:
        try:
            with leases.helping(lake.location, leases.LOOP, sampler_thread):
                train_role(lake, settings, iteration_config, plan, artifacts, recorded)
        except BaseException as error:                 # the sampler stops at its next wait
            trainer_failure.append(error)

    def recorded(row: dict[str, Any]) -> None:
        rows.append(row)
        artifacts(update_progress_artifact, progress, 100 * len(rows) / total)

    try:
        with half_the_cores():
            trainer = threading.Thread(target=contextvars.copy_context().run, args=(train,), name="rlvr-trainer")
            trainer.start()
            try:
                sample_role(lake, settings, iteration_config, plan)
            finally:
                trainer.join()
    except RoleFailed:
        if trainer_failure:                            # the trainer's own error says more than the sampler's wait
            raise trainer_failure[0] from None
        raise
    finally:
        Handoff(lake, plan, "sampler").close()
    if trainer_failure:                                # it failed after the sampler's last wait
        raise trainer_failure[0]
    return rows


def sample_role(lake: Lake, settings: RunConfig, iteration_config: dict[str, Any], plan: Plan) -> None:
    """Sample and score each iteration from the newest published version, never so early that its rollouts would
    lag the version that trains on them by more than `loop.max_staleness`; hand each over once committed."""
    handoff = Handoff(lake, plan, "sampler")
    handoff.join()
    try:
        for offset in range(plan.total):
            iteration = plan.first + offset
            if offset == 0 and plan.already_trained is not None:
                handoff.sampled(iteration)             # trained before a crash: only evaluated and recorded
                continue
            # the version that trains this iteration is at most `start + offset`: sample no older than k below it
            sampler = handoff.wait_published(plan.start + offset - settings.loop.max_staleness)
            rl_iteration.fn(sampling_config(lake, settings, iteration_config), iteration, lake.uri,
                            model_version=sampler, advantages=False)
            handoff.sampled(iteration)
    except BaseException as error:
        handoff.failed(error)
        raise


def train_role(lake: Lake, settings: RunConfig, iteration_config: dict[str, Any], plan: Plan,
               artifacts: Publisher, recorded: Callable[[dict[str, Any]], None]) -> None:
    """Take the sampled iterations in order: train each, publish the version, evaluate and record it."""
    handoff = Handoff(lake, plan, "trainer")
    handoff.join()
    try:
        for offset in range(plan.total):
            iteration = plan.first + offset
            handoff.wait_sampled(iteration)
            if offset == 0 and plan.already_trained is not None:
                trained = plan.already_trained
                print(f"iteration {iteration} already trained version {trained}: evaluating and recording it")
            else:
                trained = train_one(lake, settings, iteration_config, iteration)
            handoff.published(trained)
            recorded(finish_iteration(lake, settings, iteration, trained, artifacts))
    except BaseException as error:
        handoff.failed(error)
        raise


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
