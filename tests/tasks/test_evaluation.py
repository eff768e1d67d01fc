"""The held-out draw: one mix over the split, or per source so small sets are taken whole."""

import pytest


@pytest.fixture(scope="module")
def two_eval_sources(tmp_path_factory, prefect_api):
    from flows.curation import curate_bank
    from storage.lake import Lake

    lake_uri = str(tmp_path_factory.mktemp("evaluation") / "lake")
    curate_bank(
        {
            "sources": [
                {"kind": "generator", "generator": "mix", "count": 30, "seed": 0},
                {
                    "kind": "generator",
                    "name": "big-eval",
                    "generator": "mix",
                    "count": 60,
                    "seed": 100,
                    "split": "eval",
                },
                {
                    "kind": "generator",
                    "name": "small-eval",
                    "generator": "mix",
                    "count": 8,
                    "seed": 200,
                    "split": "eval",
                },
            ]
        },
        lake_uri,
    )
    return Lake.open(lake_uri)


def test_per_source_draws_take_small_sets_whole(two_eval_sources):
    from tasks.evaluation import EvalConfig, evaluation_problems

    problems = two_eval_sources.read("problems")
    sizes = dict(problems.filter(problems["split"] == "eval").group_by("source").len().rows())
    drawn = evaluation_problems(two_eval_sources, EvalConfig(per_source=20))
    assert dict(drawn.group_by("source").len().rows()) == {"big-eval": 20, "small-eval": sizes["small-eval"]}
    assert drawn["problem_id"].n_unique() == drawn.height
    again = evaluation_problems(two_eval_sources, EvalConfig(per_source=20))
    assert again["problem_id"].to_list() == drawn["problem_id"].to_list()  # seeded: the same each time
    one_draw = evaluation_problems(two_eval_sources, EvalConfig(max_problems=20))
    assert one_draw.height == 20


def test_sources_restrict_the_draw_and_unknown_names_are_refused(two_eval_sources):
    from tasks.evaluation import EvalConfig, evaluation_problems

    only = evaluation_problems(two_eval_sources, EvalConfig(sources=["small-eval"]))
    assert set(only["source"]) == {"small-eval"}
    with pytest.raises(ValueError, match=r"\['aime2024'\].*big-eval"):
        evaluation_problems(two_eval_sources, EvalConfig(sources=["aime2024"]))


# ---- stored responses, pass@k and re-scoring (issue 14) -------------------------------------------------------
def test_pass_at_k_by_hand():
    from tasks.evaluation import pass_at_k

    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 − C(3,2)/C(5,2)
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)  # pass@1 is the solve rate
    assert pass_at_k(4, 0, 3) == 0.0 and pass_at_k(3, 3, 3) == 1.0 and pass_at_k(6, 4, 3) == 1.0
    with pytest.raises(ValueError, match="at least 4 samples"):
        pass_at_k(3, 1, 4)


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, prefect_api):
    """A lake after one loop iteration whose evaluation sampled 3 responses per problem (pass@3)."""
    from helpers import RUN, curated_with_eval

    from flows.loop import rl_loop

    lake_uri = str(tmp_path_factory.mktemp("evaluated") / "lake")
    curated_with_eval(lake_uri)
    rl_loop(
        {**RUN, "evaluation": {**RUN["evaluation"], "k": 3}, "loop": {"iterations": 1, "evaluate_every": 1}},
        lake_uri=lake_uri,
    )
    return lake_uri


def test_every_held_out_response_is_kept_with_its_score(evaluated):
    import polars as pl

    from storage.lake import Lake
    from tasks.evaluation import pass_at_k

    lake = Lake.open(evaluated)
    responses = lake.read("eval_rollouts")
    evaluation = lake.read("evaluations")
    assert set(responses["scoring"]) == {"own"} and set(evaluation["k"]) == {3}
    assert responses.group_by("problem_id").len()["len"].to_list() == [3] * responses["problem_id"].n_unique()
    assert responses["response_id"].is_unique().all() and responses["run_id"].n_unique() == 1
    assert evaluation["run_id"][0] == responses["run_id"][0]  # one evaluation run wrote both
    per_problem = responses.group_by("problem_id").agg(n=pl.len(), c=pl.col("correct").fill_null(False).sum())
    expected = sum(pass_at_k(n, c, 3) for n, c in per_problem.select("n", "c").rows()) / per_problem.height
    weighted = (evaluation["pass_at_k"] * evaluation["problems"]).sum() / evaluation["problems"].sum()
    assert weighted == pytest.approx(expected)
    assert evaluation["solved"].sum() == responses["correct"].fill_null(False).sum()


def test_a_stored_evaluation_is_re_scored_without_sampling(evaluated, monkeypatch):
    import polars as pl

    import tasks.evaluation
    from flows.stages import rerun_stage
    from storage.lake import Lake

    def no_sampling(*args, **kwargs):
        raise AssertionError("a re-score must not load the policy")

    monkeypatch.setattr(tasks.evaluation, "open_policy", no_sampling)
    lake = Lake.open(evaluated)
    own = lake.read("eval_rollouts").filter(pl.col("scoring") == "own").sort("response_id")
    (summary,) = rerun_stage("evaluate", 1, {"evaluation": {"verifier": "flipped"}}, lake_uri=evaluated)
    assert summary["stage"] == "evaluate" and not summary.get("skipped")
    both = lake.read("eval_rollouts")
    flipped = both.filter(pl.col("scoring") == "flipped").sort("response_id")
    assert flipped["response"].to_list() == own["response"].to_list()  # the same responses, scored again
    assert set(flipped["verifier"]) == {"flipped"}
    assert (flipped["reward"] + own["reward"]).to_list() == [1.0] * own.height  # flipped: 1 − the own verdict
    evaluation = lake.read("evaluations")
    assert set(evaluation["scoring"]) == {"flipped"}
    assert evaluation["solved"].sum() == flipped["correct"].fill_null(False).sum()
    assert both.filter(pl.col("scoring") == "own").height == own.height  # the own scores stay beside them


def test_evaluate_reports_pass_at_k_at_the_command_line(evaluated, cli):
    result = cli("evaluate", "--k", "2", "--force", "--lake", evaluated)
    assert result.returncode == 0, result.stderr
    assert "pass@2" in result.stdout and "pass@1" in result.stdout
