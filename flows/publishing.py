"""The publish stage: make a model version servable on the rollout endpoints before anything samples it.

Its own run row; every endpoint's outcome appended to `publications` in one commit (failures
included, so SQL shows which server refused which version and why), and only then does it fail
when too few endpoints confirmed. Then the log-prob agreement gate (`policy/agreement.py`)
runs on every endpoint that confirmed it: its figures go to `logprob_checks`, and a disagreeing
endpoint fails the stage before anything samples from it. Nothing to do on the hf backend, which
loads versions itself.
"""

from __future__ import annotations

import os
from typing import Any

import polars as pl
import pyarrow.compute as pc
from prefect import flow
from prefect.runtime import flow_run

from policy.agreement import Agreement, GateFailed, check_endpoint, describe
from policy.checkpoints import load_policy
from policy.endpoints import server_root
from policy.prompts import format_prompt
from policy.publish import PublishConfig, publish, require_confirmed, version_of
from storage.lake import Lake
from storage.outputs import Outputs
from storage.registry import version_row
from storage.runs import utc_now
from tasks.generators import generate
from tasks.rollout.stage import RolloutConfig, training_bank


def served_name(row: dict[str, Any], rollout: RolloutConfig) -> str:
    """The name a registry row's version is served by: its own `served_name`, else the backend's template."""
    return row["served_name"] or rollout.openai.model_name.format(model_version=row["model_version"])


def base_names(lake: Lake, rollout: RolloutConfig) -> set[str]:
    """Served names a server was started with (base models): never unloaded."""
    bases = lake.read("model_versions", filter=pc.field("kind") == "base", columns=["model_version", "served_name"])
    return {served_name(row, rollout) for row in bases.iter_rows(named=True)}


def publish_version(
    lake: Lake,
    rollout: RolloutConfig,
    config: PublishConfig,
    version: int,
    flow: str = "publish-policy",
    iteration: int | None = None,
) -> list[dict[str, Any]] | None:
    """Publish `version` to every endpoint of `rollout.openai`; None when there is nothing to publish to."""
    if rollout.backend != "openai" or not config.enabled:
        return None
    row = version_row(lake, version)
    name = served_name(row, rollout)
    endpoints = rollout.openai.endpoints
    parameters = {
        "model_version": version,
        "served_name": name,
        "endpoints": endpoints,
        **config.model_dump(),
        "logprob_check_prompts": rollout.logprob_check_prompts,
        "logprob_tolerance": rollout.logprob_tolerance,
    }
    with lake.run(flow, "publish", parameters, iteration=iteration, prefect_flow_run_id=flow_run.id) as run:
        results = publish(
            endpoints,
            name,
            row["checkpoint_uri"],
            config,
            rollout.openai.model_name,
            base_names(lake, rollout),
            os.environ.get(rollout.openai.api_key_env),
            version,
        )
        rows = [
            {
                "model_version": version,
                "served_name": r.served_name,
                "endpoint": r.endpoint,
                "path": r.path,
                "action": r.action,
                "error": r.error,
                "unloaded": r.unloaded,
                "method": r.method,
                "seconds": r.seconds,
                "created_at": utc_now(),
            }
            for r in results
        ]
        publications = pl.DataFrame(
            rows, schema_overrides={"error": pl.String, "seconds": pl.Float64, "unloaded": pl.List(pl.String)}
        )
        lake.commit(Outputs().append("publications", publications), run)
        agreements = []
        if rollout.logprob_check_prompts and sum(r.confirmed for r in results) >= config.min_endpoints:
            agreements = check_agreement(lake, rollout, version, name, [r.endpoint for r in results if r.confirmed])
            append_agreements(lake, run, agreements)
    for result in results:
        state = result.action.replace("_", " ") + (f": {result.error}" if result.error else "")
        unloaded = f" (unloaded {', '.join(result.unloaded)})" if result.unloaded else ""
        took = f" in {result.seconds:.1f} s" if result.seconds is not None else ""
        print(
            f"publish: model version {version} as {name!r} on {result.endpoint}: {result.method} {state}{took}"
            f"{unloaded}"
        )
    require_confirmed(results, config.min_endpoints)
    require_agreement(agreements)
    return rows


