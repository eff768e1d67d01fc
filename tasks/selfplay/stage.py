"""One self-play iteration's sampling (Absolute Zero): the policy proposes code tasks, the executor
validates them, the same policy solves the valid ones, and each proposal is rewarded by how learnable
its task proved. The rest of the iteration (advantages, the training step) is the loop's own.

1. Proposer prompts: per task type, `proposer_groups` prompts, each showing `references` earlier valid
   tasks of that type (drawn from the lake's proposals; a generated task before there are any), each
   sampled `proposer_group_size` times: one GRPO group per prompt, so the proposer's advantages are
   normalised per role and task type.
2. Every proposal is parsed and run in the sandbox (`executor.validate_all`, twice, on two servers);
   earlier valid tasks count for duplicates. One `proposals` row per proposer rollout.
3. Valid tasks become problems (source `self-play`, source_uri `proposal:<id>`, verifier `selfplay`),
   and are solved with the rollout config's group size, together with earlier tasks up to
   `solver_tasks`; the solver's rollouts are scored like any others.
4. A proposer rollout's reward: learnability (1 − solve rate, when strictly between 0 and 1) for a valid
   task, `invalid_reward` for one that broke a rule, `format_error_reward` for one that does not parse.
   A challenger's (SPICE, with `documents`): the Gaussian of its reasoner's correctness variance for a
   valid task (tasks/proposals/documents.py), the same penalties otherwise; its document's id, file and
   licence go with the proposal and the task it became.

Returns the rollouts and rewards of both roles, with the proposals and the new problems to write.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import polars as pl
import pyarrow.compute as pc
from pydantic import Field

from policy.prompts import format_prompt
from storage.config import Strict
from storage.lake import Lake
from storage.seeds import derive_seed
from tasks.curation.gate import refusals
from tasks.generators.programs import draw_task
from tasks.proposals.code_tasks import (
    TASK_TYPES,
    CodeTask,
    ProposalRules,
    learnability,
    parse_proposal,
    proposer_prompt,
)
from tasks.proposals.documents import (
    Document,
    challenger_prompt,
    read_documents,
    variance_reward,
)
from tasks.proposals.executor import validate_all
from tasks.rollout.rows import rollout_rows
from tasks.selfplay.health import TripwireConfig
from tasks.selfplay.rows import (
    GROUNDED,
    LEVELS,
    PROPOSER_SOURCE,
    gated,
    grounded,
    problem_rows,
    proposal_row,
    selfplay_problem,
    task_problem,
)
from tasks.verification.stage import PROBLEM_FIELDS, own_rewards


class SelfPlayConfig(Strict):
    """Absolute Zero-style code self-play: the policy proposes tasks and solves them in the same loop."""

    enabled: bool = Field(False, description="sample each iteration by self-play instead of from the bank's mix")
    task_types: list[Literal["deduction", "abduction", "induction"]] = Field(
        default_factory=lambda: list(TASK_TYPES), description="the kinds of task proposed"
    )
    proposer_groups: int = Field(2, ge=1, description="proposer prompts per task type an iteration")
    proposer_group_size: int = Field(8, ge=2, description="proposals sampled per proposer prompt (the proposer's G)")
    references: int = Field(1, ge=0, description="earlier valid tasks shown in each proposer prompt")
    solver_tasks: int = Field(
        16, ge=1, description="tasks solved an iteration at least: this iteration's valid proposals, then earlier ones"
    )
    proposal_tokens: int = Field(160, ge=16, description="response cap of a proposal, in tokens")
    format_error_reward: float = Field(-1.0, description="a proposal that does not parse")
    invalid_reward: float = Field(-0.5, description="a proposal that parses but breaks another rule")
    documents: str | None = Field(
        None,
        description="SPICE: a corpus (JSONL, text, or a folder of them) a challenger "
        "reads to write document-grounded questions (`rlvr run --documents PATH`)",
    )
    challenger_groups: int = Field(2, ge=1, description="documents a challenger reads an iteration (one group each)")
    challenger_width: float = Field(
        0.01,
        gt=0,
        description="SPICE: the variance of the Gaussian over the reasoner's "
        "correctness variance that rewards the challenger (smaller: sharper at ½)",
    )
    seed: int = Field(0, description="seed of the reference and document draws")
    tripwire: TripwireConfig = Field(
        default_factory=TripwireConfig, description="collapse checks that stop the loop (tasks/selfplay/health.py)"
    )


@dataclass
class SelfPlaySample:
    rollouts: pl.DataFrame
    rewards: pl.DataFrame
    proposals: pl.DataFrame
    new_problems: pl.DataFrame  # proposer prompts and valid tasks, as bank rows (without bank_version)


def earlier_tasks(lake: Lake, before: int) -> pl.DataFrame:
    """Valid proposals of earlier iterations with their tasks: the reference buffer and the duplicates' keys."""
    proposals = lake.read("proposals", columns=["iteration", "task_type", "task_key", "problem_id", "verdict"])
    valid = proposals.filter((pl.col("iteration") < before) & (pl.col("verdict") == "valid"))
    if valid.is_empty():
        return valid.with_columns(answer=pl.lit(None, pl.String))
    problems = lake.read("problems", columns=["problem_id", "answer"]).unique("problem_id")
    return valid.join(problems, on="problem_id", how="inner").sort("iteration", "problem_id")


