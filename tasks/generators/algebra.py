"""Level 2: four to eight steps with algebra (linear equations and systems, fractions, polynomials)."""

from __future__ import annotations

import random
from fractions import Fraction

from tasks.generators.base import Generated, format_number, step


def _nonzero(rng: random.Random, low: int, high: int) -> int:
    return rng.choice([v for v in range(low, high + 1) if v != 0])


def _linear(a: int, b: int, variable: str = "x") -> str:
    """`3x - 5`, `-x + 2`, `4x` written as a person would."""
    head = {1: variable, -1: f"-{variable}"}.get(a, f"{a}{variable}")
    return head if b == 0 else f"{head} {'+' if b > 0 else '-'} {abs(b)}"


def linear_equation(rng: random.Random) -> Generated:
    """`a x + b = c x + d` with an integer root."""
    x = rng.randint(-20, 20)
    a, c = _nonzero(rng, -9, 9), _nonzero(rng, -9, 9)
    while c == a:
        c = _nonzero(rng, -9, 9)
    b = rng.randint(-50, 50)
    d = (a - c) * x + b
    steps = [step(f"{a}-{c}", a - c), step(f"{d}-{b}", d - b), step(f"{d - b}/{a - c}", x)]
    check = a * x + b
    steps.append(step(f"{a}*{x}+{b}", check))
    solution = (
        f"Move the x terms left and the constants right: ({a} - {c})x = {d} - {b}, so {a - c}x = {d - b}.\n"
        f"Divide: x = {d - b}/{a - c} = {x}.\nCheck: {a}*{x} + {b} = {check} = {c}*{x} + {d}.\n#### {x}"
    )
    return Generated(
        f"Solve for x: {_linear(a, b)} = {_linear(c, d)}.", str(x), solution, steps, {"a": a, "b": b, "c": c, "d": d}
    )


def linear_system(rng: random.Random) -> Generated:
    """Two linear equations in x and y; asks for a combination of the solution."""
    x, y = rng.randint(-10, 10), rng.randint(-10, 10)
    while True:
        a, b, c, d = (_nonzero(rng, -6, 6) for _ in range(4))
        if a * d - b * c != 0:
            break
    e, f = a * x + b * y, c * x + d * y
    asked, substituted, value = rng.choice(
        [
            ("x + y", "{x}+{y}", x + y),
            ("x - y", "{x}-{y}", x - y),
            ("xy", "{x}*{y}", x * y),
            ("2x + 3y", "2*{x}+3*{y}", 2 * x + 3 * y),
        ]
    )
    det = a * d - b * c
    steps = [
        step(f"{a}*{d}-{b}*{c}", det),
        step(f"{e}*{d}-{b}*{f}", e * d - b * f),
        step(f"{e * d - b * f}/{det}", x),
        step(f"{a}*{f}-{e}*{c}", a * f - e * c),
        step(f"{a * f - e * c}/{det}", y),
    ]
    steps.append(step(substituted.format(x=x, y=y), value))
    first = f"{a}x {'+' if b > 0 else '-'} {abs(b)}y = {e}"
    second = f"{c}x {'+' if d > 0 else '-'} {abs(d)}y = {f}"
    solution = (
        f"Eliminate: the determinant is {det}; x = ({e}*{d} - {b}*{f})/{det} = {x} and "
        f"y = ({a}*{f} - {e}*{c})/{det} = {y}.\nSo {asked} = {value}.\n#### {value}"
    )
    return Generated(
        f"If {first} and {second}, what is {asked}?",
        str(value),
        solution,
        steps,
        {"coefficients": [a, b, c, d], "constants": [e, f], "asked": asked},
    )


def fraction_arithmetic(rng: random.Random) -> Generated:
    """`(a/b ± c/d) × e/f`, answered in lowest terms."""
    a, c, e = rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 9)
    b, d, f = rng.randint(2, 12), rng.randint(2, 12), rng.randint(2, 12)
    sign = rng.choice("+-")
    left, right, factor = Fraction(a, b), Fraction(c, d), Fraction(e, f)
    inner = left + right if sign == "+" else left - right
    result = inner * factor
    common = b * d
    steps = [
        step(f"{b}*{d}", common),
        step(f"{a}*{d}", a * d),
        step(f"{c}*{b}", c * b),
        step(f"{a * d}{sign}{c * b}", a * d + (c * b if sign == "+" else -c * b)),
        step(f"{format_number(inner)}*{e}/{f}", result),
    ]
    solution = (
        f"Common denominator {common}: {a}/{b} {sign} {c}/{d} = {format_number(inner)}.\n"
        f"Multiply by {e}/{f}: {format_number(result)}.\n#### {format_number(result)}"
    )
    prompt = f"Compute ({a}/{b} {sign} {c}/{d}) * {e}/{f}. Give the answer as a fraction in lowest terms."
    return Generated(
        prompt, format_number(result), solution, steps, {"fractions": [[a, b], [c, d], [e, f]], "sign": sign}
    )


def polynomial_value(rng: random.Random) -> Generated:
    """Value of a cubic at an integer point, term by term."""
    coefficients = [rng.randint(-9, 9) for _ in range(3)] + [rng.randint(-20, 20)]
    coefficients[0] = _nonzero(rng, -9, 9)
    x = rng.randint(-5, 5)
    terms = [coefficients[0] * x**3, coefficients[1] * x**2, coefficients[2] * x, coefficients[3]]
    steps = [
        step(f"{x}^3", x**3),
        step(f"{coefficients[0]}*{x**3}", terms[0]),
        step(f"{x}^2", x**2),
        step(f"{coefficients[1]}*{x**2}", terms[1]),
        step(f"{coefficients[2]}*{x}", terms[2]),
    ]
    running = terms[0]
    for term in terms[1:]:
        steps.append(step(f"{running}+{term}", running + term))
        running += term
    polynomial = " + ".join(
        f"{c}x^{p}" if p > 1 else (f"{c}x" if p == 1 else str(c)) for c, p in zip(coefficients, (3, 2, 1, 0))
    ).replace("+ -", "- ")
    solution = f"The terms are {', '.join(map(str, terms))}; their sum is {running}.\n#### {running}"
    return Generated(
        f"Let p(x) = {polynomial}. Find p({x}).", str(running), solution, steps, {"coefficients": coefficients, "x": x}
    )
