"""The overlapped loop on Prefect workers (`loop.mode: async`, `loop.roles: deployments`).

The loop's flow run holds the lake's `loop` lease and starts two flow runs of their own deployments,
`rollout-producer` (the sampler) and `policy-trainer` (the trainer), which any workers of their work
pool take: two processes on one machine, or the sampler on a GPU machine beside vLLM and the trainer
on another. Each joins the lease epoch of the run that started it (`leases.joining`), so a second
loop is still refused, and a worker whose loop died or was taken over writes nothing more. The two
hand off through the lake (`flows/handoff.py`), exactly as the threads of `loop.roles: threads` do.

The loop's flow run watches both: when one fails, crashes or is cancelled, the other is cancelled and
the loop fails naming it; a role that no worker starts within `loop.worker_timeout` fails the loop
with the command that starts a worker. It returns the iterations' `iteration_metrics` rows.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pyarrow.compute as pc
from prefect import flow
from prefect.artifacts import update_progress_artifact

from flows.artifacts import publishing
from flows.async_roles import sample_role, train_role
from flows.handoff import Handoff, Plan
from flows.loop_steps import iteration_sections
from flows.policies import without_flow_heartbeats
from flows.run_config import RunConfig
from storage import leases
from storage.lake import Lake


def on_workers(lake: Lake, settings: RunConfig, plan: Plan, progress: UUID) -> list[dict[str, Any]]:
    """Start the two roles' flow runs, wait for both, and return the iterations they recorded."""
    parameters = {"lake_uri": lake.uri, "config": settings.model_dump(mode="json"), "plan": plan.as_dict()}
    roles = {"sampler": settings.loop.sampler_deployment, "trainer": settings.loop.trainer_deployment}
    try:
        runs = {role: start(name, parameters) for role, name in roles.items()}
        print(
            "overlapped loop on workers: "
            + ", ".join(f"{role} {roles[role]} flow run {run}" for role, run in runs.items())
        )
        watch(lake, plan, roles, runs, settings.loop.worker_timeout, progress)
    finally:
        Handoff(lake, plan, "sampler").close()
    last = plan.first + plan.total - 1
    recorded = lake.read(
        "iteration_metrics", filter=(pc.field("iteration") >= plan.first) & (pc.field("iteration") <= last)
    )
    return recorded.sort("iteration").to_dicts()


def start(deployment: str, parameters: dict[str, Any]) -> UUID:
    """A flow run of `deployment`, linked to the loop's flow run in the UI; not waited for."""
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL

    try:
        return run_deployment(deployment, parameters=parameters, timeout=0).id
    except ObjectNotFound:
        raise RuntimeError(
            f"loop.roles deployments: the deployment {deployment!r} is not registered on the "
            f"Prefect server at {PREFECT_API_URL.value()}: `prefect deploy --name {deployment}` "
            "(prefect.yaml) registers it"
        ) from None


OTHER_ROLE_GRACE = 30.0  # seconds a role that stopped for the other's sake waits for that one's own state


def watch(
    lake: Lake, plan: Plan, roles: dict[str, str], runs: dict[str, UUID], worker_timeout: float, progress: UUID
) -> None:
    """Until both flow runs completed; the first that ends otherwise (or is never started) fails the loop."""
    from prefect.client.orchestration import get_client

    started_at, done, grace_until = time.monotonic(), 0, None
    with get_client(sync_client=True) as client:
        while True:
            states = {role: client.read_flow_run(run).state for role, run in runs.items()}
            if all(state is not None and state.is_completed() for state in states.values()):
                return
            ended = [
                role
                for role, state in states.items()
                if state is not None and state.is_final() and not state.is_completed()
            ]
            unstarted = [
                role for role, state in states.items() if state is None or state.is_scheduled() or state.is_pending()
            ]
            waited_on = [role for role in ended if "RoleFailed" in (states[role].message or "")]
            if ended and len(waited_on) == len(ended) and len(ended) < len(states):
                # it stopped because the other role did: let the other's own end (a crash, say) arrive first
                grace_until = grace_until or time.monotonic() + OTHER_ROLE_GRACE
                if time.monotonic() < grace_until:
                    time.sleep(1.0)
                    continue
            if ended or (unstarted and time.monotonic() - started_at > worker_timeout):
                cancel_unfinished(client, runs)
                if ended:
                    ended.sort(key=lambda role: "RoleFailed" in (states[role].message or ""))  # the cause first
                    state = states[ended[0]]
                    raise RuntimeError(
                        f"the overlapped loop's {ended[0]} ({roles[ended[0]]}, flow run "
                        f"{runs[ended[0]]}) ended {state.name}: {state.message}"
                    )
                raise RuntimeError(
                    f"no worker started the {unstarted[0]}'s flow run ({roles[unstarted[0]]}) in "
                    f"{worker_timeout:.0f} s: start one for its work pool (`prefect worker start "
                    "--pool rlvr`), or raise loop.worker_timeout"
                )
            recorded = lake.read(
                "iteration_metrics", columns=["iteration"], filter=pc.field("iteration") >= plan.first
            ).height
            if recorded != done:
                done = recorded
                update_progress_artifact(progress, 100 * done / plan.total)
            time.sleep(1.0)


def cancel_unfinished(client, runs: dict[str, UUID]) -> None:
    from prefect.states import Cancelling

    for run in runs.values():
        state = client.read_flow_run(run).state
        if state is None or not state.is_final():
            client.set_flow_run_state(run, Cancelling(message="the overlapped loop's other role stopped"), force=True)


@contextlib.contextmanager
def as_role(
    role: str, lake_uri: str | None, config: dict[str, Any] | None, plan: dict[str, Any] | None
) -> Iterator[tuple[Lake, RunConfig, dict[str, Any], Plan]]:
    """A role's flow run: under the loop lease epoch of the run that started it. Its failure to join is
    handed over too, so the other role stops rather than waits."""
    if plan is None:
        raise ValueError(
            f"the {role}'s flow run is started by an async rl-loop with loop.roles: deployments, "
            "which passes its plan; it does not run on its own"
        )
    settings, lake, agreed = RunConfig.model_validate(config or {}), Lake.open(lake_uri), Plan(**plan)
    iteration_config = iteration_sections(settings)
    try:
        joined = leases.joining(lake.location, leases.LOOP, agreed.lease_epoch)
        joined.__enter__()
    except BaseException as error:
        Handoff(lake, agreed, role).failed(error)
        raise
    try:
        with without_flow_heartbeats():
            yield lake, settings, iteration_config, agreed
    finally:
        joined.__exit__(None, None, None)


@flow(name="rollout-producer", log_prints=True)
def rollout_producer(
    lake_uri: str | None = None, config: dict[str, Any] | None = None, plan: dict[str, Any] | None = None
) -> None:
    """The overlapped loop's sampler as a flow run of its own (started by an async rl-loop on workers)."""
    with as_role("sampler", lake_uri, config, plan) as (lake, settings, iteration_config, agreed):
        sample_role(lake, settings, iteration_config, agreed)


@flow(name="policy-trainer", log_prints=True)
def policy_trainer(
    lake_uri: str | None = None, config: dict[str, Any] | None = None, plan: dict[str, Any] | None = None
) -> None:
    """The overlapped loop's trainer as a flow run of its own: train, publish, evaluate and record each iteration."""
    with (
        as_role("trainer", lake_uri, config, plan) as (lake, settings, iteration_config, agreed),
        publishing() as artifacts,
    ):
        train_role(lake, settings, iteration_config, agreed, artifacts, lambda row: None)
