"""The held-out draw: one mix over the split, or per source so small sets are taken whole."""

import pytest


@pytest.fixture(scope="module")
def two_eval_sources(tmp_path_factory, prefect_api):
    from flows.curation import curate_bank
    from storage.lake import Lake

    lake_uri = str(tmp_path_factory.mktemp("evaluation") / "lake")
    curate_bank({"sources": [
        {"kind": "generator", "generator": "mix", "count": 30, "seed": 0},
        {"kind": "generator", "name": "big-eval", "generator": "mix", "count": 60, "seed": 100, "split": "eval"},
        {"kind": "generator", "name": "small-eval", "generator": "mix", "count": 8, "seed": 200, "split": "eval"},
    ]}, lake_uri)
    return Lake.open(lake_uri)


def test_per_source_draws_take_small_sets_whole(two_eval_sources):
    from tasks.evaluation import EvalConfig, evaluation_problems

    problems = two_eval_sources.read("problems")
    sizes = dict(problems.filter(problems["split"] == "eval").group_by("source").len().rows())
    drawn = evaluation_problems(two_eval_sources, EvalConfig(per_source=20))
    assert dict(drawn.group_by("source").len().rows()) == {"big-eval": 20, "small-eval": sizes["small-eval"]}
    assert drawn["problem_id"].n_unique() == drawn.height
    again = evaluation_problems(two_eval_sources, EvalConfig(per_source=20))
    assert again["problem_id"].to_list() == drawn["problem_id"].to_list()          # seeded: the same each time
    one_draw = evaluation_problems(two_eval_sources, EvalConfig(max_problems=20))
    assert one_draw.height == 20


def test_sources_restrict_the_draw_and_unknown_names_are_refused(two_eval_sources):
    from tasks.evaluation import EvalConfig, evaluation_problems

    only = evaluation_problems(two_eval_sources, EvalConfig(sources=["small-eval"]))
    assert set(only["source"]) == {"small-eval"}
    with pytest.raises(ValueError, match=r"\['aime2024'\].*big-eval"):
        evaluation_problems(two_eval_sources, EvalConfig(sources=["aime2024"]))
