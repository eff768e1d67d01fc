"""The curriculum stage over the lake: measure solve rate per level, rebalance, record the change;
and move each reasoning-gym source's difficulty by its own solve rate (`gym_difficulty.py`).

A gym source that moves gets `gym_count` problems at its new step, curated into a new bank version
by the curation flow itself (passed in as `curate`, so this module imports no Prefect). Its problems
at older steps stay in the bank; `at_current_difficulty` is the filter that keeps them out of a
draw, and only groups at a source's current step count towards its next move.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl
import pyarrow.compute as pc
from pydantic import Field

from storage.config import Strict
from storage.lake import Lake
from storage.schemas import VERIFICATION_ROUND
from storage.seeds import derive_seed
from tasks.curation.config import SourceConfig
from tasks.curriculum.gym_difficulty import has_steps, max_step, next_difficulty, start_step
from tasks.curriculum.rebalance import rebalance


class CurriculumConfig(Strict):
    """Adaptive level mix; the configured mix is the starting point."""

    enabled: bool = Field(False, description="rebalance the level mix during the loop")
    every: int = Field(5, ge=1, description="rebalance after every this many iterations, from their groups")
    step: float = Field(0.5, gt=0, lt=1, description="relative change of a level's weight per rebalancing")
    floor: float = Field(0.02, ge=0, lt=0.25, description="smallest share a level keeps")
    gym_difficulty: bool = Field(
        True,
        description="also move each reasoning-gym source one curriculum step "
        "harder (> 90 %) or easier (< 10 %) by its own solve rate; off: gym sources "
        "keep their configured parameters",
    )
    gym_count: int = Field(
        200, ge=1, description="problems generated at a gym source's new step, added to the bank as a new version"
    )
    gym_min_groups: int = Field(
        8,
        ge=1,
        description="a gym source moves only on at least this many groups "
        "measured at its current step; fewer count as unmeasured",
    )


def current_level_weights(lake: Lake, configured: dict[int, float]) -> dict[int, float]:
    """The latest rebalanced mix, or the configured one before any rebalancing."""
    history = lake.read("curriculum", columns=["iteration", "level", "new_weight"])
    if history.is_empty():
        return configured
    latest = history.filter(pl.col("iteration") == history["iteration"].max())
    return {int(level): float(weight) for level, weight in latest.select("level", "new_weight").rows()}


def drawn_groups(lake: Lake, first: int, last: int) -> pl.DataFrame:
    """Problem and solve rate of the groups drawn over iterations first..last (surplus groups were
    sampled after the batch was full: they say nothing the kept ones do not, so they are left out; RISE's
    in-batch verification groups are not the mix's)."""
    groups = lake.read(
        "groups",
        filter=(pc.field("iteration") >= first) & (pc.field("iteration") <= last),
        columns=["problem_id", "solve_rate", "filter_reason", "round"],
    )
    drawn = (pl.col("filter_reason").fill_null("") != "surplus") & (pl.col("round").fill_null(0) != VERIFICATION_ROUND)
    return groups.filter(drawn).drop("filter_reason", "round")


def measured_solve_rates(lake: Lake, first: int, last: int) -> dict[int, float]:
    """Mean solve rate of the drawn groups per level over iterations first..last."""
    groups = drawn_groups(lake, first, last)
    levels = lake.read(
        "problems",
        filter=pc.field("problem_id").isin(groups["problem_id"].unique().to_list()),
        columns=["problem_id", "level"],
    ).unique("problem_id")
    by_level = groups.join(levels, on="problem_id").group_by("level").agg(pl.col("solve_rate").mean())
    return {int(level): float(rate) for level, rate in by_level.rows()}


def rebalanced(lake: Lake, iteration: int, config: CurriculumConfig, configured: dict[int, float]) -> pl.DataFrame:
    """The curriculum rows of a rebalancing after `iteration` (without run id)."""
    weights = current_level_weights(lake, configured)
    rates = measured_solve_rates(lake, iteration - config.every + 1, iteration)
    changes = rebalance(weights, rates, config.step, config.floor)
    return pl.DataFrame(
        [
            {
                "iteration": iteration,
                "level": c.level,
                "solve_rate": c.solve_rate,
                "old_weight": c.old_weight,
                "new_weight": c.new_weight,
                "reason": c.reason,
            }
            for c in changes
        ],
        schema_overrides={"solve_rate": pl.Float64},
    )


# ---- reasoning-gym difficulty ---------------------------------------------------------------


@dataclass(frozen=True)
class GymSource:
    source: str
    dataset: str
    level: int
    domain: str
    verifier: str
    step: int
    params: dict[str, Any]


@dataclass(frozen=True)
class GymMove:
    source: GymSource
    solve_rate: float | None
    groups: int
    new_step: int
    reason: str
    new_params: dict[str, Any]
    seed: int | None  # of the new step's problems; None when the source stays

    @property
    def moved(self) -> bool:
        return self.new_step != self.source.step


def gym_sources(lake: Lake, iteration: int) -> list[GymSource]:
    """Every training gym source whose dataset has a reasoning-gym curriculum, at its step before
    `iteration`'s decision: the last one recorded in `gym_curriculum`, or before any, the step its
    parameters reach in the bank version that first added it (later ones may be the curriculum's own)."""
    problems = lake.read(
        "problems",
        filter=(pc.field("source_kind") == "gym") & (pc.field("split") == "train"),
        columns=["source", "bank_version", "level", "domain", "verifier", "params"],
    )
    latest = _difficulty_history(lake, before=iteration)
    sources = []
    for row in problems.sort("bank_version").unique("source", keep="first").sort("source").iter_rows(named=True):
        stored = json.loads(row["params"] or "{}")
        dataset = stored.get("dataset")
        if not dataset or not has_steps(dataset):
            continue
        if row["source"] in latest:
            step, params, _ = latest[row["source"]]
        else:
            params = stored.get("config") or {}
            step = start_step(dataset, params)
        sources.append(
            GymSource(row["source"], dataset, int(row["level"]), row["domain"], row["verifier"], step, params)
        )
    return sources


def gym_solve_rates(lake: Lake, sources: list[GymSource], first: int, last: int) -> dict[str, tuple[float, int]]:
    """(mean solve rate, groups) per gym source over iterations first..last, counting only problems
    generated at the source's current step."""
    groups = drawn_groups(lake, first, last)
    current = {s.source: _params_key(s.params) for s in sources}
    if not current or groups.is_empty():
        return {}
    problems = lake.read(
        "problems",
        filter=pc.field("problem_id").isin(groups["problem_id"].unique().to_list())
        & pc.field("source").isin(list(current)),
        columns=["problem_id", "source", "params"],
    )
    problems = problems.unique("problem_id").filter(
        pl.Series(
            [_stored_key(p) == current[s] for s, p in zip(problems["source"], problems["params"])], dtype=pl.Boolean
        )
    )
    by_source = groups.join(problems, on="problem_id").group_by("source").agg(pl.col("solve_rate").mean(), pl.len())
    return {source: (float(rate), int(n)) for source, rate, n in by_source.rows()}


def gym_moves(lake: Lake, iteration: int, config: CurriculumConfig) -> list[GymMove]:
    """Each gym source's difficulty decision after `iteration`, from the last `every` iterations' groups."""
    sources = gym_sources(lake, iteration)
    measured = gym_solve_rates(lake, sources, iteration - config.every + 1, iteration)
    moves = []
    for source in sources:
        rate, groups = measured.get(source.source, (None, 0))
        step, reason, params = next_difficulty(
            source.dataset, source.step, source.params, rate if groups >= config.gym_min_groups else None
        )
        seed = derive_seed("gym-curriculum", source.source, iteration, step) % 2**31 if step != source.step else None
        moves.append(GymMove(source, rate, groups, step, reason, params, seed))
    return moves


def gym_curation(moves: list[GymMove], config: CurriculumConfig) -> dict[str, Any]:
    """The curation config (as the curation flow takes it) for the moved sources' new steps: same
    source name, level, domain and verifier, the new parameters, a seed derived from the iteration."""
    return {
        "sources": [
            SourceConfig(
                kind="gym",
                name=m.source.source,
                dataset=m.source.dataset,
                params=m.new_params,
                count=config.gym_count,
                level=m.source.level,
                domain=m.source.domain,
                verifier=m.source.verifier,
                seed=m.seed,
            ).model_dump(mode="json", exclude_defaults=True)
            for m in moves
            if m.moved
        ]
    }


def moved_gym_difficulty(
    lake: Lake, iteration: int, config: CurriculumConfig, curate: Callable[[dict[str, Any]], dict[str, Any]]
) -> pl.DataFrame:
    """The gym_curriculum rows after `iteration` (without run id). `curate` is the curation flow,
    given the moved sources' config; it returns the bank version and a per-source report."""
    moves = gym_moves(lake, iteration, config)
    moved = [m for m in moves if m.moved]
    curated = curate(gym_curation(moved, config)) if moved else {"bank_version": None, "sources": []}
    kept = {report["source"]: report["kept"] for report in curated["sources"]}
    return pl.DataFrame(
        [
            {
                "iteration": iteration,
                "source": m.source.source,
                "dataset": m.source.dataset,
                "solve_rate": m.solve_rate,
                "groups": m.groups,
                "old_step": m.source.step,
                "new_step": m.new_step,
                "max_step": max_step(m.source.dataset),
                "reason": m.reason,
                "old_params": _params_key(m.source.params),
                "new_params": _params_key(m.new_params),
                "bank_version": curated["bank_version"] if m.moved else None,
                "problems": kept.get(m.source.source) if m.moved else None,
                "seed": m.seed,
            }
            for m in moves
        ],
        schema=GYM_ROW_SCHEMA,
    )


def at_current_difficulty(lake: Lake, problems: pl.DataFrame) -> pl.DataFrame:
    """`problems` (with source and params) less the gym problems of steps their source has moved away
    from: the rows a training draw should see. Sources the curriculum never moved keep all theirs."""
    current = {source: _params_key(params) for source, (_, params, moved) in _difficulty_history(lake).items() if moved}
    if not current:
        return problems
    keep = [
        source not in current or _stored_key(params) == current[source]
        for source, params in zip(problems["source"], problems["params"])
    ]
    return problems.filter(pl.Series(keep, dtype=pl.Boolean))


GYM_ROW_SCHEMA = {
    "iteration": pl.Int64,
    "source": pl.String,
    "dataset": pl.String,
    "solve_rate": pl.Float64,
    "groups": pl.Int64,
    "old_step": pl.Int64,
    "new_step": pl.Int64,
    "max_step": pl.Int64,
    "reason": pl.String,
    "old_params": pl.String,
    "new_params": pl.String,
    "bank_version": pl.Int64,
    "problems": pl.Int64,
    "seed": pl.Int64,
}


def _difficulty_history(lake: Lake, before: int | None = None) -> dict[str, tuple[int, dict[str, Any], bool]]:
    """Per gym source: its latest recorded step and parameters, and whether it ever moved."""
    history = lake.read(
        "gym_curriculum",
        filter=None if before is None else pc.field("iteration") < before,
        columns=["iteration", "source", "old_step", "new_step", "new_params"],
    )
    moved = set(history.filter(pl.col("old_step") != pl.col("new_step"))["source"].to_list())
    latest = history.sort("iteration").unique("source", keep="last")
    return {
        source: (int(step), json.loads(params), source in moved)
        for source, step, params in latest.select("source", "new_step", "new_params").rows()
    }


def _params_key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def _stored_key(params: str | None) -> str:
    """`_params_key` of the dataset parameters a gym problem's params column records."""
    return _params_key(json.loads(params or "{}").get("config") or {})
