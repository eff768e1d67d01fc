"""Move a reasoning-gym dataset's difficulty with its solve rate, one curriculum step at a time.

A difficulty is one global step of the dataset's reasoning-gym curriculum: step s puts every
attribute at level min(s, its last level) (reasoning-gym's `set_global_level`), so one number says
where a dataset stands and the steps run from 0 to the longest attribute's last level. Per-attribute
levels would let attributes drift apart with nothing measured to tell them apart: a solve rate
is one number per dataset. Ranges are reasoning-gym's inclusive ones (step 2 of chain_sum is
2-4 terms), so a harder step keeps some easier problems in its mix.

The rule mirrors the level mix's (`rebalance.py`): above 90 % one step harder, below 10 % one step
easier, never past either end, otherwise stay. Pure: no lake, no Prefect; reasoning-gym is imported
only to read its curricula.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from tasks.curriculum.rebalance import LEARNING_ZONE, SATURATED

# Fields of a dataset config that describe one draw, not a difficulty.
RUN_FIELDS = ("seed", "size")


def move_step(step: int, max_step: int, solve_rate: float | None) -> tuple[int, str]:
    """The next step and why: too_easy / too_hard move one step; at_max / at_min are the same verdicts
    at an end; in_zone, between and unmeasured stay."""
    if solve_rate is None:
        return step, "unmeasured"
    if solve_rate > SATURATED[1]:
        return (step + 1, "too_easy") if step < max_step else (step, "too_easy_at_max")
    if solve_rate < SATURATED[0]:
        return (step - 1, "too_hard") if step > 0 else (step, "too_hard_at_min")
    return step, "in_zone" if LEARNING_ZONE[0] <= solve_rate <= LEARNING_ZONE[1] else "between"


def next_difficulty(
    dataset: str, step: int, params: dict[str, Any], solve_rate: float | None
) -> tuple[int, str, dict[str, Any]]:
    """(step, reason, parameters) after `move_step`; a step whose parameters reasoning-gym itself
    refuses is not taken (reason step_rejected), so a faulty curriculum never breaks the loop."""
    new, reason = move_step(step, max_step(dataset), solve_rate)
    if new == step:
        return step, reason, params
    try:
        return new, reason, step_params(dataset, new, params)
    except ValueError:
        return step, "step_rejected", params


def has_steps(dataset: str) -> bool:
    from reasoning_gym.factory import has_curriculum

    return has_curriculum(dataset)


def max_step(dataset: str) -> int:
    """The last step: every attribute at its hardest level."""
    return max(len(attr.levels) - 1 for attr in _curriculum(dataset).attributes.values())


def step_params(dataset: str, step: int, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The dataset's parameters at `step`: the curriculum's fields at that step over `base` (the
    source's other parameters), as JSON values (tuples become lists), without seed and size.
    Parameters the dataset would refuse once stored and read back are an error: a few reasoning-gym
    curricula make such steps (knight_swap below 6 nodes, modulo_grid's step 1)."""
    from reasoning_gym.factory import DATASETS

    if not 0 <= step <= max_step(dataset):
        raise ValueError(f"{dataset}: step {step} is outside 0..{max_step(dataset)}")
    try:
        params = json.loads(json.dumps(_step_config(dataset, step, base)))
        getattr(DATASETS[dataset][1](**params), "validate", lambda: None)()
    except (TypeError, ValueError, AssertionError) as error:
        raise ValueError(
            f"{dataset}: step {step} of its reasoning-gym curriculum gives parameters it rejects: {error}"
        ) from None
    return params


def start_step(dataset: str, params: dict[str, Any]) -> int:
    """The step a source's own parameters stand at: the hardest step they reach on every curriculum
    field (a larger value is harder where the curriculum's values grow, a smaller one where they
    shrink; non-numeric fields are not compared). 0 when even step 0 asks for more."""
    from reasoning_gym.factory import DATASETS

    given = dataclasses.asdict(DATASETS[dataset][1](**_without_run_fields(params)))
    steps = [_step_config(dataset, s, params) for s in range(max_step(dataset) + 1)]
    growth = {
        f: steps[-1][f] - steps[0][f]
        for f in _curriculum_fields(dataset)
        if all(_is_number(v) for v in (steps[0][f], steps[-1][f], given[f]))
    }
    reached = [
        s
        for s, config in enumerate(steps)
        if all((config[f] - given[f]) * growth[f] <= 0 for f in growth if _is_number(config[f]))
    ]
    return max(reached, default=0)


def _step_config(dataset: str, step: int, base: dict[str, Any] | None) -> dict[str, Any]:
    curriculum = _curriculum(dataset)
    curriculum.set_global_level(step)
    config = curriculum.generate_configuration(defaults=_without_run_fields(base or {}))
    return _without_run_fields(dataclasses.asdict(config))


def _without_run_fields(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k not in RUN_FIELDS}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _curriculum(dataset: str):
    from reasoning_gym.factory import create_curriculum

    return create_curriculum(dataset)


def _curriculum_fields(dataset: str) -> list[str]:
    fields = []
    for attr in _curriculum(dataset).attributes.values():
        names = (
            (attr.lower_field_name, attr.upper_field_name) if hasattr(attr, "upper_field_name") else (attr.field_name,)
        )
        fields.extend(names)
    return fields