def gate_prompts(lake: Lake, rollout: RolloutConfig, tokenizer) -> list[str]:
    """The gate's prompts: the first of the training bank, formatted as the run formats them (its template and
    BOS are part of what is checked); generated ones when the lake has no bank yet."""
    count = rollout.logprob_check_prompts
    try:
        problems = training_bank(lake, rollout.mix).sort("problem_id").head(count)["prompt"].to_list()
    except ValueError:
        problems = [problem.prompt for _, _, problem in generate("mix", count=count, seed=0)]
    return [format_prompt(problem, rollout.prompt, tokenizer) for problem in problems]


def check_agreement(
    lake: Lake, rollout: RolloutConfig, version: int, name: str, endpoints: list[str]
) -> list[Agreement]:
    """The gate on each endpoint, against the version's registry checkpoint loaded on `rollout.device`."""
    model, tokenizer = load_policy(version_row(lake, version)["checkpoint_uri"], rollout.sampling_device())
    prompts = gate_prompts(lake, rollout, tokenizer)
    api_key = os.environ.get(rollout.openai.api_key_env)
    return [
        check_endpoint(
            rollout.openai,
            endpoint,
            name,
            version,
            model,
            tokenizer,
            prompts,
            rollout.sampler,
            rollout.logprob_tolerance,
            api_key,
        )
        for endpoint in endpoints
    ]


def append_agreements(lake: Lake, run, agreements: list[Agreement]) -> None:
    checks = pl.DataFrame(
        [a.as_row() | {"created_at": utc_now()} for a in agreements], schema_overrides={"causes": pl.List(pl.String)}
    )
    lake.commit(Outputs().append("logprob_checks", checks), run)


def check_policy(lake: Lake, rollout: RolloutConfig, endpoint: str, model: str | None = None) -> Agreement:
    """`rlvr policy check`: the gate on one endpoint for the version served as `model` (default: the newest
    registered version), recorded in `logprob_checks` like the loop's."""
    endpoint = server_root(endpoint)  # `http://host:8000/v1`, as the judge's is written, too
    registered = lake.read("model_versions").sort("model_version")
    if registered.is_empty():
        raise ValueError(f"the lake at {lake.uri} has no model versions: run `rlvr policy init` first")
    rows = list(registered.iter_rows(named=True))
    if model is None:
        row = rows[-1]
    else:
        version = version_of(model, rollout.openai.model_name)
        row = next((r for r in rows if r["served_name"] == model), None) or next(
            (r for r in rows if r["model_version"] == version), None
        )
        if row is None:
            raise ValueError(
                f"model {model!r} is no registered version's served name, nor a name of the template "
                f"{rollout.openai.model_name!r} of a registered version"
            )
    name = model or served_name(row, rollout)
    parameters = {
        "endpoint": endpoint,
        "model_version": row["model_version"],
        "served_name": name,
        "logprob_check_prompts": rollout.logprob_check_prompts,
        "logprob_tolerance": rollout.logprob_tolerance,
    }
    with lake.run("policy-check", "logprob-check", parameters, prefect_flow_run_id=flow_run.id) as run:
        agreement = check_agreement(lake, rollout, row["model_version"], name, [endpoint])[0]
        append_agreements(lake, run, [agreement])
    return agreement


def require_agreement(agreements: list[Agreement]) -> None:
    """Print the gate's figures, then fail if any endpoint disagrees (its rows are in the lake already)."""
    for agreement in agreements:
        print(f"logprob check: {describe(agreement)}")
    failed = [a for a in agreements if not a.passed]
    if failed:
        raise GateFailed(
            "the servers' behaviour log-probs disagree with the trainer's, so every importance ratio "
            "would be wrong: " + " | ".join(describe(a) for a in failed)
        )


@flow(name="publish-policy", log_prints=True)
def publish_policy(
    version: int,
    rollout: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    lake_uri: str | None = None,
) -> list[dict[str, Any]] | None:
    """Load model version `version` into every rollout endpoint and confirm it (`rlvr policy publish`)."""
    return publish_version(
        Lake.open(lake_uri),
        RolloutConfig.model_validate(rollout or {}),
        PublishConfig.model_validate(config or {}),
        version,
    )
