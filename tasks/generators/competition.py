"""Levels 3 and 4: competition-style problems that need several tools (number theory, counting, Vieta)."""

from __future__ import annotations

import math
import random
from fractions import Fraction

from tasks.generators.base import Generated, format_number, step

PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23]


# ---- level 3 ------------------------------------------------------------------------------
def modular_powers(rng: random.Random) -> Generated:
    """`(a^n + b^m) mod k` by modular exponentiation."""
    a, b = rng.randint(2, 30), rng.randint(2, 30)
    n, m, k = rng.randint(10, 200), rng.randint(10, 200), rng.randint(7, 99)
    first, second = pow(a, n, k), pow(b, m, k)
    answer = (first + second) % k
    steps = [
        step(f"{a}^{n} mod {k}", first),
        step(f"{b}^{m} mod {k}", second),
        step(f"({first}+{second}) mod {k}", answer),
    ]
    solution = f"By repeated squaring, {a}^{n} ≡ {first} and {b}^{m} ≡ {second} (mod {k}); the sum is {answer} (mod {k}).\n#### {answer}"
    return Generated(
        f"Find the remainder when {a}^{{{n}}} + {b}^{{{m}}} is divided by {k}.",
        str(answer),
        solution,
        steps,
        {"a": a, "n": n, "b": b, "m": m, "k": k},
    )


