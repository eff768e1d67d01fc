"""The two roles of the overlapped loop (`loop.mode: async`), handing off through the lake (`flows/handoff.py`).

The sampler samples and scores each iteration, never so early that its rollouts would lag the version that trains
on them by more than `loop.max_staleness`; the trainer takes the iterations in order, computes their advantages
against the version it trains and trains it, while publishing, the hand-over, evaluation and the record run
`Beside` it. `flows/async_loop.py` runs both in the loop's flow run; `flows/async_workers.py` runs each as a
flow run of its own deployment."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from flows.artifacts import Publisher
from flows.handoff import Handoff, Plan
from flows.iteration import advantages_step, iteration_step, train_step
from flows.loop_steps import Baselines, finish_iteration, sampling_config
from flows.publishing import publish_version
from flows.run_config import RunConfig
from policy.checkpoints import import_model_code
from storage import leases
from storage.lake import Lake
from storage.registry import latest_version
from tasks.iteration import IterationConfig


def sample_role(lake: Lake, settings: RunConfig, iteration_config: IterationConfig, plan: Plan) -> None:
    """Sample and score each iteration from the newest published version, never so early that its rollouts would
    lag the version that trains on them by more than `loop.max_staleness`; hand each over once committed."""
    handoff = Handoff(lake, plan, "sampler")
    handoff.join()
    try:
        for offset in range(plan.total):
            iteration = plan.first + offset
            if offset == 0 and plan.already_trained is not None:
                handoff.sampled(iteration)  # trained before a crash: only evaluated and recorded
                continue
            # the version that trains this iteration is at most `start + offset`: sample no older than k below it
            sampler = handoff.wait_published(plan.start + offset - settings.loop.max_staleness)
            iteration_step(
                lake,
                sampling_config(lake, settings, iteration_config),
                iteration,
                model_version=sampler,
                advantages=False,
            )
            handoff.sampled(iteration)
    except BaseException as error:
        handoff.failed(error)
        raise


def train_role(
    lake: Lake,
    settings: RunConfig,
    iteration_config: IterationConfig,
    plan: Plan,
    artifacts: Publisher,
    recorded: Callable[[dict[str, Any]], None],
) -> None:
    """Take the sampled iterations in order and train each; what follows a step (publishing the version, handing
    it to the sampler, evaluating and recording it) runs beside the next step, one version after another."""
    handoff = Handoff(lake, plan, "trainer")
    handoff.join()
    baselines: Baselines = {}  # the run's own, as the sync loop keeps them

    def after_training(iteration: int, trained: int, publish: bool) -> None:
        if publish:
            publish_version(lake, settings.rollout, settings.publish, trained, "rl-loop", iteration)
        handoff.published(trained)
        recorded(finish_iteration(lake, settings, iteration, trained, artifacts, baselines))

    import_model_code()  # the thread beside this one loads policies too
    later = Beside(lake, after_training, handoff)
    try:
        for offset in range(plan.total):
            iteration = plan.first + offset
            handoff.wait_sampled(iteration)
            later.raise_failure()
            if offset == 0 and plan.already_trained is not None:
                print(
                    f"iteration {iteration} already trained version {plan.already_trained}: evaluating and recording it"
                )  # the loop published it as it started
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
        if self.failure() is not None:  # after a failure, nothing more: the run stops
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


def train_one(lake: Lake, settings: RunConfig, iteration_config: IterationConfig, iteration: int) -> int:
    """Advantages of a sampled iteration against the version about to train on it, then the training step."""
    parent = latest_version(lake)
    advantages_step(lake, iteration_config, iteration, parent)
    return train_step(lake, settings.train, iteration, parent)["model_version"]
