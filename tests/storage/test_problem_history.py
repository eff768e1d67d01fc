"""The difficulty ledger: every group of a problem with the DBB state after its iteration (`problem_history`),
per model version (`problem_estimates`), and what `rlvr lineage problem` says of it."""

import polars as pl
import pytest

from storage.catalog import open_catalog
from storage.lake import Lake
from storage.lineage import problem_history, problem_lineage
from storage.outputs import Outputs
from storage.schemas import VERIFICATION_ROUND


def groups(iteration: int, rows: list[tuple[str, int, int, float, bool]]) -> pl.DataFrame:
    """(problem_id, model_version, round, solve_rate, kept) rows of 8 samples each."""
    return pl.DataFrame(
        {
            "iteration": [iteration] * len(rows),
            "group_id": [f"{iteration}-{i}" for i in range(len(rows))],
            "problem_id": [row[0] for row in rows],
            "model_version": [row[1] for row in rows],
            "round": pl.Series([row[2] for row in rows], dtype=pl.Int32),
            "n_samples": [8] * len(rows),
            "mean_reward": [row[3] for row in rows],
            "std_reward": [0.5] * len(rows),
            "min_reward": [0.0] * len(rows),
            "max_reward": [1.0] * len(rows),
            "solve_rate": [row[3] for row in rows],
            "kept": [row[4] for row in rows],
            "filter_reason": [None if row[4] else "all_correct" for row in rows],
        }
    )


def state(iteration: int, alphas: dict[str, tuple[float, float]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "iteration": [iteration] * len(alphas),
            "problem_id": list(alphas),
            "dbb_alpha": [a for a, _ in alphas.values()],
            "dbb_beta": [b for _, b in alphas.values()],
        }
    )


@pytest.fixture
def ledger(tmp_path):
    lake = Lake.open(str(tmp_path / "lake"))
    iterations = {
        1: (groups(1, [("p", 0, 0, 0.25, True), ("q", 0, 0, 1.0, False)]), {"p": (3.0, 7.0), "q": (9.0, 1.0)}),
        2: (groups(2, [("p", 1, 0, 0.5, True), ("p", 1, VERIFICATION_ROUND, 1.0, True)]), {"p": (6.7, 10.3)}),
        3: (groups(3, [("p", 2, 1, 0.75, True)]), {"p": (12.03, 11.27)}),
    }
    for iteration, (rows, alphas) in iterations.items():
        with lake.run("compute-advantages", "advantages", {}, iteration=iteration) as run:
            key = {"iteration": iteration}
            lake.commit(Outputs().replace("groups", rows, key).replace("dbb_state", state(iteration, alphas), key), run)
    return lake


def test_the_ledger_holds_every_training_group_with_the_state_after_it(ledger):
    catalog = open_catalog(ledger)
    history = catalog.sql("select * from problem_history where problem_id = 'p' order by iteration").pl()
    assert history["iteration"].to_list() == [1, 2, 3]  # the verification group is not a trial of the problem
    assert history["successes"].to_list() == [2, 4, 6] and history["trials"].to_list() == [8, 8, 8]
    assert history["predicted_solve_rate"].to_list() == pytest.approx([0.3, 6.7 / 17, 12.03 / 23.3])
    ranked = catalog.sql(
        "select problem_id, predicted_solve_rate from problem_estimates where model_version = 0 "
        "order by predicted_solve_rate"
    ).pl()
    assert ranked.rows() == [("p", pytest.approx(0.3)), ("q", pytest.approx(0.9))]


def test_lineage_sums_the_problems_history(ledger, capsys):
    from flows.display import print_lineage

    history = problem_history(ledger, "p")
    assert (history["groups"], history["trials"], history["successes"], history["kept"]) == (3, 24, 12, 3)
    assert (history["first_iteration"], history["last_iteration"], history["model_versions"]) == (1, 3, (0, 2))
    assert history["predicted_solve_rate"] == pytest.approx(12.03 / 23.3)
    assert [group["iteration"] for group in history["recent"]] == [1, 2, 3]
    print_lineage({"problem_id": "p", "dropped": [], "history": history})
    shown = " ".join(capsys.readouterr().out.split())  # the console wraps at its width
    assert "3 group(s) in 3 iteration(s) (1-3), versions 0-2: 12 of 24 solved, 3 kept" in shown
    assert "predicted solve rate 0.52 (DBB α 12.03, β 11.27 after iteration 3)" in shown


def test_a_problem_never_drawn_has_no_history(ledger):
    assert problem_history(ledger, "never") is None
    assert problem_lineage(ledger, "never") is None  # not in the bank either
