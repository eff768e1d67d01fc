"""Reward composition: the reward training sees, as a weighted sum of named components.

    composed = Σ weight_c · map_c(value_c)

Components (each a column of the scored rollouts the advantage stage reads):
- `verifier`: the reward of each problem's own verifier (or the one configured); `corrected`: the same,
  noise-corrected with the verifier's latest audit, (R − ρ0) / (1 − ρ0 − ρ1) (uncorrected where the
  verifier version has no audit);
- `format`, `process`: the format and process rewards stored beside it;
- `self_certainty`: INTUITOR's self-certainty of the response, where the backend gave one;
- `length`: the response's tokens beyond `free_tokens`, per `scale_tokens` (give it a negative weight);
- `verifier:NAME`: another verifier's reward for the same rollout (a judge model's, say).

`mapping` maps a component's [0, 1] score per domain onto values, linearly: `{correct: 1, wrong: -1}`
makes a math answer +1 or −1 and partial credit 0.5 of a code run 0. A component with no value for a
row (no process reward, no judge score) contributes 0 there and is recorded as null; a missing
self-certainty stops the stage unless `self_certainty_missing: zero` says to score it 0 (INTUITOR's reward
is self-certainty alone: a silent 0 would train on it).
The default, `{verifier: {weight: 1}}`, is the verifier's reward unchanged. Pure: no lake, no Prefect.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import polars as pl
from pydantic import Field, field_validator, model_validator

from storage.config import Strict
from tasks.rewards.collapse import SelfRewardTripwire

BUILT_IN = {
    "verifier": "reward",
    "corrected": "corrected_reward",
    "format": "format_reward",
    "process": "process_reward",
    "self_certainty": "self_certainty",
    "length": "n_tokens",
}
LOW_PROCESS_SHARE = 0.1  # the seed measured λ = 0.1 worse than outcome-only rewards


class ValueMapping(Strict):
    """Where a [0, 1] score lands: `wrong` at 0, `correct` at 1, linear in between."""

    correct: float = Field(1.0, description="the value of a score of 1 (all correct)")
    wrong: float = Field(0.0, description="the value of a score of 0 (all wrong)")


class RewardComponent(Strict):
    """One term of the composed reward."""

    weight: float = Field(1.0, description="its weight in the sum (negative to penalise, e.g. length)")
    mapping: dict[str, ValueMapping] = Field(
        default_factory=dict,
        description="per domain (math, code, logic, qa) or `default`: the values its 0 and 1 map to",
    )


KINDS = {"verifiable": "verifier", "self_certainty": "self_certainty"}  # kind -> its single component


class RewardConfig(Strict):
    """How the reward training sees is composed from the stored reward signals."""

    kind: Literal["composed", "verifiable", "self_certainty"] = Field(
        "composed",
        description="verifiable: the verifier's reward alone; self_certainty: INTUITOR's self-certainty "
        "alone, in place of the verifier's; composed: the weighted sum of `components`",
    )
    components: dict[str, RewardComponent] = Field(
        default_factory=lambda: {"verifier": RewardComponent()},
        description="named components and their weights: verifier, corrected, format, process, self_certainty, "
        "length, or verifier:NAME for another verifier's reward",
    )
    self_certainty_missing: Literal["error", "zero"] = Field(
        "error",
        description="a rollout without a self-certainty (its backend gave no full distribution): error "
        "stops the stage naming how many; zero scores the component 0 there",
    )
    tripwire: SelfRewardTripwire = Field(
        default_factory=SelfRewardTripwire,
        description="collapse checks run "
        "after each iteration when no component is a verifier's "
        "(tasks/rewards/collapse.py)",
    )
    free_tokens: int = Field(0, ge=0, description="length: tokens that cost nothing")
    scale_tokens: int = Field(1000, gt=0, description="length: tokens past free_tokens per unit of the component")

    @model_validator(mode="before")
    @classmethod
    def _kind(cls, data: Any) -> Any:
        """`kind: verifiable | self_certainty` is shorthand for that component alone, weight 1; it cannot be given
        with other `components`."""
        if isinstance(data, dict) and data.get("kind") in KINDS:
            alone = {KINDS[data["kind"]]: RewardComponent()}
            given = data.get("components")
            if given is not None and {k: RewardComponent.model_validate(v) for k, v in given.items()} != alone:
                raise ValueError(
                    f"reward.kind {data['kind']} is the {KINDS[data['kind']]} component alone: give "
                    "reward.components with kind composed (the default), not both"
                )
            data = {**data, "components": alone}
        return data

    @field_validator("components")
    @classmethod
    def _known(cls, components: dict[str, RewardComponent]) -> dict[str, RewardComponent]:
        """`components`: at least one, each a built-in name (verifier, corrected, format, process,
        self_certainty, length) or `verifier:NAME`."""
        for name in components:
            if name not in BUILT_IN and not (name.startswith("verifier:") and len(name) > len("verifier:")):
                raise ValueError(f"unknown reward component {name!r}: use {', '.join(BUILT_IN)} or verifier:NAME")
        if not components:
            raise ValueError("at least one reward component is needed")
        return components

    @model_validator(mode="after")
    def _process_share(self) -> RewardConfig:
        """A warning, not a refusal: a `process` component whose weight is at most 10 % of the outcome-plus-process
        weight (the seed's danger zone; raised once where the config is read, not in every worker)."""
        process = self.components.get("process")
        outcome = sum(abs(c.weight) for name, c in self.components.items() if name in ("verifier", "corrected"))
        if process is not None and process.weight > 0 and outcome > 0:
            share = process.weight / (process.weight + outcome)
            if share <= LOW_PROCESS_SHARE:
                warnings.warn(
                    f"the process component is {share:.0%} of the outcome-plus-process weight; the seed "
                    "experiments found λ = 0.1 worse than outcome-only rewards",
                    UserWarning,
                    stacklevel=2,
                )
        return self

    def is_default(self) -> bool:
        """The verifier's reward unchanged (`kind: verifiable` included)."""
        return self.model_copy(update={"kind": "composed"}) == RewardConfig()

    def has_external_verifier(self) -> bool:
        """Whether a component is a verifier's reward (else the reward grades itself: the tripwire runs)."""
        return any(name in ("verifier", "corrected") or name.startswith("verifier:") for name in self.components)

    def other_verifiers(self) -> list[str]:
        """Verifiers whose rewards the components read beside the rollout's own (`verifier:NAME`)."""
        return [name.split(":", 1)[1] for name in self.components if name.startswith("verifier:")]


def compose(scored: pl.DataFrame, config: RewardConfig) -> pl.DataFrame:
    """Adds `composed_reward` and `reward_components` (JSON: each component's mapped value, null where absent).

    `scored` holds the columns the components read (see BUILT_IN; `verifier:NAME` columns for other
    verifiers) and `domain` where a mapping is per domain."""
    terms, recorded = [], {}
    for name, component in config.components.items():
        column = BUILT_IN.get(name, name)
        if column not in scored.columns:
            raise ValueError(f"reward component {name!r} needs column {column!r}, which the scored rollouts lack")
        value = pl.col(column).cast(pl.Float64)
        if name == "self_certainty" and config.self_certainty_missing == "error":
            missing = scored[column].null_count()
            if missing:
                raise ValueError(
                    f"{missing} of {scored.height} rollouts have no self-certainty (their backend gave no "
                    "full next-token distribution): compute it (rollout.self_certainty: true with the "
                    "openai backend) or set reward.self_certainty_missing: zero"
                )
        if name == "corrected":  # no audit of this verifier version: its reward as it is
            value = pl.coalesce(value, pl.col("reward").cast(pl.Float64))
        if name == "length":
            value = (value - config.free_tokens).clip(lower_bound=0) / config.scale_tokens
        value = _mapped(value, component.mapping)
        recorded[name] = value
        terms.append(value.fill_null(0.0) * component.weight)
    composed = scored.with_columns(composed_reward=pl.sum_horizontal(terms))
    return composed.with_columns(reward_components=pl.struct(**recorded).struct.json_encode())


def _mapped(value: pl.Expr, mapping: dict[str, ValueMapping]) -> pl.Expr:
    if not mapping:
        return value

    def linear(rule: ValueMapping) -> pl.Expr:
        return rule.wrong + (rule.correct - rule.wrong) * value

    default = mapping.get("default")
    expression: Any = linear(default) if default is not None else value
    for domain, rule in mapping.items():
        if domain != "default":
            expression = pl.when(pl.col("domain") == domain).then(linear(rule)).otherwise(expression)
    return expression
