"""One round of dynamic sampling, composed of the stages' two sides: a round draws problems not yet drawn this
iteration (by the training mix, or guided by the lake's history), hands them to `sample` (the rollout stage:
prompts, G responses each, rollout rows) and the rows with their problems to `score` (the verification stage:
reward rows), and returns each rollout's own verdict to `fill_batch` (`rounds.py`).

`GroupSampler.draw` is `fill_batch`'s `draw_groups` and `GroupSampler.plan` its `plan`. It keeps every rollout
and reward it made, kept or not, so that the stages write all of them and the groups table can say why each
was dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl
import pyarrow.compute as pc

from storage.lake import Lake
from storage.schemas import VERIFICATION_ROUND
from storage.seeds import derive_seed
from tasks.curation.config import MixConfig
from tasks.sampling.groups import success
from tasks.sampling.guided import HISTORY_COLUMNS, groups_to_draw, ranked_candidates
from tasks.sampling.rounds import DynamicSamplingConfig
from tasks.sampling.selection import draw_by_tier
from tasks.verification.stage import PROBLEM_FIELDS, ROLLOUT_FIELDS, own_rewards

Sample = Callable[[pl.DataFrame, int, int], pl.DataFrame]  # (problems, round, seed) -> one row per rollout
Score = Callable[[pl.DataFrame], pl.DataFrame]  # rollouts with their problems -> reward rows


@dataclass
class GroupSampler:
    """Draws problems, has them sampled and scored, round by round; keeps everything it made."""

    sample: Sample
    score: Score
    bank: pl.DataFrame  # the problems a round may draw: PROBLEM_FIELDS, level, source
    config: DynamicSamplingConfig
    mix: MixConfig
    group_size: int  # G, which guided ranking's predictions depend on
    seed: int  # the root seed: each round's draw and sampling seeds derive from it and the iteration
    iteration: int
    verifier: str | None  # the verifier whose verdict says a rollout is correct (verify.verifier)
    reserved_source: str = ""  # problems the mix never draws (RISE's banked verification tasks)
    reserved_share: float = 0.0  # share of each round's draw taken from `reserved_source` (lagged RISE)
    history: pl.DataFrame | None = None  # guided sampling: the lake's past groups (problem_id, iteration, ...)
    labels: pl.DataFrame | None = None  # selection: each bank problem's drawn_as and tier (`selection.py`)
    rollouts: list[pl.DataFrame] = field(default_factory=list)
    rewards: list[pl.DataFrame] = field(default_factory=list)
    scored: list[pl.DataFrame] = field(default_factory=list)  # what was scored: rollouts with their problems
    drawn: set[str] = field(default_factory=set)
    ranked: pl.DataFrame | None = None  # guided sampling: this round's candidates, likeliest kept first
    planned: list[dict] = field(default_factory=list)  # guided sampling: per round, groups drawn and expected kept

    def plan(self, missing: int, round_: int) -> int:
        """Guided sampling: rank a pool of candidates drawn by the mix by their predicted keep probability, and
        draw as many as those predictions need to fill the batch (`guided.py`). Without history (a first
        iteration) the round is `oversample` × missing, drawn by the mix. `round_` is the generation round it
        plans (its pool's seed), as `fill_batch` counts them."""
        guidance = self.config.guidance
        self.ranked = None
        if self.history is None or self.history.is_empty():
            return math.ceil(missing * self.config.oversample)
        available = self._available().filter(pl.col("source") != self.reserved_source)
        pool = min(available.height, math.ceil(missing * guidance.pool))
        try:
            candidates = self._by_mix(available, pool, self._seed(round_, "draw"))
        except ValueError:  # the mix's levels hold fewer: draw as an unguided round does
            return math.ceil(missing * self.config.oversample)
        self.ranked = ranked_candidates(
            candidates, self.history, self.iteration, self.group_size, self.config.band, guidance, self.bank
        )
        keep = self.ranked["keep_probability"].to_list()
        n = groups_to_draw(keep, missing, guidance.confidence, cap=len(keep))
        self.planned.append({"round": round_, "groups": n, "expected_kept": float(sum(keep[:n]))})
        return n

    def draw(self, n_groups: int, round_: int) -> pl.DataFrame:
        """`n_groups` new groups, scored: one row per rollout with group_id, problem_id, reward, correct."""
        available = self._available()
        n = min(n_groups, available.height)
        if n == 0:
            return pl.DataFrame(
                schema={"group_id": pl.String, "problem_id": pl.String, "reward": pl.Float64, "correct": pl.Boolean}
            )
        problems = self._drawn(available, n, self._seed(round_, "draw"))
        self.drawn.update(problems["problem_id"].to_list())
        rows = self.sample(problems, round_, self._seed(round_, "sample"))
        if self.labels is not None:  # why selection drew each problem, on its rollouts
            rows = rows.join(
                self.labels.select("problem_id", "drawn_as"), on="problem_id", how="left", maintain_order="left"
            )
        to_score = rows.select(ROLLOUT_FIELDS).join(problems.select(PROBLEM_FIELDS), on="problem_id", how="left")
        rewards = self.score(to_score)
        self.rollouts.append(rows)
        self.rewards.append(rewards)
        self.scored.append(to_score)
        own = own_rewards(rewards, to_score, self.verifier)
        return rows.select("rollout_id", "group_id", "problem_id").join(
            own.select("rollout_id", "reward", correct=success()), on="rollout_id", how="left", maintain_order="left"
        )

    def _seed(self, round_: int, purpose: str) -> int:
        return derive_seed(self.seed, self.iteration, round_, purpose)

    def _available(self) -> pl.DataFrame:
        return self.bank.filter(~pl.col("problem_id").is_in(list(self.drawn)))

    def _drawn(self, available: pl.DataFrame, n: int, seed: int) -> pl.DataFrame:
        """`n` problems by the training mix; `reserved_share` of them from the reserved source (as many as the
        bank holds), the rest the mix's."""
        is_reserved = pl.col("source") == self.reserved_source
        reserved = available.filter(is_reserved) if self.reserved_share else available.clear()
        others = available.filter(~is_reserved)
        n_reserved = min(reserved.height, round(n * self.reserved_share))
        n_others = min(others.height, n - n_reserved)
        if self.ranked is not None:  # guided: the likeliest-kept candidates of `plan`
            parts = [self.ranked.head(n_others).select(others.columns)] if n_others else []
        else:
            parts = [self._by_mix(others, n_others, seed)] if n_others else []
        if n_reserved:
            parts.append(reserved.sort("problem_id").sample(n_reserved, seed=derive_seed(seed, "self-verify") % 2**32))
        return pl.concat(parts) if parts else available.clear()

    def _by_mix(self, problems: pl.DataFrame, n: int, seed: int) -> pl.DataFrame:
        """`n` problems by the training mix, the selection's first tiers first when it labels the bank."""
        return draw_by_tier(problems, self.labels, n, seed, self.mix.level_weights, self.mix.domain_weights)


def sampling_history(lake: Lake, config: DynamicSamplingConfig, iteration: int) -> pl.DataFrame | None:
    """Guided sampling's evidence: the groups of the last `guidance.history` iterations (None when off)."""
    if not config.guidance.enabled or not lake.exists("groups"):
        return None
    window = (pc.field("iteration") >= iteration - config.guidance.history) & (pc.field("iteration") < iteration)
    return lake.read("groups", filter=window, columns=HISTORY_COLUMNS)


def selection_ledger(lake: Lake, config: DynamicSamplingConfig, iteration: int) -> pl.DataFrame | None:
    """Selection's evidence: every group of the difficulty ledger before `iteration` (the last `selection.history`
    iterations of them when set), RISE's verification round apart; None when selection is off."""
    selection = config.selection
    if not selection.enabled:
        return None
    if not lake.exists("groups"):  # a first iteration: every problem unseen
        schema = {"problem_id": pl.String, "iteration": pl.Int64, "solve_rate": pl.Float64, "n_samples": pl.Int64}
        return pl.DataFrame(schema=schema)
    window = pc.field("iteration") < iteration
    if selection.history:
        window = window & (pc.field("iteration") >= iteration - selection.history)
    groups = lake.read("groups", filter=window, columns=[*HISTORY_COLUMNS, "round"])
    return groups.filter(pl.col("round").fill_null(0) != VERIFICATION_ROUND).drop("round")
