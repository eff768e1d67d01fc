"""The frames behind the report's plots, read from a DuckDB catalog (`storage.catalog.open_catalog`).

Where a predefined view of `storage/views.py` answers the question, the frame is that view, so the
report and `rlvr sql "select * from <view>"` can never disagree. A frame is empty when the tables it
needs are absent (a lake that never evaluated has no `evaluations`); the plots skip empty frames.

Rewards: an iteration can be scored by several verifiers (a re-score, a reward control). The
distributions use the verifier that scored the iteration first (the earliest run), which is the one
the loop trained on unless the iteration was re-scored on purpose.
"""

from __future__ import annotations

import duckdb
import polars as pl

# The verifier (and version) that scored each iteration first, per the sortable run ids.
FIRST_VERIFIER = """
    verifier_runs as (
        select iteration, verifier, verifier_version, min(run_id) as first_run from rewards group by 1, 2, 3),
    first_verifier as (
        select iteration, verifier, verifier_version from verifier_runs
        qualify row_number() over (partition by iteration order by first_run, verifier, verifier_version) = 1),
    scored as (
        select w.* from rewards w join first_verifier using (iteration, verifier, verifier_version))"""


# Branches (old iterations re-trained by `rlvr stage train`) are not the run's curve; lineage shows them.
MAIN_LINE = "model_version not in (select model_version from model_versions where kind = 'rl-branch')"


def relations(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The tables and views the catalog holds."""
    return {name for (name,) in con.sql("select table_name from information_schema.tables").fetchall()}


def view(con: duckdb.DuckDBPyConnection, name: str, where: str = "") -> pl.DataFrame:
    """A predefined view's rows, or an empty frame when the view's tables are absent."""
    if name not in relations(con):
        return pl.DataFrame()
    return con.sql(f"select * from {name} {where}").pl()


def pick_iterations(iterations: list[int], k: int = 3) -> list[int]:
    """Up to `k` iterations spread over the run: the first, the last, and evenly spaced ones between."""
    ordered = sorted(set(iterations))
    if len(ordered) <= k:
        return ordered
    return sorted({ordered[round(i * (len(ordered) - 1) / (k - 1))] for i in range(k)})


def sampled_iterations(con: duckdb.DuckDBPyConnection) -> list[int]:
    """Iterations with rollouts, in order."""
    if "rollouts" not in relations(con):
        return []
    return [i for (i,) in con.sql("select distinct iteration from rollouts order by 1").fetchall()]


def rewards(con: duckdb.DuckDBPyConnection, iterations: list[int]) -> pl.DataFrame:
    """iteration, verifier, reward: the first verifier's rewards of the given iterations."""
    if "rewards" not in relations(con) or not iterations:
        return pl.DataFrame()
    return con.sql(
        f"with {FIRST_VERIFIER} select iteration, verifier, reward from scored "
        "where iteration in (select unnest($1)) order by iteration, rollout_id",
        params=[iterations],
    ).pl()


def response_lengths(con: duckdb.DuckDBPyConnection, iterations: list[int]) -> pl.DataFrame:
    """iteration, n_tokens, solved (null when unscored), finish_reason of the given iterations' rollouts."""
    present = relations(con)
    if "rollouts" not in present or not iterations:
        return pl.DataFrame()
    if "rewards" in present:
        query = (
            f"with {FIRST_VERIFIER} select r.iteration, r.n_tokens, "
            "coalesce(s.correct, s.reward >= 0.5) as solved, r.finish_reason "
            "from rollouts r left join scored s using (rollout_id)"
        )
    else:
        query = "select r.iteration, r.n_tokens, null::boolean as solved, r.finish_reason from rollouts r"
    return con.sql(
        f"{query} where r.iteration in (select unnest($1)) and r.n_tokens is not null "
        "order by r.iteration, r.rollout_id",
        params=[iterations],
    ).pl()


def gather(con: duckdb.DuckDBPyConnection, distribution_iterations: int = 3) -> dict[str, pl.DataFrame]:
    """Every frame the plots draw, by name."""
    picked = pick_iterations(sampled_iterations(con), distribution_iterations)
    return {
        "eval_solve_rate_by_level": view(con, "eval_solve_rate_by_level", f"where {MAIN_LINE}"),
        "eval_pass_at_k": view(con, "eval_pass_at_k", f"where {MAIN_LINE} and k > 1"),
        "train_solve_rate_by_level": view(con, "solve_rate_by_level", "where model_version is not null"),
        "rewards": rewards(con, picked),
        "response_lengths": response_lengths(con, picked),
        "learning_zone_share": view(con, "learning_zone_share"),
        "filter_stats": view(con, "filter_stats"),
        "proposal_health": view(con, "proposal_health"),
    }


def summary(con: duckdb.DuckDBPyConnection) -> dict:
    """The run at a glance: sizes, the latest model version, held-out solve rate first and last, the last iteration."""
    present = relations(con)

    def one(query: str) -> dict:
        frame = con.sql(query).pl()
        return frame.row(0, named=True) if frame.height else {}

    result: dict = {}
    if "problems" in present:
        result |= one(
            "select max(bank_version) as bank_version, count(distinct problem_id) as problems, "
            "count(distinct problem_id) filter (where split = 'eval') as eval_problems from problems"
        )
    if "rollouts" in present:
        result |= one(
            "select count(distinct iteration) as iterations, max(iteration) as last_iteration, "
            "count(*) as rollouts from rollouts"
        )
    if "model_versions" in present:
        result |= one(
            "select model_version as latest_model_version, kind as latest_model_kind from model_versions "
            "where kind is distinct from 'rl-branch' order by model_version desc limit 1"
        )
    if "evaluations" in present:
        evaluated = con.sql(
            "select model_version, sum(solved) / sum(samples) as solve_rate, sum(problems) as problems "
            f"from evaluations where {MAIN_LINE} group by 1 order by 1"
        ).pl()
        if evaluated.height:
            result["first_eval"] = evaluated.row(0, named=True)
            result["last_eval"] = evaluated.row(-1, named=True)
    if "rewards" in present and result.get("last_iteration") is not None:
        result |= one(
            f"with {FIRST_VERIFIER} select avg(reward) as last_mean_reward from scored "
            f"where iteration = {int(result['last_iteration'])}"
        )
    if "learning_zone_share" in present:
        result |= one("select zone_share as last_zone_share from learning_zone_share order by iteration desc limit 1")
    return result
