"""Deployments: the platform's flows with cron schedules, served against a running Prefect server.

`rlvr serve --config configs/deployments.yaml` registers one deployment per entry and runs their
scheduled (and UI-triggered) runs in this process's workers until stopped. Each deployment's
parameters are filled from the run config the file names (its `bank:` section for curation, the
stage sections for the rest), so the UI shows, and lets a user edit, exactly what a run will use.
`prefect.yaml` offers the same flows through a work pool and `prefect worker start` instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from storage.config import Strict, read_yaml

FlowKey = Literal[
    "curate", "loop", "iteration", "evaluate", "rescore", "report", "audit", "sampler", "trainer", "maintenance"
]


class DeploymentSpec(Strict):
    """One deployment: a flow, when it runs, and what it is given beyond the run config."""

    name: str = Field(description="deployment name, shown in the UI as <flow name>/<name>")
    flow: FlowKey = Field(
        description="curate, loop, iteration, evaluate, rescore, report, audit, maintenance (the "
        "lake's compaction, checkpoints and vacuum), or the async loop's sampler and trainer "
        "(started by the loop with loop.roles: deployments)"
    )
    cron: str | None = Field(None, description="cron schedule (in `timezone`); none: run from the UI or API only")
    parameters: dict[str, Any] = Field(
        default_factory=dict,
        description="flow parameters over the ones built from the run config (e.g. iterations: 100, force: true)",
    )
    description: str | None = Field(None, description="shown in the UI; default: the flow's docstring")
    tags: list[str] = Field(default_factory=list, description="Prefect tags of the deployment's runs")
    paused: bool = Field(False, description="register the schedule paused")

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, cron: str | None) -> str | None:
        if cron is not None:
            from prefect.client.schemas.schedules import CronSchedule

            CronSchedule(cron=cron)  # raises with the reason on a bad expression
        return cron


class ServeConfig(Strict):
    """What `rlvr serve` registers."""

    lake: str | None = Field(
        None, description="the lake every deployment works on (folder or s3://); default: RLVR_LAKE or ./lake"
    )
    run_config: str | None = Field(
        None, description="run config (YAML, relative to this file) the deployments' parameters are built from"
    )
    report_dir: str = Field("report", description="where the report flow writes report.html and its PNGs")
    timezone: str = Field("UTC", description="time zone of the cron schedules")
    deployments: list[DeploymentSpec] = Field(default_factory=list, description="the deployments to register")


def load_serve_config(path: Path) -> tuple[ServeConfig, dict[str, Any]]:
    """The serve config and the run config it names (as a dict; empty without one)."""
    from storage.config import load_yaml_config

    serve = load_yaml_config(path, ServeConfig)
    run_config = read_yaml((path.parent / serve.run_config).resolve()) if serve.run_config else {}
    return serve, run_config


def flow_parameters(spec: DeploymentSpec, serve: ServeConfig, run_config: dict[str, Any]) -> dict[str, Any]:
    """The parameters a deployment's runs get: built from the run config, then the spec's own."""
    sections = lambda names: {name: run_config[name] for name in names if name in run_config}  # noqa: E731
    built: dict[str, Any] = {"lake_uri": serve.lake}
    if spec.flow == "curate":
        built["config"] = run_config.get("bank", {})
    elif spec.flow == "loop":
        from flows.run_config import RunConfig

        built["config"] = sections(tuple(RunConfig.model_fields))
    elif spec.flow == "iteration":
        from tasks.iteration import IterationConfig

        built["config"] = sections(tuple(IterationConfig.model_fields))
    elif spec.flow == "evaluate":
        from flows.run_config import EvaluationRunConfig

        built.update(config=sections(tuple(EvaluationRunConfig.model_fields)), force=False)  # skipped while in place
    elif spec.flow == "rescore":
        built.update(config={"verify": {}}, iterations=[])  # each iteration keeps its own recorded settings
    elif spec.flow in ("audit", "sampler", "trainer"):
        pass  # audit: its labelled sample is the spec's parameter; the roles get theirs from the loop
    elif spec.flow == "maintenance":
        built["config"] = {}  # MaintenanceConfig's defaults; the spec's `parameters.config` overrides them
    else:
        built["out_dir"] = serve.report_dir
    return {**built, **spec.parameters}


def flow_of(key: str):
    """The Prefect flow object behind a deployment's `flow` key (imported only when served)."""
    if key == "curate":
        from flows.curation import curate_bank

        return curate_bank
    if key == "loop":
        from flows.loop import rl_loop

        return rl_loop
    if key == "iteration":
        from flows.iteration import rl_iteration

        return rl_iteration
    if key == "evaluate":
        from flows.evaluation import evaluate_model

        return evaluate_model
    if key == "rescore":
        from flows.stages import rescore

        return rescore
    if key == "audit":
        from flows.verification import audit_verifier

        return audit_verifier
    if key == "maintenance":
        from flows.maintenance import lake_maintenance

        return lake_maintenance
    if key in ("sampler", "trainer"):
        from flows.async_workers import policy_trainer, rollout_producer

        return rollout_producer if key == "sampler" else policy_trainer
    from flows.report import report

    return report


WORKER_ONLY = ("sampler", "trainer")  # the overlapped loop's roles run on a work pool's workers, never in `serve`


def runner_deployments(serve: ServeConfig, run_config: dict[str, Any]) -> list:
    """Prefect RunnerDeployments with their schedules, ready for `prefect.serve` (all but the loop's roles:
    served, a role's deployment would be claimed both by `serve` and by the workers `prefect deploy` gave it)."""
    from prefect.client.schemas.schedules import CronSchedule

    deployments = []
    for spec in serve.deployments:
        if spec.flow in WORKER_ONLY:
            continue
        flow = flow_of(spec.flow)
        schedules = [CronSchedule(cron=spec.cron, timezone=serve.timezone)] if spec.cron else None
        deployments.append(
            flow.to_deployment(
                name=spec.name,
                schedules=schedules,
                parameters=flow_parameters(spec, serve, run_config),
                description=spec.description,
                tags=spec.tags,
                paused=spec.paused,
            )
        )
    return deployments


def prefect_yaml(serve: ServeConfig, run_config: dict[str, Any], work_pool: str) -> dict[str, Any]:
    """The same deployments as a `prefect.yaml` for `prefect deploy --all` and a `prefect worker` of `work_pool`."""
    import inspect

    root = Path(__file__).resolve().parents[1]
    deployments = []
    for spec in serve.deployments:
        flow = flow_of(spec.flow)
        source = inspect.getsourcefile(inspect.unwrap(flow.fn))  # past the lease wrapper (flows/policies.py)
        entrypoint = f"{Path(source).resolve().relative_to(root)}:{flow.fn.__name__}"
        deployments.append(
            {
                "name": spec.name,
                "entrypoint": entrypoint,
                "description": spec.description,
                "tags": spec.tags,
                "parameters": flow_parameters(spec, serve, run_config),
                "schedules": [{"cron": spec.cron, "timezone": serve.timezone, "active": not spec.paused}]
                if spec.cron
                else [],
                "work_pool": {"name": work_pool, "work_queue_name": None, "job_variables": {}},
            }
        )
    import json

    return {
        "name": "rlvr-platform",
        "prefect-version": "3.9.1",
        "build": None,
        "push": None,
        "pull": [{"prefect.deployments.steps.set_working_directory": {"directory": "{{ $RLVR_HOME }}"}}],
        "deployments": json.loads(json.dumps(deployments)),
    }  # no shared objects: no YAML anchors
