"""Self-play's rows: a proposed task as a bank problem (its lineage to the rollout that proposed it and, for
SPICE, the document it was read from), the verdict of each proposal as a row of `proposals`, and the problems
table frame the bank's candidates share."""

from __future__ import annotations

import json
from datetime import datetime

import polars as pl

from tasks.curation.config import PROPOSAL_URI
from tasks.curation.load import CANDIDATE_SCHEMA
from tasks.curation.records import problem_id
from tasks.proposals.code_tasks import Rejection, shape_key, solver_prompt
from tasks.proposals.documents import Challenge, Document, parse_challenge
from tasks.proposals.executor import Validated

SOURCE, PROPOSER_SOURCE = "self-play", "self-play:proposer"
GROUNDED = "grounded"  # SPICE's document-grounded questions
LEVELS = {"deduction": 1, "abduction": 2, "induction": 3, GROUNDED: 2}  # how hard each kind is, roughly


def problem_rows(rows: list[dict]) -> pl.DataFrame:
    """Problems in the curation's candidate schema (the bank's gate takes them as a source's rows); only rows
    that say so take part in near-duplicate and contamination checks."""
    filled = [{name: row.get(name) for name in CANDIDATE_SCHEMA} for row in rows]
    return pl.DataFrame(filled, schema=CANDIDATE_SCHEMA).with_columns(pl.col("similarity_checks").fill_null(False))


def selfplay_problem(
    prompt: str,
    answer: str,
    verifier: str,
    source: str,
    uri: str,
    level: int,
    params: dict,
    metadata: dict,
    domain: str = "code",
) -> dict:
    """A bank row of self-play's; a task (`proposal:<id>`, text the model wrote) is checked for near-duplicates and
    contamination as a file's rows are, a proposer's prompt (a template around earlier tasks) for exact repeats."""
    return {
        "problem_id": problem_id("train", domain, prompt, answer, None),
        "source": source,
        "source_kind": "selfplay",
        "source_uri": uri,
        "split": "train",
        "domain": domain,
        "level": level,
        "prompt": prompt,
        "answer": answer,
        "verifier": verifier,
        "params": json.dumps(params, sort_keys=True),
        "metadata": json.dumps(metadata, sort_keys=True),
        "similarity_checks": uri.startswith(PROPOSAL_URI),
    }


def task_problem(rollout_row: dict, task, model_version: int, document: Document | None) -> dict | None:
    """The bank row a valid proposal's task becomes (None for an invalid proposal)."""
    if task is None:
        return None
    proposal_id = f"p-{rollout_row['rollout_id']}"
    lineage = {
        "proposal_id": proposal_id,
        "proposer_rollout_id": rollout_row["rollout_id"],
        "proposer_model_version": model_version,
    }
    if isinstance(task, Challenge):
        return selfplay_problem(
            task.question,
            task.answer,
            "qa",
            SOURCE,
            f"{PROPOSAL_URI}{proposal_id}",
            LEVELS[GROUNDED],
            {"task_type": GROUNDED},
            {**lineage, **document_lineage(document)},
            domain="qa",
        )
    return selfplay_problem(
        solver_prompt(task),
        task.to_json(),
        "selfplay",
        SOURCE,
        f"{PROPOSAL_URI}{proposal_id}",
        LEVELS[task.task_type],
        {"task_type": task.task_type},
        lineage,
    )


def gated(result: Validated, problem: dict | None, refused: dict[str, tuple[str, str]]) -> Validated:
    """A valid proposal whose task the bank's gate refuses (a near-duplicate of a bank problem, an evaluation set's
    overlap, a validation rule) is invalid, for the gate's reason; its task stays on the proposal as data."""
    if problem is None or problem["problem_id"] not in refused:
        return result
    return Validated(result.key, result.task, Rejection(*refused[problem["problem_id"]]))


def proposal_row(
    rollout_row: dict,
    result: Validated,
    problem: dict | None,
    iteration: int,
    model_version: int,
    task_type: str,
    document: Document | None,
    now: datetime,
) -> dict:
    """One `proposals` row per proposer rollout, valid or not (its reward is filled once the solver has tried)."""
    task = result.task
    code = task_type != GROUNDED and task is not None
    return {
        "proposal_id": f"p-{rollout_row['rollout_id']}",
        "iteration": iteration,
        "role": "challenger" if task_type == GROUNDED else "proposer",
        "task_type": task_type,
        "model_version": model_version,
        "rollout_id": rollout_row["rollout_id"],
        **document_lineage(document),
        "span": task.span if isinstance(task, Challenge) else None,
        "verdict": "valid" if result.rejection is None else "invalid",
        "reason": result.rejection.reason if result.rejection else None,
        "detail": result.rejection.detail if result.rejection else None,
        "task_key": result.key or None,
        "shape_key": shape_key(task.program) if code else None,
        "program": task.program if code else None,
        "inputs": json.dumps(list(task.inputs)) if code else None,
        "outputs": json.dumps(list(task.outputs)) if code else None,
        "problem_id": problem["problem_id"] if problem else None,
        "created_at": now,
    }


def document_lineage(document: Document | None) -> dict:
    """Where a grounded task's document came from: its id, file and licence (the proposal row's columns)."""
    return {
        "document_id": document.document_id if document else None,
        "document_source": document.source if document else None,
        "document_licence": document.licence if document else None,
    }


def grounded(text: str, document: Document, seen: set[str]) -> Validated:
    """A challenger's response checked against its document (tasks/proposals/documents.py); a question asked
    of the same document before is a duplicate."""
    challenge = parse_challenge(text, document)
    if isinstance(challenge, Rejection):
        return Validated("", None, challenge)
    if challenge.key in seen:
        return Validated(
            challenge.key, None, Rejection("duplicate", "the same question of this document was asked before")
        )
    seen.add(challenge.key)
    return Validated(challenge.key, challenge, None)
