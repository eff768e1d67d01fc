"""Math verification throughput: our verifier (fast paths + guards + math-verify in 2 worker processes)
against calling math-verify directly (parse + verify in one process), on the same items, in one run.

Two mixes:
- `numeric`: gold answers of MATH-500 and GSM8K test (from ../shared/datasets, else our generators), each
  with realistic responses — a worked-solution tail ending in the gold answer (sometimes in an equivalent
  form: 0.5 for 1/2, 1,000 for 1000, $18 for 18), and a wrong one (an off-by-one or a perturbed
  expression). Mostly the exact-number fast path.
- `symbolic`: MATH-500's non-numeric golds (fractions, radicals, π, polynomials, tuples, intervals,
  vectors, text), each with a group of 16 responses as a policy samples them: 10 in equivalent symbolic
  forms (`\\dfrac`, `a/b`, reordered terms, expanded or factored polynomials, rationalised radicals,
  respaced tuples) and 6 wrong (perturbed values, swapped parts). Where math-verify must run.
Accuracy is agreement with the constructed labels.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from flows.display import console
from tasks.generators import generate
from tasks.verification.engine import VerifierPool
from tasks.verifiers.numbers import parse_number

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = ("bench/verify_throughput.py", "tasks/verifiers/", "tasks/errors.py", "tasks/generators/")

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def gold_answers(limit: int) -> list[str]:
    golds: list[str] = []
    math500, gsm8k = SHARED / "math500" / "test.jsonl", SHARED / "gsm8k" / "test.jsonl"
    if math500.exists():
        golds += [str(json.loads(line)["answer"]) for line in math500.open()]
    if gsm8k.exists():
        golds += [json.loads(line)["answer"].split("####")[1].strip() for line in gsm8k.open()]
    if not golds:
        golds = [p.answer for _, _, p in generate("mix", limit, seed=0)]
    return golds[:limit]


def responses_for(gold: str, rng: random.Random) -> list[tuple[str, bool]]:
    """A correct and a wrong response, each ending in a realistic way."""
    number = parse_number(gold)
    equivalent = gold
    if number is not None and rng.random() < 0.5:
        value = number.value
        if value.denominator == 1 and abs(value) >= 1000:
            equivalent = f"{int(value):,}"
        elif value.denominator in (2, 4, 5, 8, 10):
            equivalent = str(float(value))
        elif value.denominator == 1:
            equivalent = f"{int(value)}.0"
    wrong = str(number.value + 1) if number is not None and number.value.denominator == 1 else f"{gold}+1"
    ending = rng.choice(["Therefore the answer is \\boxed{%s}.", "So we get $\\boxed{%s}$.", "#### %s"])
    reasoning = "Let us compute step by step. First 3 * 4 = 12, then 12 + 5 = 17.\n"
    return [(reasoning + ending % equivalent, True), (reasoning + ending % wrong, False)]


def build_items(limit: int, seed: int = 0) -> list[tuple[str, str, bool]]:
    rng = random.Random(seed)
    return [(gold, response, label) for gold in gold_answers(limit) for response, label in responses_for(gold, rng)]


ENDINGS = [
    "Therefore the answer is $\\boxed{%s}$.",
    "So we get \\boxed{%s}.",
    "The final answer is $%s$.",
    "Putting it together: $\\boxed{%s}$",
]


def symbolic_golds(limit: int) -> list[str]:
    """MATH-500's golds that are not plain numbers."""
    path = SHARED / "math500" / "test.jsonl"
    if not path.exists():
        return [
            r"\frac{\sqrt{2}}{2}",
            r"3\sqrt{13}",
            r"x^2+2x+1",
            r"\left( 3, \frac{\pi}{2} \right)",
            r"[0, 1)",
            r"\frac{x+2}{7}",
            r"2\pi",
            r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}",
            r"\text{(B)}",
        ][:limit]
    golds = [str(json.loads(line)["answer"]) for line in path.open()]
    return [gold for gold in golds if parse_number(gold) is None][:limit]


def equivalent_forms(gold: str, rng: random.Random) -> list[str]:
    """Forms a policy writes for the same answer: sympy's own LaTeX (reordered, expanded, factored,
    rationalised), `\\dfrac` for `\\frac`, `a/b`, other spacing, each part of a tuple rewritten."""
    import sympy

    from tasks.verifiers.forms import structure
    from tasks.verifiers.symbolic import parse

    shape = structure(gold)
    if shape is not None and shape.kind in ("tuple", "interval", "set", "list") and len(shape.parts) <= 6:
        rewritten = [equivalent_forms(part, rng) or [part] for part in shape.parts]
        forms = []
        for _ in range(6):
            parts = [rng.choice(options) for options in rewritten]
            joined = ", ".join(parts) if rng.random() < 0.5 else ",".join(parts)
            forms.append(f"{shape.opening}{joined}{shape.closing}" if shape.kind != "set" else f"\\{{{joined}\\}}")
        return forms
    forms = {
        gold.replace("\\frac", "\\dfrac"),
        gold.replace(" ", ""),
        gold.replace("\\left", "").replace("\\right", ""),
    }
    parsed = parse(gold)
    if parsed is not None and not parsed[1]:
        expression = parsed[0]
        for variant in (
            expression,
            sympy.expand(expression),
            sympy.factor(expression),
            sympy.radsimp(expression),
            sympy.nsimplify(expression),
        ):
            try:
                forms.add(sympy.latex(variant))
                forms.add(sympy.latex(variant, fold_short_frac=True))
            except Exception:  # noqa: BLE001 - a variant sympy cannot print is simply not offered
                continue
    return sorted(forms)