def proposer_problems(
    selfplay: SelfPlayConfig, history: pl.DataFrame, rng: random.Random
) -> tuple[pl.DataFrame, dict[str, Document]]:
    """The proposer's prompts, `proposer_groups` per task type, each showing earlier valid tasks of that type (a
    generated one before there are any), and a challenger's per document drawn (SPICE); the documents drawn."""
    rows = []
    for task_type in selfplay.task_types:
        buffer = [CodeTask.from_json(text) for text in history.filter(pl.col("task_type") == task_type)["answer"]]
        for _ in range(selfplay.proposer_groups):
            references = (
                rng.sample(buffer, min(selfplay.references, len(buffer)))
                if buffer
                else [draw_task(rng, False, task_type) for _ in range(selfplay.references)]
            )
            rows.append(
                selfplay_problem(
                    proposer_prompt(task_type, references),
                    task_type,
                    "learnability",
                    PROPOSER_SOURCE,
                    f"proposer:{task_type}",
                    LEVELS[task_type],
                    {"task_type": task_type},
                    {},
                )
            )
    documents = {}
    if selfplay.documents:  # SPICE: a challenger reads a document per group
        corpus = read_documents(selfplay.documents)
        for document in rng.sample(corpus, min(selfplay.challenger_groups, len(corpus))):
            documents[document.document_id] = document
            rows.append(
                selfplay_problem(
                    challenger_prompt(document),
                    GROUNDED,
                    "learnability",
                    PROPOSER_SOURCE,
                    f"challenger:{document.document_id}",
                    LEVELS[GROUNDED],
                    {"task_type": GROUNDED, "document_id": document.document_id},
                    {},
                    domain="qa",
                )
            )
    return problem_rows(rows).unique("problem_id", keep="first", maintain_order=True), documents


