"""Our procedural generators: seeded, levelled, and their answers checked by independent computation."""

import itertools
import math
import re
from fractions import Fraction

import pytest

from storage.seeds import derive_seed
from tasks.generators import GENERATORS, families, generate, regenerate

SAMPLES = 60


def samples(name):
    return [regenerate(name, derive_seed("test", name, i)) for i in range(SAMPLES)]


def test_same_seed_same_problems_other_seed_other_problems():
    first = [p.prompt for _, _, p in generate("mix", 200, seed=7)]
    again = [p.prompt for _, _, p in generate("mix", 200, seed=7)]
    other = [p.prompt for _, _, p in generate("mix", 200, seed=8)]
    assert first == again
    assert len(set(first) & set(other)) < 20


def test_each_problem_can_be_rebuilt_from_its_recorded_seed():
    for generator, seed, problem in generate("mix", 100, seed=3):
        assert regenerate(generator.name, seed) == problem


def test_mix_follows_the_level_shares():
    levels = [g.level for g, _, _ in generate("mix", 4000, seed=0)]
    shares = {level: levels.count(level) / len(levels) for level in (1, 2, 3, 4)}
    for level, expected in {1: 0.20, 2: 0.45, 3: 0.30, 4: 0.05}.items():
        assert abs(shares[level] - expected) < 0.03


def test_selectors():
    assert {g.level for g in families("level3")} == {3}
    assert [g.name for g in families("vieta")] == ["vieta"]
    with pytest.raises(ValueError, match="unknown generator"):
        families("level9")


def test_every_family_has_a_level_and_steps():
    for name, generator in GENERATORS.items():
        if (
            generator.domain != "math"
        ):  # the other domains' solutions are certificates (tests/tasks/generators/test_domains.py)
            continue
        problem = samples(name)[0]
        assert 1 <= generator.level <= 4
        assert problem.steps and all("=" in step for step in problem.steps)
        assert problem.solution.rstrip().endswith(f"#### {problem.answer}")


def test_arith_chain_answers():
    for problem in samples("arith_chain"):
        expression = problem.params["expression"]
        assert re.fullmatch(r"[\d +\-*]+", expression)
        assert int(problem.answer) == eval(expression)  # our own generated expression of digits and + - *
        assert 2 <= problem.params["n_ops"] <= 4


def test_word_problem_steps_chain_to_the_answer():
    for problem in samples("word_problem"):
        assert 2 <= len(problem.steps) <= 4
        assert problem.steps[-1].split("=")[1] == problem.answer


def test_linear_equation_root_satisfies_the_equation():
    for problem in samples("linear_equation"):
        a, b, c, d = (problem.params[k] for k in "abcd")
        x = int(problem.answer)
        assert a * x + b == c * x + d


def test_linear_system_answer():
    for problem in samples("linear_system"):
        a, b, c, d = problem.params["coefficients"]
        e, f = problem.params["constants"]
        solutions = [
            (x, y) for x in range(-10, 11) for y in range(-10, 11) if a * x + b * y == e and c * x + d * y == f
        ]
        ((x, y),) = solutions
        expected = {"x + y": x + y, "x - y": x - y, "xy": x * y, "2x + 3y": 2 * x + 3 * y}[problem.params["asked"]]
        assert int(problem.answer) == expected


def test_fraction_arithmetic_is_in_lowest_terms():
    for problem in samples("fraction_arithmetic"):
        (a, b), (c, d), (e, f) = problem.params["fractions"]
        inner = Fraction(a, b) + Fraction(c, d) if problem.params["sign"] == "+" else Fraction(a, b) - Fraction(c, d)
        assert Fraction(problem.answer) == inner * Fraction(e, f)
        if "/" in problem.answer:
            p, q = map(int, problem.answer.lstrip("-").split("/"))
            assert math.gcd(p, q) == 1


def test_polynomial_value():
    for problem in samples("polynomial_value"):
        c3, c2, c1, c0 = problem.params["coefficients"]
        x = problem.params["x"]
        assert int(problem.answer) == c3 * x**3 + c2 * x**2 + c1 * x + c0


