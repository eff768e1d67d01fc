"""Training mixes: exact level shares, capacity-aware redistribution, domain weights, reproducibility."""

import polars as pl
import pytest

from tasks.curation.mix import allocate, sample_mix


def bank(cells: dict[tuple[int, str], int]) -> pl.DataFrame:
    rows = [
        {"problem_id": f"{level}-{domain}-{i}", "level": level, "domain": domain}
        for (level, domain), count in cells.items()
        for i in range(count)
    ]
    return pl.DataFrame(rows)


def shares(drawn: pl.DataFrame, column: str) -> dict:
    return dict(drawn.group_by(column).len().iter_rows())


def test_allocate_by_largest_remainder():
    assert allocate(100, {1: 0.2, 2: 0.45, 3: 0.3, 4: 0.05}, {1: 999, 2: 999, 3: 999, 4: 999}) == {
        1: 20,
        2: 45,
        3: 30,
        4: 5,
    }
    assert sum(allocate(7, {1: 0.2, 2: 0.45, 3: 0.3, 4: 0.05}, {1: 9, 2: 9, 3: 9, 4: 9}).values()) == 7


def test_allocate_spreads_a_shortfall_by_weight():
    assert allocate(100, {1: 0.2, 2: 0.45, 3: 0.3, 4: 0.05}, {1: 999, 2: 999, 3: 999, 4: 1}) == {
        1: 21,
        2: 47,
        3: 31,
        4: 1,
    }


def test_default_mix_is_20_45_30_5():
    problems = bank({(1, "math"): 500, (2, "math"): 500, (3, "math"): 500, (4, "math"): 500})
    drawn = sample_mix(problems, 200, seed=0)
    assert shares(drawn, "level") == {1: 40, 2: 90, 3: 60, 4: 10}
    assert drawn["problem_id"].n_unique() == 200


def test_seeded_and_reproducible():
    problems = bank({(1, "math"): 300, (2, "math"): 300, (3, "code"): 300, (4, "logic"): 300})
    first = sample_mix(problems, 100, seed=1)
    assert first.equals(sample_mix(problems, 100, seed=1))
    assert not first.equals(sample_mix(problems, 100, seed=2))
    shuffled = problems.sample(fraction=1.0, shuffle=True, seed=5)
    assert first["problem_id"].to_list() == sample_mix(shuffled, 100, seed=1)["problem_id"].to_list()


def test_domain_weights_within_each_level():
    problems = bank({(2, "math"): 500, (2, "code"): 500, (2, "logic"): 500})
    drawn = sample_mix(
        problems, 100, seed=0, level_weights={2: 1.0}, domain_weights={"math": 0.7, "code": 0.2, "logic": 0.1}
    )
    assert shares(drawn, "domain") == {"math": 70, "code": 20, "logic": 10}


def test_without_domain_weights_domains_keep_their_bank_share():
    problems = bank({(1, "math"): 300, (1, "logic"): 100})
    drawn = sample_mix(problems, 40, seed=0, level_weights={1: 1.0})
    assert shares(drawn, "domain") == {"math": 30, "logic": 10}


def test_asking_for_more_than_the_bank_holds_is_an_error():
    with pytest.raises(ValueError, match="holds only 10"):
        sample_mix(bank({(1, "math"): 10}), 11, seed=0)
    with pytest.raises(ValueError, match="levels with weight hold only 10"):
        sample_mix(bank({(1, "math"): 10, (2, "math"): 10}), 15, seed=0, level_weights={1: 1.0})


def test_a_zero_weight_domain_is_never_drawn():
    problems = bank({(1, "math"): 50, (1, "code"): 50})
    drawn = sample_mix(problems, 30, seed=0, level_weights={1: 1.0}, domain_weights={"math": 0.0, "code": 1.0})
    assert shares(drawn, "domain") == {"code": 30}
    with pytest.raises(ValueError, match="domains with weight hold only 50"):
        sample_mix(problems, 60, seed=0, level_weights={1: 1.0}, domain_weights={"math": 0.0, "code": 1.0})
    with pytest.raises(ValueError, match="does not hold"):
        sample_mix(problems, 10, seed=0, domain_weights={"chemistry": 1.0})
