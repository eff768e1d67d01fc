"""The evaluation flow: a model version's held-out solve rate and pass@k per source and level, into
`evaluations`, and every response it sampled into `eval_rollouts`.

The loop runs it after each trained version; deployed alone, it re-evaluates any version (for
example the latest, nightly, on a new held-out source). Evaluation scores with each problem's own
verifier, never with the run's reward control — unless `evaluation.verifier` asks to re-score the
stored responses with another verifier, which samples nothing.
"""

from __future__ import annotations

from typing import Any

import polars as pl
from prefect import flow
from prefect.runtime import flow_run

from flows.policies import stage_task
from flows.run_config import EvaluationRunConfig
from flows.skipping import unchanged_or_fingerprint
from flows.stage_plans import evaluate_key, iteration_of_version
from storage.lake import Lake
from storage.outputs import Outputs
from storage.registry import latest_version
from tasks.evaluation import evaluate, overall_solve_rate

evaluate_task = stage_task(evaluate, "evaluate", gpu=True)


@flow(name="evaluate-model", log_prints=True)
def evaluate_model(
    model_version: int | None = None,
    config: dict[str, Any] | None = None,
    lake_uri: str | None = None,
    iteration: int | None = None,
    force: bool = True,
) -> dict[str, Any]:
    """Held-out solve rate of `model_version` (default: the latest); replaces that version's evaluation."""
    settings = EvaluationRunConfig.model_validate(config or {})
    lake = Lake.open(lake_uri)
    version = model_version if model_version is not None else latest_version(lake)
    if version is None:
        raise ValueError(f"no model version is registered in {lake.uri}: nothing to evaluate")
    iteration = iteration if iteration is not None else iteration_of_version(lake, version)
    truth = settings.model_copy(update={"verify": settings.verify.model_copy(update={"verifier": None})})
    parameters, skipped = unchanged_or_fingerprint(lake, evaluate_key(lake, settings, version), iteration, force)
    if skipped:
        return {**skipped, "model_version": version}
    with lake.run(
        "evaluate-model", "evaluate", parameters, iteration=iteration, prefect_flow_run_id=flow_run.id
    ) as run:
        evaluation, responses = evaluate_task(lake, settings.evaluation, truth, version)
        outputs = (
            Outputs()
            .replace(
                "evaluations",
                evaluation.with_columns(iteration=pl.lit(iteration, pl.Int64)),
                {"model_version": version},
            )
            .replace("eval_rollouts", responses, {"model_version": version, "scoring": responses["scoring"][0]})
        )
        lake.commit(outputs, run)
    rate = overall_solve_rate(evaluation)
    k = settings.evaluation.k
    pass_k = f", pass@{k} {_weighted(evaluation, 'pass_at_k'):.1%}" if k > 1 else ""
    scoring = "" if settings.evaluation.verifier is None else f" (re-scored by {settings.evaluation.verifier})"
    print(
        f"model version {version}: held-out sampled solve rate {rate:.1%}{pass_k} "
        f"on {int(evaluation['problems'].sum())} problems{scoring}"
    )
    return {
        "stage": "evaluate",
        "iteration": iteration,
        "model_version": version,
        "run_id": run.run_id,
        "solve_rate": rate,
        "k": k,
        "pass_at_k": _weighted(evaluation, "pass_at_k"),
        "by_source_level": evaluation.select("source", "level", "problems", "solve_rate", "pass_at_k").to_dicts(),
    }


def _weighted(evaluation: pl.DataFrame, column: str) -> float:
    """A per-cell mean over problems, weighted by each cell's problems."""
    return float((evaluation[column] * evaluation["problems"]).sum() / max(int(evaluation["problems"].sum()), 1))
