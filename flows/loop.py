"""The RL loop: K iterations of rollout → verify → advantages → train → evaluate, resumable; one after
another (`loop.mode: sync`) or overlapped (`async`: `flows/async_loop.py`).

The loop keeps no state of its own between runs: where to resume is read from the lake (within a run it
keeps only what each iteration is compared with, `flows/loop_steps.Baselines`). The next iteration is
the one after the last with a row in `iteration_metrics`; if that iteration already registered a
trained version (a crash after training), it is not sampled or trained again, only evaluated and
recorded, so no iteration is repeated or lost.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import polars as pl
import pyarrow.compute as pc
from prefect import flow
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.runtime import flow_run

from flows.artifacts import Publisher, publishing
from flows.async_loop import overlapped_iterations
from flows.iteration import iteration_step, train_step
from flows.loop_state import resume_point
from flows.loop_steps import evaluate_and_record, finish_iteration, iteration_sections, sampling_config
from flows.policies import stage_task, writes_iterations
from flows.publishing import publish_version
from flows.run_config import RunConfig
from flows.warmup import run_warmup, warmup_version
from policy import vllm_servers
from policy.checkpoints import adapter_base
from policy.layout import LayoutRefused, preflight, servers_asleep, shared_gpus
from policy.openai_backend import OpenAIBackendConfig
from policy.publish import staged
from storage.lake import Lake
from storage.outputs import Outputs
from storage.progress import track
from storage.registry import version_row
from tasks.evaluation import overall_solve_rate
from tasks.iteration import IterationConfig
from tasks.rollout.stage import current_model_version
from trainers.grpo import rank_devices, strategy_of

warmup_task = stage_task(run_warmup, "supervised-warm-up", gpu=True)


@flow(name="rl-loop", log_prints=True)
@writes_iterations
def rl_loop(
    config: dict[str, Any] | None = None, iterations: int | None = None, lake_uri: str | None = None
) -> list[dict[str, Any]]:
    """Bring the lake to `iterations` RL iterations (default: the config's): a second run resumes where the
    first stopped, and a finished one has nothing left to do."""
    settings = RunConfig.model_validate(config or {})
    lora = settings.train.lora is not None
    launch = settings.rollout.backend == "openai" and settings.rollout.openai.launch > 0
    if launch:  # the names its servers will serve versions under
        settings = with_openai(settings, vllm_servers.launch_config(settings.rollout.openai, lora))
    check_layout(settings)  # before anything is sampled or trained
    lake = Lake.open(lake_uri)
    latest = current_model_version(lake, settings.rollout.base_policy)  # registers version 0 on a new lake
    warm = None
    if settings.warmup.enabled:
        warm = warmup_version(lake)
        if warm is None:
            with lake.run(
                "rl-loop", "warmup", settings.warmup.model_dump(mode="json"), prefect_flow_run_id=flow_run.id
            ) as run:
                warmed = warmup_task(lake, run, settings)
            warm = latest = warmed["model_version"]  # registered as the main line's newest
            print(
                f"warm-up: model version {warm} after {warmed['steps']} steps, held-out sampled solve rate "
                f"{warmed['solve_rate']:.1%} on {settings.warmup.eval_problems} problems"
            )
    if not launch:
        return _loop(lake, settings, latest, warm, iterations)
    base = full_version_under(lake, latest)  # what the servers start on: LoRA versions are adapters of it
    folder = staged(version_row(lake, base)["checkpoint_uri"], settings.publish.staging_dir)
    with vllm_servers.launched(settings.rollout.openai, folder, lora, base) as served:  # stopped when it ends
        return _loop(lake, with_openai(settings, served), latest, warm, iterations)


def with_openai(settings: RunConfig, openai: OpenAIBackendConfig) -> RunConfig:
    """`settings` sampling through `openai`."""
    return settings.model_copy(update={"rollout": settings.rollout.model_copy(update={"openai": openai})})


def full_version_under(lake: Lake, version: int) -> int:
    """`version` when its checkpoint is a full one, else the version whose checkpoint its adapter applies to."""
    root = adapter_base(version_row(lake, version)["checkpoint_uri"])
    if root is None:
        return version
    owners = lake.read("model_versions", filter=pc.field("checkpoint_uri") == root, columns=["model_version"])
    if owners.is_empty():
        raise LookupError(f"model version {version} is an adapter of {root}, which no model version holds")
    return int(owners["model_version"].min())


def _loop(
    lake: Lake, settings: RunConfig, latest: int, warm: int | None, iterations: int | None
) -> list[dict[str, Any]]:
    """The loop once its servers serve: the warm version's evaluation (the curve's start), then the iterations."""
    iteration_config = iteration_sections(settings)
    if warm is not None and lake.read("iteration_metrics", filter=pc.field("iteration") == 0).is_empty():
        publish_version(lake, settings.rollout, settings.publish, warm, "rl-loop", iteration=0)  # the curve's start
        evaluation = evaluate_and_record(lake, settings, warm, iteration=0)
        with lake.run("rl-loop", "record", {}, iteration=0, prefect_flow_run_id=flow_run.id) as run:
            row = {
                "iteration": 0,
                "model_version": warm,
                "trained_version": warm,
                "eval_solve_rate": overall_solve_rate(evaluation),
                "created_at": datetime.now(UTC),
            }
            lake.commit(Outputs().replace("iteration_metrics", pl.DataFrame([row]), {"iteration": 0}), run)
    target = settings.loop.iterations if iterations is None else iterations
    total = max(0, target - resume_point(lake)[0] + 1)
    if total:  # the version sampled next must be served (a resume too)
        publish_version(lake, settings.rollout, settings.publish, latest, "rl-loop")
    progress = create_progress_artifact(0.0, key="rl-loop-progress", description=f"{total} iterations to run")
    iterations_of = overlapped_iterations if settings.loop.mode == "async" else _iterations
    with publishing() as artifacts:  # the artifacts are made beside the loop, not in its way
        return iterations_of(lake, settings, iteration_config, total, progress, artifacts)


def _iterations(
    lake: Lake, settings: RunConfig, iteration_config: IterationConfig, total: int, progress: UUID, artifacts: Publisher
) -> list[dict[str, Any]]:
    """The next `total` iterations one after another, each recorded in `iteration_metrics`."""
    rows, baselines = [], {}
    for _ in track(range(total), "RL loop"):
        iteration, already_trained = resume_point(lake)
        if already_trained is None:
            # the stage flows' steps, run inside this flow run: a subflow costs ~0.5 s of Prefect bookkeeping
            iteration_step(lake, sampling_config(lake, settings, iteration_config), iteration)
            with servers_asleep(settings.rollout.openai, os.environ.get(settings.rollout.openai.api_key_env)):
                version = train_step(lake, settings.train, iteration)["model_version"]
            publish_version(lake, settings.rollout, settings.publish, version, "rl-loop", iteration)
        else:
            version = already_trained
            print(f"iteration {iteration} already trained version {version}: evaluating and recording it")
        rows.append(finish_iteration(lake, settings, iteration, version, artifacts, baselines))
        artifacts(update_progress_artifact, progress, 100 * len(rows) / total)
    return rows


def check_layout(settings: RunConfig) -> None:
    """Refuse devices the trainer would share with the sampling role (unless train.share_devices), and a vLLM
    server's GPU shared without a memory split; print how the GPUs are split."""
    train = settings.train
    devices = rank_devices(train) if strategy_of(train) != "single" else [train.device]
    if settings.rollout.backend == "hf" and not train.share_devices:
        shared = shared_gpus(devices, settings.rollout.devices or [settings.rollout.device])
        if shared:
            raise LayoutRefused(
                f"the trainer ({', '.join(devices)}) and the local sampler (rollout.devices "
                f"{settings.rollout.devices or [settings.rollout.device]}) share GPU(s) {shared}: give "
                "them separate devices, or set train.share_devices: true"
            )
    if settings.rollout.backend == "openai":
        for device in dict.fromkeys(devices):  # a server's GPU needs its memory split all the same
            for line in preflight(device, settings.rollout.openai, settings.loop.mode, gpu_memory_gib(device)):
                print(f"layout: {line}")


def gpu_memory_gib(device: str) -> float | None:
    """The memory of the trainer's GPU, when this host has it (for the layout line)."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(torch.device(device)).total_memory / 2**30
