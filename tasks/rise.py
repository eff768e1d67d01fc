"""RISE-style self-verification tasks, built from the lake's own rollouts: "here is a problem and a
solution; is it correct, and if not, which step is the first wrong one?" Pure: rows in, problems out.

The answer is the verifier's verdict on that rollout (answer level) and, where the problem carries
`steps` (GSM8K-style `a*b=c` ground truth), the first of them the solution does not reach with a
true equality (process level). The `self_verify` verifier scores a policy's judgement against it:
1 for the right verdict (and the right step, where there is one), 0.5 for the right verdict with the
wrong or no step, else 0.

RISE proper (`mode: in_batch`) verifies the batch just sampled: the rollout stage builds these tasks
from the kept groups' solutions and the same policy answers them in the same iteration (round
`VERIFICATION_ROUND`), so solving and verifying train in one update. `lagged` banks them for later
rounds instead (verifying older policies' solutions).
"""

from __future__ import annotations

import json
from typing import Literal

import polars as pl
from pydantic import Field, model_validator

from storage.config import Strict
from storage.seeds import derive_seed
from tasks.curation.records import problem_id
from tasks.proposals.judgements import verification_answer, verification_prompt

SOURCE = "self-verify"


class SelfVerifyConfig(Strict):
    """RISE: the policy also learns to verify solutions, from tasks made of its own rollouts."""

    enabled: bool = Field(False, description="build verification tasks from each iteration's rollouts")
    mode: Literal["in_batch", "lagged"] = Field(
        "in_batch",
        description="in_batch (RISE): the same policy verifies "
        "this batch's own solutions in the same iteration and both train in "
        "one update; lagged: the tasks enter the bank and later rounds draw "
        "`ratio` of their groups from them",
    )
    tasks_per_iteration: int = Field(
        32,
        ge=1,
        description="verification tasks made from an iteration's rollouts "
        "(half from correct, half from wrong ones where it has both); in_batch: from "
        "the batch's kept groups, each task one group of `rollout.group_size`",
    )
    ratio: float = Field(
        0.25,
        ge=0,
        lt=1,
        description="lagged: share of the groups drawn each round that are "
        "verification tasks (once the bank holds any)",
    )
    seed: int = Field(0, description="seed of the rollouts picked")

    @model_validator(mode="after")
    def _ratio_is_lagged(self):
        """`ratio` applies to `mode: lagged` only: `mode: in_batch` with a `ratio` other than its default is refused
        (in_batch verifies `tasks_per_iteration` of the batch's own solutions)."""
        if self.enabled and self.mode == "in_batch" and self.ratio != type(self).model_fields["ratio"].default:
            raise ValueError(
                "selfverify.ratio applies to mode lagged (later rounds drawing banked tasks); in_batch "
                "verifies tasks_per_iteration of the batch's own solutions: drop ratio or set mode lagged"
            )
        return self


def verification_problems(scored: pl.DataFrame, config: SelfVerifyConfig, iteration: int) -> list[dict]:
    """Problem rows (the bank's candidate fields) for `config.tasks_per_iteration` of an iteration's scored
    rollouts: `scored` holds rollout_id, problem prompt, steps, response and correct (the rollout's own
    verifier's verdict); rollouts of verification tasks are not verified again."""
    usable = scored.filter(pl.col("correct").is_not_null() & (pl.col("source") != SOURCE))
    half = config.tasks_per_iteration // 2
    seed = derive_seed(config.seed, iteration, "self-verify") % 2**32
    right, wrong = usable.filter(pl.col("correct")), usable.filter(~pl.col("correct"))
    take_wrong = min(wrong.height, max(half, config.tasks_per_iteration - right.height))
    picked = pl.concat(
        [
            wrong.sample(take_wrong, seed=seed),
            right.sample(min(right.height, config.tasks_per_iteration - take_wrong), seed=seed),
        ]
    )
    rows = []
    for row in picked.sort("rollout_id").iter_rows(named=True):
        steps = list(row["steps"]) if row["steps"] is not None else None
        prompt = verification_prompt(row["prompt"], row["response"])
        answer = verification_answer(row["correct"], row["response"], steps)
        rows.append(
            {
                "problem_id": problem_id("train", "qa", prompt, answer, None),
                "source": SOURCE,
                "source_kind": "selfverify",
                "source_uri": f"rollout:{row['rollout_id']}",
                "split": "train",
                "domain": "qa",
                "level": 1,
                "prompt": prompt,
                "answer": answer,
                "verifier": "self_verify",
                "params": json.dumps({"iteration": iteration}),
                "metadata": json.dumps({"rollout_id": row["rollout_id"], "problem_id": row["problem_id"]}),
            }
        )
    return rows