def wrong_forms(gold: str, rng: random.Random) -> list[str]:
    """Near misses: the value perturbed, a part changed or parts swapped."""
    import sympy

    from tasks.verifiers.forms import structure
    from tasks.verifiers.symbolic import parse

    shape = structure(gold)
    if shape is not None and shape.kind in ("tuple", "interval") and len(shape.parts) >= 2:
        parts = list(shape.parts)
        changed = list(parts)
        finite = (
            max(i for i, part in enumerate(parts) if "infty" not in part)
            if any("infty" not in part for part in parts)
            else len(parts) - 1
        )
        changed[finite] = f"{changed[finite]}+1"  # ∞ + 1 is still ∞
        swapped = parts[::-1] if parts[::-1] != parts else changed
        return [f"{shape.opening}{', '.join(p)}{shape.closing}" for p in (changed, swapped)]
    parsed = parse(gold)
    if parsed is not None:
        expression = parsed[0]
        return [
            sympy.latex(expression + 1),
            sympy.latex(2 * expression),
            sympy.latex(expression - sympy.Rational(1, 2)),
        ]
    return [f"{gold} + 1", f"2({gold})"]


def symbolic_items(limit: int, group_size: int = 16, seed: int = 0) -> list[tuple[str, str, bool]]:
    rng = random.Random(seed)
    items = []
    for gold in symbolic_golds(limit):
        right, wrong = equivalent_forms(gold, rng) or [gold], wrong_forms(gold, rng)
        group = [(rng.choice(right), True) for _ in range(group_size * 5 // 8)]
        group += [(rng.choice(wrong), False) for _ in range(group_size - len(group))]
        reasoning = "Let us work it out. We simplify the expression step by step and check the conditions.\n"
        items += [(gold, reasoning + rng.choice(ENDINGS) % form, label) for form, label in group]
    return items


def math_verify_direct(items: list[tuple[str, str, bool]]) -> tuple[float, float]:
    import math_verify.parser
    from math_verify import parse, verify

    # Cold caches, as in our freshly started workers: math-verify memoises parses per process, and
    # repeated runs in this process would otherwise measure lookups.
    for cached in ("parse_latex_cached", "parse_expr_cached", "extract_latex"):
        getattr(math_verify.parser, cached).cache_clear()
    verify(parse("$x^2$"), parse(r"\boxed{x^2}"))  # warm imports, like the pool's workers
    start = time.perf_counter()
    right = 0
    for gold, response, label in items:
        try:
            verdict = bool(verify(parse(f"${gold}$"), parse(response)))
        except Exception:  # noqa: BLE001
            verdict = False
        right += verdict == label
    return len(items) / (time.perf_counter() - start), right / len(items)


def ours(items: list[tuple[str, str, bool]], workers: int) -> tuple[float, float]:
    problems = [({"domain": "math", "answer": gold}, response, "math") for gold, response, _ in items]
    with VerifierPool(workers=workers, item_timeout=30) as pool:  # pre-started, warm workers
        list(pool.score(problems[:2]))
        start = time.perf_counter()
        results = {r.index: r for r in pool.score(problems)}
        seconds = time.perf_counter() - start
    right = sum(bool(results[i].correct) == label for i, (_, _, label) in enumerate(items))
    return len(items) / seconds, right / len(items)


def run_benchmark(
    limit: int = 1000, workers: int = 2, repeats: int = 3, mixes: tuple[str, ...] = ("numeric", "symbolic")
) -> dict:
    """Both sides back to back on each mix, `repeats` times; the median ratio is the figure (this machine is shared)."""
    summary = {}
    for mix in mixes:
        items = build_items(limit) if mix == "numeric" else symbolic_items(limit)
        console.print(
            f"[bold]{mix} mix[/bold]: {len(items):,} responses to {len({g for g, _, _ in items}):,} gold answers"
        )
        summary[mix] = _measure(items, workers, repeats)
    return summary


def _measure(items: list[tuple[str, str, bool]], workers: int, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        baseline_rate, baseline_accuracy = math_verify_direct(items)
        rate, accuracy = ours(items, workers)
        runs.append(
            {
                "baseline_rate": baseline_rate,
                "baseline_accuracy": baseline_accuracy,
                "rate": rate,
                "accuracy": accuracy,
                "ratio": rate / baseline_rate,
            }
        )
        console.print(
            f"math-verify directly (1 process) {baseline_rate:7.1f} items/s, accuracy {baseline_accuracy:.3f} | "
            f"ours ({workers} workers) {rate:7.1f} items/s, accuracy {accuracy:.3f} | ×{rate / baseline_rate:.2f}"
        )
    median = sorted(runs, key=lambda run: run["ratio"])[len(runs) // 2]
    console.print(
        f"median throughput ×{median['ratio']:.2f} (target ≥ 3), accuracy "
        f"{median['accuracy'] - median['baseline_accuracy']:+.3f}"
    )
    return {"items": len(items), **median}