def sample_selfplay(
    lake: Lake,
    config,
    iteration: int,
    model_version: int,
    policy,
    tokenizer,
    score: Callable[[pl.DataFrame], pl.DataFrame],
) -> SelfPlaySample:
    """Propose, validate, solve and reward one iteration (`config`: the iteration's IterationConfig)."""
    selfplay, rollout = config.selfplay, config.rollout
    rules = ProposalRules()
    history = earlier_tasks(lake, iteration)
    seen = set(history["task_key"].to_list())
    rng = random.Random(derive_seed(selfplay.seed, iteration, "references"))

    # 1. the proposer's prompts (through the bank's gate: one it refuses is not sampled) and proposals
    proposers, documents = proposer_problems(selfplay, history, rng)
    proposers = proposers.filter(~pl.col("problem_id").is_in(list(refusals(lake, proposers))))
    proposer_sampler = rollout.sampler.model_copy(update={"max_new_tokens": selfplay.proposal_tokens})
    prompts = [format_prompt(text, rollout.prompt, tokenizer) for text in proposers["prompt"]]
    seed = derive_seed(rollout.seed, iteration, "propose")
    groups = policy.generate(prompts, selfplay.proposer_group_size, proposer_sampler, seed, model_version)
    proposed = rollout_rows(
        proposers,
        prompts,
        groups,
        iteration=iteration,
        round_=1,
        model_version=model_version,
        sampler={"role": "proposer", **proposer_sampler.model_dump()},
        seed=seed,
    )

    # 2. validation in the sandbox
    types = dict(zip(proposers["problem_id"], proposers["answer"]))
    read_from = {
        pid: json.loads(params).get("document_id") for pid, params in zip(proposers["problem_id"], proposers["params"])
    }
    is_code = [types[pid] != GROUNDED for pid in proposed["problem_id"]]
    parsed = [
        parse_proposal(text, types[pid], rules)
        for text, pid, code in zip(proposed["response"], proposed["problem_id"], is_code)
        if code
    ]
    checked = iter(validate_all(parsed, seen, rules))
    validated = [
        next(checked) if code else grounded(text, documents[read_from[pid]], seen)
        for text, pid, code in zip(proposed["response"], proposed["problem_id"], is_code)
    ]

    # 3. valid tasks become problems, through the bank's gate: one it would refuse is an invalid proposal, never solved
    made = [
        task_problem(row, result.task, model_version, documents.get(read_from[row["problem_id"]]))
        for row, result in zip(proposed.iter_rows(named=True), validated)
    ]
    refused = refusals(lake, problem_rows([problem for problem in made if problem])) if any(made) else {}
    validated = [gated(result, problem, refused) for result, problem in zip(validated, made)]
    now = datetime.now(UTC)
    proposal_rows = [
        proposal_row(
            row,
            result,
            problem,
            iteration,
            model_version,
            types[row["problem_id"]],
            documents.get(read_from[row["problem_id"]]),
            now,
        )
        for row, result, problem in zip(proposed.iter_rows(named=True), validated, made)
    ]
    task_problems = [problem for problem, result in zip(made, validated) if problem and result.rejection is None]
    new_tasks = problem_rows(task_problems) if task_problems else problem_rows([])
    fill = max(0, selfplay.solver_tasks - new_tasks.height)
    older = (
        history.sample(min(fill, history.height), seed=derive_seed(selfplay.seed, iteration, "older") % 2**32)
        if fill and history.height
        else history.head(0)
    )
    solve = new_tasks.select(*PROBLEM_FIELDS, "level")
    if older.height:
        earlier = lake.read(
            "problems",
            filter=pc.field("problem_id").isin(older["problem_id"].to_list()),
            columns=[*PROBLEM_FIELDS, "level"],
        ).unique("problem_id")
        solve = pl.concat([solve, earlier.select(solve.columns)], how="vertical_relaxed")
    solver_rollouts, solver_rewards = solve_problems(solve, config, iteration, model_version, policy, tokenizer, score)

    # 4. the proposer's rewards from the solver's solve rates
    rate_of = (
        {}
        if solver_rollouts.is_empty()
        else dict(
            own_rewards(solver_rewards, solve_frame(solver_rollouts, solve))
            .group_by("problem_id")
            .agg(pl.col("correct").fill_null(False).cast(pl.Float64).mean())
            .iter_rows()
        )
    )
    for row in proposal_rows:
        row["solve_rate"] = rate_of.get(row["problem_id"]) if row["problem_id"] else None
        valid_reward = (
            variance_reward(row["solve_rate"], selfplay.challenger_width)
            if row["role"] == "challenger"
            else learnability(row["solve_rate"])
        )
        row["reward"] = (
            valid_reward
            if row["verdict"] == "valid"
            else selfplay.format_error_reward
            if row["reason"] == "unparseable"
            else selfplay.invalid_reward
        )
    proposals = pl.DataFrame(
        proposal_rows,
        schema_overrides={
            name: pl.String
            for name in (
                "document_id",
                "document_source",
                "document_licence",
                "span",
                "reason",
                "detail",
                "task_key",
                "shape_key",
                "program",
                "inputs",
                "outputs",
                "problem_id",
            )
        }
        | {"solve_rate": pl.Float64, "reward": pl.Float64},
    )
    proposer_rewards = proposals.select(
        "iteration",
        "rollout_id",
        problem_id=pl.col("rollout_id").replace_strict(dict(zip(proposed["rollout_id"], proposed["problem_id"]))),
        verifier=pl.lit("learnability"),
        verifier_version=pl.lit("1.0"),
        reward="reward",
        correct=pl.col("reward") > 0,
        details=pl.struct("verdict", "reason", "solve_rate", "task_type").struct.json_encode(),
    )
    solved = [solver_rollouts] if not solver_rollouts.is_empty() else []
    to_bank = pl.concat([proposers, problem_rows([problem for problem in made if problem])], how="vertical_relaxed")
    return SelfPlaySample(
        pl.concat([proposed, *solved], how="vertical_relaxed"),
        pl.concat([proposer_rewards, *(solver_rewards for _ in solved)], how="diagonal_relaxed"),
        proposals,
        to_bank.unique("problem_id", keep="first", maintain_order=True),
    )


def solve_frame(rollouts: pl.DataFrame, problems: pl.DataFrame) -> pl.DataFrame:
    """Solver rollouts with their problems: what the verifiers score."""
    return rollouts.select("rollout_id", "iteration", "problem_id", "response", "n_tokens", "self_certainty").join(
        problems.select(PROBLEM_FIELDS).unique("problem_id"), on="problem_id", how="left"
    )


def solve_problems(
    problems: pl.DataFrame,
    config,
    iteration: int,
    model_version: int,
    policy,
    tokenizer,
    score: Callable[[pl.DataFrame], pl.DataFrame],
    *,
    round_: int = 2,
    role: str = "solver",
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One group per problem from the policy, as `role` in `round_`, and their rewards (the self-play solver's
    round; RISE's in-batch verification round)."""
    rollout = config.rollout
    prompts = [format_prompt(text, rollout.prompt, tokenizer) for text in problems["prompt"]]
    seed = derive_seed(rollout.seed, iteration, "solve" if role == "solver" else role)
    if not prompts:
        return pl.DataFrame(), pl.DataFrame()
    groups = policy.generate(prompts, rollout.group_size, rollout.sampler, seed, model_version)
    rows = rollout_rows(
        problems,
        prompts,
        groups,
        iteration=iteration,
        round_=round_,
        model_version=model_version,
        sampler={"role": role, **rollout.sampler.model_dump()},
        seed=seed,
    )
    return rows, score(solve_frame(rows, problems))
