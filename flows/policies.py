"""How stage tasks meet failures, shared hardware and other writers.

Transient failures (an inference server down for a restart, a storage or network timeout) are
retried by Prefect after a delay; anything else (a bad config, a refused request, a bug) fails at
once. Tasks that hold an accelerator carry the `gpu` tag while a `gpu` concurrency limit exists
(`prefect concurrency-limit create gpu 1`), which then serialises them across every flow run and
worker: a scheduling aid. Without one they run untagged, because a tagged task run asks the server
for slots (a write) every 5 s, and on a busy 2-core host that request sometimes waits 2 s.
Correctness does not rest on it: flows that write iterations or train hold the lake's own `loop`
lease (`writes_iterations`), which a second writer cannot take.
"""

from __future__ import annotations

import functools
import inspect
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from prefect import Task, tags
from prefect.cache_policies import NO_CACHE

from flows.artifacts import progress_listener
from policy.openai_backend import BackendUnavailable, RequestRefused
from storage.lake import Lake
from storage.leases import LOOP
from storage.outputs import Outputs
from storage.progress import reporting_to
from storage.runs import Run

GPU_TAG = "gpu"
GPU_LIMIT_LOOKUP_SECONDS = 30.0  # how long the answer to "is there a gpu limit?" is kept
_gpu_limit_seen: list[tuple[float, bool]] = []  # (monotonic time of the lookup, its answer)


def gpu_limit_exists() -> bool:
    """Whether the Prefect server holds a `gpu` tag concurrency limit; looked up (a read) at most once per
    GPU_LIMIT_LOOKUP_SECONDS. A server that cannot answer counts as having one: the tag is then kept."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    if _gpu_limit_seen and time.monotonic() - _gpu_limit_seen[0][0] < GPU_LIMIT_LOOKUP_SECONDS:
        return _gpu_limit_seen[0][1]
    try:
        with get_client(sync_client=True) as client:
            client.read_global_concurrency_limit_by_name(f"tag:{GPU_TAG}")
        exists = True
    except ObjectNotFound:
        exists = False
    except Exception:  # noqa: BLE001 - an unreachable server: keep the tag, Prefect reports the failure itself
        exists = True
    _gpu_limit_seen[:] = [(time.monotonic(), exists)]
    return exists


class GpuTask(Task):
    """A task that holds the accelerator: run with the `gpu` tag while a `gpu` concurrency limit exists."""

    def __call__(self, *args, **kwargs):
        if not gpu_limit_exists():
            return super().__call__(*args, **kwargs)
        with tags(GPU_TAG):
            return super().__call__(*args, **kwargs)


def retry_delays_from_env(default: list[float]) -> list[float]:
    """RLVR_RETRY_DELAYS="10,30" (seconds before each retry; empty: no retries) overrides the default."""
    text = os.environ.get("RLVR_RETRY_DELAYS")
    if text is None:
        return default
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"RLVR_RETRY_DELAYS={text!r}: give seconds separated by commas, e.g. 10,30") from None


TRANSIENT_RETRY_DELAYS = retry_delays_from_env([10, 30])  # seconds before the first and the second retry
STORAGE_RETRY_DELAYS = [2, 5]  # lake reads and writes done as tasks


def is_transient(error: BaseException) -> bool:
    """An unreachable or overloaded server, a timeout, or a bare OSError (how object stores report a
    failed request); not a refused request, a missing file or a permission error."""
    if isinstance(error, RequestRefused):
        return False
    return isinstance(error, (BackendUnavailable, TimeoutError, ConnectionError)) or type(error) is OSError


def _retry_if_transient(task_, task_run, state) -> bool:
    try:
        state.result()
    except BaseException as error:  # noqa: BLE001 - the failed state's own exception, re-raised here to classify it
        return is_transient(error)
    return False


def stage_task(fn: Callable[..., Any], name: str, gpu: bool = False, retry_delays: list[float] | None = None):
    """A Prefect task over a stage function: no result caching, transient failures retried, `gpu`-tagged
    when it holds the accelerator and a `gpu` limit exists, and its tracked loops published as progress artifacts."""
    delays = TRANSIENT_RETRY_DELAYS if retry_delays is None else retry_delays

    @functools.wraps(fn)
    def with_progress(*args, **kwargs):
        with reporting_to(progress_listener()):
            return fn(*args, **kwargs)

    with_progress.__prefect_task_source__ = fn  # Prefect keys task runs by this function's code, not the wrapper's

    return (GpuTask if gpu else Task)(
        with_progress,
        name=name,
        cache_policy=NO_CACHE,
        retries=len(delays),
        retry_delay_seconds=delays,
        retry_condition_fn=_retry_if_transient,
    )


def writes_iterations(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The flow or step writes iterations or trains: it runs under the lake's `loop` lease (of its `lake`, else
    of `lake_uri`), refused at once while another live process holds it (`rlvr run --wait` takes the lease
    before the flow, to queue instead). Nested flows and steps of the same thread re-enter the lease they
    already hold."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def under_lease(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs).arguments
        with (
            (arguments.get("lake") or Lake.open(arguments.get("lake_uri"))).lease(LOOP),
            without_flow_heartbeats(),
        ):
            return fn(*args, **kwargs)

    return under_lease


@contextmanager
def without_flow_heartbeats() -> Iterator[None]:
    """Flow runs started inside it send no Prefect heartbeats. Prefect joins each flow run's heartbeat thread
    in 1-second sleeps when the run ends, about 1 s a flow run — most of what a stage subflow costs. A dead
    writer is found by the lake's own process records (storage/presence.py), not by these."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    if PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() is None:  # already off (a nested flow): settings cost ~0.1 s to copy
        yield
        return
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def commit_outputs(lake: Lake, outputs: Outputs, run: Run) -> list[int | None]:
    """A stage's outputs written with its run, as a task of its own where the write is worth retrying."""
    return lake.commit(outputs, run)