def divisor_function(rng: random.Random) -> Generated:
    """Number or sum of the positive divisors of N, given as an integer."""
    primes = sorted(rng.sample(PRIMES[:8], rng.randint(2, 3)))
    exponents = [rng.randint(1, 5) for _ in primes]
    number = math.prod(p**e for p, e in zip(primes, exponents))
    factorisation = " * ".join(f"{p}^{e}" for p, e in zip(primes, exponents))
    if rng.random() < 0.5:
        answer = math.prod(e + 1 for e in exponents)
        what, rule = "How many positive divisors does", f"multiply (e+1) over the exponents: {answer}"
    else:
        answer = math.prod((p ** (e + 1) - 1) // (p - 1) for p, e in zip(primes, exponents))
        what, rule = (
            "What is the sum of the positive divisors of",
            f"multiply (p^(e+1)-1)/(p-1) over the primes: {answer}",
        )
    steps = [
        step(factorisation.replace(" ", ""), number),
        step(f"sigma({number})" if "sum" in what else f"d({number})", answer),
    ]
    solution = f"{number} = {factorisation}; {rule}.\n#### {answer}"
    return Generated(
        f"{what} {number} have?" if what.startswith("How") else f"{what} {number}?",
        str(answer),
        solution,
        steps,
        {"primes": primes, "exponents": exponents},
    )


def vieta(rng: random.Random) -> Generated:
    """Symmetric functions of the roots of a quadratic with integer roots, without solving it."""
    r, s = _nonzero_pair(rng)
    total, product = r + s, r * s
    asked = rng.choice(["r^2 + s^2", "1/r + 1/s", "r^3 + s^3"])
    if asked == "r^2 + s^2":
        value = Fraction(total**2 - 2 * product)
    elif asked == "1/r + 1/s":
        value = Fraction(total, product)
    else:
        value = Fraction(total**3 - 3 * product * total)
    lead = rng.randint(1, 6)
    b, c = -total * lead, product * lead
    quadratic = (
        ("x^2" if lead == 1 else f"{lead}x^2")
        + (f" {'+' if b > 0 else '-'} {abs(b)}x" if b else "")
        + (f" {'+' if c > 0 else '-'} {abs(c)}" if c else "")
    )
    steps = [step(f"{-b}/{lead}", total), step(f"{c}/{lead}", product), step(asked.replace(" ", ""), value)]
    solution = f"By Vieta, r + s = {total} and rs = {product}, so {asked} = {format_number(value)}.\n#### {format_number(value)}"
    return Generated(
        f"Let r and s be the roots of {quadratic} = 0. Compute {asked}.",
        format_number(value),
        solution,
        steps,
        {"roots": sorted([r, s]), "leading_coefficient": lead, "asked": asked},
    )


def _nonzero_pair(rng: random.Random) -> tuple[int, int]:
    values = [v for v in range(-30, 31) if v != 0]
    return rng.choice(values), rng.choice(values)


def lattice_paths(rng: random.Random) -> Generated:
    """Monotone lattice paths through a required point: a product of two binomials."""
    width, height = rng.randint(3, 14), rng.randint(3, 14)
    via_x, via_y = rng.randint(1, width - 1), rng.randint(1, height - 1)
    first = math.comb(via_x + via_y, via_x)
    second = math.comb(width - via_x + height - via_y, width - via_x)
    answer = first * second
    steps = [
        step(f"C({via_x + via_y},{via_x})", first),
        step(f"C({width - via_x + height - via_y},{width - via_x})", second),
        step(f"{first}*{second}", answer),
    ]
    solution = (
        f"Paths to ({via_x},{via_y}): C({via_x + via_y},{via_x}) = {first}; from there to ({width},{height}): "
        f"{second}. Total {answer}.\n#### {answer}"
    )
    prompt = (
        f"How many paths from (0,0) to ({width},{height}) that use only unit steps right or up pass through "
        f"the point ({via_x},{via_y})?"
    )
    return Generated(prompt, str(answer), solution, steps, {"target": [width, height], "via": [via_x, via_y]})


# ---- level 4 ------------------------------------------------------------------------------
def chinese_remainder(rng: random.Random) -> Generated:
    """Smallest positive integer with three prescribed remainders (coprime moduli)."""
    moduli = sorted(rng.sample([3, 4, 5, 7, 9, 11, 13, 16, 17, 19, 23, 25, 27, 29], 3))
    while math.gcd(*moduli[:2]) != 1 or math.gcd(moduli[0], moduli[2]) != 1 or math.gcd(moduli[1], moduli[2]) != 1:
        moduli = sorted(rng.sample([3, 4, 5, 7, 9, 11, 13, 16, 17, 19, 23, 25, 27, 29], 3))
    modulus = math.prod(moduli)
    answer = rng.randint(1, modulus)
    remainders = [answer % m for m in moduli]
    steps = [step("*".join(map(str, moduli)), modulus)] + [
        step(f"{answer} mod {m}", r) for m, r in zip(moduli, remainders)
    ]
    conditions = ", ".join(f"leaves remainder {r} when divided by {m}" for m, r in zip(moduli, remainders))
    solution = (
        f"The moduli are coprime, so there is one solution modulo {modulus}; sieving gives {answer}.\n#### {answer}"
    )
    return Generated(
        f"Find the smallest positive integer that {conditions}.",
        str(answer),
        solution,
        steps,
        {"moduli": moduli, "remainders": remainders},
    )


def lcm_pairs(rng: random.Random) -> Generated:
    """Ordered pairs (a, b) with lcm(a, b) = N: the product of (2e + 1) over N's prime powers."""
    primes = sorted(rng.sample(PRIMES[:7], rng.randint(2, 4)))
    exponents = [rng.randint(1, 5) for _ in primes]
    number = math.prod(p**e for p, e in zip(primes, exponents))
    answer = math.prod(2 * e + 1 for e in exponents)
    steps = [step(f"2*{e}+1", 2 * e + 1) for e in exponents] + [
        step("*".join(str(2 * e + 1) for e in exponents), answer)
    ]
    solution = (
        f"{number} = "
        + " * ".join(f"{p}^{e}" for p, e in zip(primes, exponents))
        + f". For each prime one of a, b carries the full exponent: 2e+1 choices. Product {answer}.\n#### {answer}"
    )
    return Generated(
        f"How many ordered pairs of positive integers (a, b) satisfy lcm(a, b) = {number}?",
        str(answer),
        solution,
        steps,
        {"primes": primes, "exponents": exponents},
    )


def bounded_compositions(rng: random.Random) -> Generated:
    """Solutions of x1 + ... + xk = n with 0 <= xi <= u, by inclusion-exclusion."""
    parts, cap = rng.randint(3, 5), rng.randint(3, 9)
    total = rng.randint(cap, parts * cap - 1)
    terms = [
        (-1) ** j * math.comb(parts, j) * math.comb(total - j * (cap + 1) + parts - 1, parts - 1)
        for j in range(parts + 1)
        if total - j * (cap + 1) >= 0
    ]
    answer = sum(terms)
    steps = [step(f"term{j}", t) for j, t in enumerate(terms)] + [
        step("+".join(map(str, terms)).replace("+-", "-"), answer)
    ]
    variables = " + ".join(f"x_{i}" for i in range(1, parts + 1))
    solution = (
        f"Inclusion-exclusion over the variables exceeding {cap}: "
        + " + ".join(map(str, terms))
        + f" = {answer}.\n#### {answer}"
    )
    prompt = f"How many solutions in integers does {variables} = {total} have with 0 <= x_i <= {cap} for every i?"
    return Generated(prompt, str(answer), solution, steps, {"parts": parts, "cap": cap, "total": total})
