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
from concurrent.futures import Future, ThreadPoolExecutor
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
from trainers.registry import import_model_code
from trainers.threads import cores_given, use_given_cores


def overlapped_iterations(lake: Lake, settings: RunConfig, iteration_config: dict[str, Any], total: int,
                          progress: UUID, artifacts: Publisher) -> list[dict[str, Any]]:
    """The next `total` iterations, sampling ahead of training by at most `loop.max_staleness` versions."""
    import_model_code()                                # before any second thread loads a policy
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
    """Take the sampled iterations in order and train each; what follows a step (publishing the version, handing
    it to the sampler, evaluating and recording it) runs beside the next step, one version after another."""
    handoff = Handoff(lake, plan, "trainer")
    handoff.join()

    def after_training(iteration: int, trained: int, publish: bool) -> None:
        if publish:
            publish_version(lake, settings.rollout, settings.publish, trained, "rl-loop", iteration)
        handoff.published(trained)
        recorded(finish_iteration(lake, settings, iteration, trained, artifacts))

    import_model_code()                                # the thread beside this one loads policies too
    later = Beside(lake, after_training, handoff)
    try:
        for offset in range(plan.total):
            iteration = plan.first + offset
            handoff.wait_sampled(iteration)
            later.raise_failure()
            if offset == 0 and plan.already_trained is not None:
                print(f"iteration {iteration} already trained version {plan.already_trained}: evaluating and "
                      "recording it")              # the loop published it as it started
                later.submit(iteration, plan.already_trained, False)
            else:
                later.submit(iteration, train_one(lake, settings, iteration_config, iteration), True)
        later.finish()
    except BaseException as error:
        failure = later.finish(raising=False) or error  # a failed publish says more than the wait it caused
        handoff.failed(failure)
        if failure is error:
            raise
        raise failure from None


class Beside:
    """One thread that runs `work` for each submitted item in order, beside the thread that submits them, under
    the same loop lease and Prefect context. Its first failure is handed over (`failed`), so the sampler stops
    rather than waits for a version that will not come, and raised in the submitting thread."""

    def __init__(self, lake: Lake, work: Callable[..., None], handoff: Handoff):
        self.work, self.handoff, self.location = work, handoff, lake.location
        self.owner = leases.holding_thread(lake.location, leases.LOOP)
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="rlvr-after-training")
        self.futures: list[Future] = []

    def submit(self, *args: Any) -> None:
        self.futures.append(self.executor.submit(contextvars.copy_context().run, self._run, *args))

    def _run(self, *args: Any) -> None:
        if self.failure() is not None:                # after a failure, nothing more: the run stops
            return
        with leases.helping(self.location, leases.LOOP, self.owner):
            try:
                self.work(*args)
            except BaseException as error:
                self.handoff.failed(error)
                raise

    def failure(self) -> BaseException | None:
        return next((f.exception() for f in self.futures if f.done() and f.exception() is not None), None)

    def raise_failure(self) -> None:
        if (failure := self.failure()) is not None:
            raise failure

    def finish(self, raising: bool = True) -> BaseException | None:
        """Wait for every submitted item; raise (or return) the first failure."""
        self.executor.shutdown(wait=True)
        failure = self.failure()
        if failure is not None and raising:
            raise failure
        return failure


def train_one(lake: Lake, settings: RunConfig, iteration_config: dict[str, Any], iteration: int) -> int:
    """Advantages of a sampled iteration against the version about to train on it, then the training step."""
    parent = latest_version(lake)
    compute_advantages.fn(iteration, iteration_config, lake.uri, parent)
    return train_policy.fn(iteration, settings.train.model_dump(mode="json"), lake.uri, parent)["model_version"]


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
