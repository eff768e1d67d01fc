"""Our own seeded generators, levels 1 to 4.

Math (the `mix`): level 1 2-4 arithmetic steps, level 2 4-8 steps with algebra, level 3 multi-tool
competition style, level 4 a few hard counting and number-theory problems. Other verifiable domains,
by name only (`gen:sat:N`, or `sat_level3` for one level): `sat` (CNF satisfiability with a proof,
verifier `sat`), `tictactoe` and `connect4` (a move that keeps the best result, verifier `game`),
`translation` (English → French against a rule-built reference, verifier `translation`), and
self-play's warm-up examples (`selfplay_solver`, `selfplay_proposer`, `tasks/generators/programs.py`; SPICE's
`spice_challenger`, `tasks/generators/grounded.py`). Every
problem is reproducible from (generator, seed) alone, and records both.

May import: storage (seeds derived from names), tasks.proposals (self-play's and SPICE's task text), tasks.verifiers
(a generator checks its own answers with them); nothing of the lake.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

from storage.seeds import derive_seed
from tasks.generators import algebra, arithmetic, competition, games, grounded, logic, programs, translation
from tasks.generators.base import Generated


@dataclass(frozen=True)
class Generator:
    name: str
    level: int
    make: Callable[[random.Random], Generated]
    in_mix: bool = True  # False: only by name (a drill family, e.g. for the tiny model's learning run)
    domain: str = "math"
    verifier: str | None = None  # None: the domain's default verifier


def _levels(name: str, make, domain: str, verifier: str) -> list[Generator]:
    """A family with four levels: `name` draws across them, `name_levelN` one of them."""
    return [
        Generator(f"{name}_level{level}", level, partial(make, level=level), False, domain, verifier)
        for level in (1, 2, 3, 4)
    ]


OTHER_DOMAINS = {
    "sat": (logic.sat, "logic", "sat"),
    "tictactoe": (games.tictactoe, "logic", "game"),
    "connect4": (games.connect4, "logic", "game"),
    "translation": (translation.translation, "qa", "translation"),
}


GENERATORS: dict[str, Generator] = {
    g.name: g
    for g in [
        Generator("arith_chain", 1, arithmetic.arith_chain),
        Generator("two_step", 1, arithmetic.two_step, in_mix=False),
        Generator("two_step_eval", 1, arithmetic.two_step_eval, in_mix=False),
        Generator("two_step_verify", 1, arithmetic.two_step_verify, False, "qa", "self_verify"),
        Generator("two_step_tool", 1, arithmetic.two_step_tool, in_mix=False),
        Generator("two_step_tool_eval", 1, arithmetic.two_step_tool_eval, in_mix=False),
        Generator("word_problem", 1, arithmetic.word_problem),
        Generator("linear_equation", 2, algebra.linear_equation),
        Generator("linear_system", 2, algebra.linear_system),
        Generator("fraction_arithmetic", 2, algebra.fraction_arithmetic),
        Generator("polynomial_value", 2, algebra.polynomial_value),
        Generator("modular_powers", 3, competition.modular_powers),
        Generator("divisor_function", 3, competition.divisor_function),
        Generator("vieta", 3, competition.vieta),
        Generator("lattice_paths", 3, competition.lattice_paths),
        Generator("chinese_remainder", 4, competition.chinese_remainder),
        Generator("lcm_pairs", 4, competition.lcm_pairs),
        Generator("bounded_compositions", 4, competition.bounded_compositions),
        *[g for name, (make, domain, verifier) in OTHER_DOMAINS.items() for g in _levels(name, make, domain, verifier)],
        Generator("selfplay_solver", 1, programs.solver_example, False, "code", "selfplay"),
        Generator("selfplay_solver_eval", 1, programs.solver_example_eval, False, "code", "selfplay"),
        Generator("selfplay_proposer", 1, programs.proposer_example, False, "code", "proposal"),
        Generator("selfplay_proposer_eval", 1, programs.proposer_example_eval, False, "code", "proposal"),
        Generator("selfplay_proposer_bare", 1, programs.proposer_example_bare, False, "code", "proposal"),
        Generator("spice_challenger", 1, grounded.challenger_example, False, "qa", "challenge"),
        Generator("spice_challenger_eval", 1, grounded.challenger_example_eval, False, "qa", "challenge"),
    ]
}

DEFAULT_LEVEL_MIX = {1: 0.20, 2: 0.45, 3: 0.30, 4: 0.05}


def families(selector: str) -> list[Generator]:
    """`level2` → that level's generators; `mix` → all of them; a name → that generator."""
    if selector in GENERATORS:
        return [GENERATORS[selector]]
    if selector in OTHER_DOMAINS:  # every level of a family of another domain
        return [g for g in GENERATORS.values() if g.name.startswith(f"{selector}_level")]
    if selector.startswith("level") and selector[5:].isdigit():
        chosen = [g for g in GENERATORS.values() if g.level == int(selector[5:]) and g.in_mix]
        if chosen:
            return chosen
    if selector == "mix":
        return [g for g in GENERATORS.values() if g.in_mix]
    raise ValueError(f"unknown generator {selector!r}: use mix, level1..level4 or one of {sorted(GENERATORS)}")


def generate(
    selector: str, count: int, seed: int, level_mix: dict[int, float] | None = None
) -> Iterator[tuple[Generator, int, Generated]]:
    """Yield `count` problems as (generator, per-problem seed, problem).

    With several levels (`mix`), the level of problem i is drawn from `level_mix`
    (default 20/45/30/5 %), then a family within the level uniformly, all from problem i's seed.
    """
    chosen = families(selector)
    levels = sorted({g.level for g in chosen})
    mix = level_mix or DEFAULT_LEVEL_MIX
    weights = [mix.get(level, 0.0) for level in levels]
    if len(levels) > 1 and sum(weights) <= 0:
        raise ValueError(f"level mix {mix} gives no weight to levels {levels}")
    by_level = {level: [g for g in chosen if g.level == level] for level in levels}
    for index in range(count):
        problem_seed = derive_seed(seed, selector, index)
        rng = random.Random(problem_seed)
        level = levels[0] if len(levels) == 1 else rng.choices(levels, weights)[0]
        generator = rng.choice(by_level[level])
        yield generator, problem_seed, generator.make(random.Random(derive_seed(problem_seed, generator.name)))


def regenerate(name: str, problem_seed: int) -> Generated:
    """Rebuild one problem from its recorded generator and seed (lineage, tests)."""
    return GENERATORS[name].make(random.Random(derive_seed(problem_seed, name)))