def test_number_theory_families_by_brute_force():
    for problem in samples("modular_powers"):
        p = problem.params
        assert int(problem.answer) == (p["a"] ** p["n"] + p["b"] ** p["m"]) % p["k"]
    for problem in samples("divisor_function"):
        number = int(
            re.search(
                r"(\d+)",
                problem.prompt.split("of ")[-1] if "sum" in problem.prompt else problem.prompt.split("does ")[-1],
            ).group(1)
        )
        divisors = [k for k in range(1, math.isqrt(number) + 1) if number % k == 0]
        divisors = set(divisors) | {number // k for k in divisors}
        expected = sum(divisors) if "sum" in problem.prompt else len(divisors)
        assert int(problem.answer) == expected
    for problem in samples("chinese_remainder"):
        moduli, remainders = problem.params["moduli"], problem.params["remainders"]
        smallest = next(x for x in itertools.count(1) if all(x % m == r for m, r in zip(moduli, remainders)))
        assert int(problem.answer) == smallest


def test_lcm_pairs_by_brute_force_on_small_numbers():
    checked = 0
    for problem in samples("lcm_pairs"):
        number = int(problem.prompt.rsplit("= ", 1)[1].rstrip("?"))
        if number > 3000:
            continue
        divisors = [k for k in range(1, number + 1) if number % k == 0]
        pairs = sum(1 for a in divisors for b in divisors if math.lcm(a, b) == number)
        assert int(problem.answer) == pairs
        checked += 1
    assert checked >= 3


def test_vieta_from_the_roots():
    for problem in samples("vieta"):
        r, s = problem.params["roots"]
        expected = {
            "r^2 + s^2": Fraction(r * r + s * s),
            "1/r + 1/s": Fraction(1, r) + Fraction(1, s),
            "r^3 + s^3": Fraction(r**3 + s**3),
        }[problem.params["asked"]]
        assert Fraction(problem.answer) == expected


def test_counting_families_by_enumeration():
    for problem in samples("lattice_paths"):
        (width, height), (vx, vy) = problem.params["target"], problem.params["via"]
        assert int(problem.answer) == math.comb(vx + vy, vx) * math.comb(width - vx + height - vy, width - vx)
    for problem in samples("bounded_compositions")[:15]:
        p = problem.params
        count = sum(1 for xs in itertools.product(range(p["cap"] + 1), repeat=p["parts"]) if sum(xs) == p["total"])
        assert int(problem.answer) == count


def test_generation_is_seeded_per_problem_not_per_stream():
    """Problem i does not depend on how many problems come before it."""
    short = list(generate("level2", 5, seed=1))
    long = list(generate("level2", 50, seed=1))
    assert [p for _, _, p in short] == [p for _, _, p in long[:5]]


def test_two_step_drill_and_its_heldout_quarter_never_overlap():
    train = {p.prompt for _, _, p in generate("two_step", 3000, seed=0)}
    held_out = {p.prompt for _, _, p in generate("two_step_eval", 700, seed=1)}
    assert not train & held_out and len(held_out) >= 500  # enough distinct problems for a 500-problem eval set
    for _, _, problem in generate("two_step", 50, seed=2):
        a, b, c = problem.params["a"], problem.params["b"], problem.params["c"]
        assert int(problem.answer) == a * b + c and problem.solution.endswith(f"\n#### {a * b + c}")
    assert "two_step" not in {g.name for g in families("mix")} | {g.name for g in families("level1")}


def test_the_other_domains_are_named_families_outside_the_math_mix():
    others = {name: g for name, g in GENERATORS.items() if g.domain != "math"}
    assert {g.verifier for g in others.values()} == {
        "sat",
        "game",
        "translation",
        "selfplay",
        "proposal",
        "self_verify",
        "challenge",
    }
    assert not any(g.in_mix for g in others.values())
    assert {g.name for g in families("mix")}.isdisjoint(others)
    assert [g.level for g in families("sat")] == [1, 2, 3, 4]
