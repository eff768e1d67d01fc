"""Math verification throughput: our verifier (fast path + guards + math-verify in 2 worker processes)
against calling math-verify directly (parse + verify in one process), on the same items, in one run.

Items: gold answers of MATH-500 and GSM8K test (from ../shared/datasets, else our generators), each with
realistic responses — a worked-solution tail ending in the gold answer (sometimes in an equivalent
form: 0.5 for 1/2, 1,000 for 1000, $18 for 18), and wrong ones (an off-by-one or a perturbed expression).
Accuracy is agreement with those constructed labels.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from flows.display import console
from tasks.generators import generate
from tasks.verifiers.engine import VerifierPool
from tasks.verifiers.numbers import parse_number

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


def math_verify_direct(items: list[tuple[str, str, bool]]) -> tuple[float, float]:
    import math_verify.parser
    from math_verify import parse, verify

    # Cold caches, as in our freshly started workers: math-verify memoises parses per process, and
    # repeated runs in this process would otherwise measure lookups.
    for cached in ("parse_latex_cached", "parse_expr_cached", "extract_latex"):
        getattr(math_verify.parser, cached).cache_clear()
    verify(parse("$x^2$"), parse(r"\boxed{x^2}"))          # warm imports, like the pool's workers
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
    with VerifierPool(workers=workers, item_timeout=30) as pool:     # pre-started, warm workers
        list(pool.score(problems[:2]))
        start = time.perf_counter()
        results = {r.index: r for r in pool.score(problems)}
        seconds = time.perf_counter() - start
    right = sum(bool(results[i].correct) == label for i, (_, _, label) in enumerate(items))
    return len(items) / seconds, right / len(items)


def run_benchmark(limit: int = 1000, workers: int = 2, repeats: int = 3) -> dict:
    """Both sides back to back, `repeats` times; the median ratio is the figure (this machine is shared)."""
    items = build_items(limit)
    console.print(f"{len(items):,} responses to {len(items) // 2:,} gold answers")
    runs = []
    for _ in range(repeats):
        baseline_rate, baseline_accuracy = math_verify_direct(items)
        rate, accuracy = ours(items, workers)
        runs.append({"baseline_rate": baseline_rate, "baseline_accuracy": baseline_accuracy, "rate": rate,
                     "accuracy": accuracy, "ratio": rate / baseline_rate})
        console.print(f"math-verify directly (1 process) {baseline_rate:7.1f} items/s, accuracy {baseline_accuracy:.3f} | "
                      f"ours ({workers} workers) {rate:7.1f} items/s, accuracy {accuracy:.3f} | ×{rate / baseline_rate:.2f}")
    median = sorted(runs, key=lambda run: run["ratio"])[len(runs) // 2]
    console.print(f"median throughput ×{median['ratio']:.2f} (target ≥ 3), accuracy "
                  f"{median['accuracy'] - median['baseline_accuracy']:+.3f}")
    return {"items": len(items), **median}
