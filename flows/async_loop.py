"""Overlapped iterations (`loop.mode: async`): the next iterations are sampled while one trains.

Two roles, handing off through the lake (`flows/handoff.py`):

- the sampler samples and scores iteration i from the newest published version, but never so early
  that its rollouts would lag the version that trains on them by more than `loop.max_staleness`; the
  iteration's rollouts and rewards are committed before it is handed over;
- the trainer takes the iterations in order: advantages against the version it trains (staleness and
  freshness classes, truncated importance weights from the stored behaviour log-probs) and the training
  step; publishing the new version, handing it to the sampler, evaluation and the record follow in a
  thread beside the next step (`Beside`), one version after another, so they are off the trainer's path.

`loop.roles: threads` runs both in the loop's flow run (the sampler in the calling thread: in-process
scoring wants the main thread; the trainer beside it under the sampler's lease); `deployments` runs
each as its own flow run on whatever workers take them (`flows/async_workers.py`); the roles themselves are
`flows/async_roles.py`'s.

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
from typing import Any
from uuid import UUID

from prefect.artifacts import update_progress_artifact

from flows.artifacts import Publisher
from flows.async_roles import sample_role, train_role
from flows.async_workers import on_workers
from flows.handoff import Handoff, Plan, RoleFailed
from flows.loop_state import resume_point
from flows.run_config import RunConfig
from policy.checkpoints import import_model_code
from policy.threads import cores_given, use_given_cores
from storage import leases
from storage.lake import Lake
from storage.registry import latest_version
from tasks.iteration import IterationConfig


def overlapped_iterations(
    lake: Lake, settings: RunConfig, iteration_config: IterationConfig, total: int, progress: UUID, artifacts: Publisher
) -> list[dict[str, Any]]:
    """The next `total` iterations, sampling ahead of training by at most `loop.max_staleness` versions."""
    import_model_code()  # before any second thread loads a policy
    first, already_trained = resume_point(lake)
    plan = Plan(
        handoff=uuid.uuid4().hex,
        first=first,
        total=total,
        start=latest_version(lake),
        already_trained=already_trained,
        lease_epoch=leases.epoch_held(lake.location, leases.LOOP),
    )
    if settings.loop.roles == "deployments":
        return on_workers(lake, settings, plan, progress)
    rows: list[dict[str, Any]] = []
    sampler_thread = threading.get_ident()  # holds the loop lease; the trainer works under it
    trainer_failure: list[BaseException] = []

    def train() -> None:
        try:
            with leases.helping(lake.location, leases.LOOP, sampler_thread):
                train_role(lake, settings, iteration_config, plan, artifacts, recorded)
        except BaseException as error:  # the sampler stops at its next wait
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
        if trainer_failure:  # the trainer's own error says more than the sampler's wait
            raise trainer_failure[0] from None
        raise
    finally:
        Handoff(lake, plan, "sampler").close()
    if trainer_failure:  # it failed after the sampler's last wait
        raise trainer_failure[0]
    return rows


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
        use_given_cores()  # the whole share again for what follows
