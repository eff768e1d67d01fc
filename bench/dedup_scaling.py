"""How near-duplicate detection scales with the bank: time at N and 2N problems, as a ratio.

The texts are our procedural problems (levels 1-4 by the default mix) plus, when
`../shared/datasets` is present, the real GSM8K and MATH-500 prompts, so the buckets hold both
templated and natural-language problems. Linear scaling doubles the time when the bank doubles;
the target is a ratio of at most 2.5.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from flows.display import console
from tasks.curation.dedup import forget_signatures, near_duplicates
from tasks.generators import generate

# The files its figures measure: a change to one makes a saved result stale (bench/results.py).
DEPENDS_ON = ("bench/dedup_scaling.py", "tasks/curation/dedup.py", "tasks/curation/records.py", "tasks/generators/")

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def bank_texts(size: int, seed: int = 0) -> list[str]:
    real: list[str] = []
    for path in (SHARED / "gsm8k" / "train.jsonl", SHARED / "math500" / "test.jsonl"):
        if path.exists():
            import json

            real += [json.loads(line).get("question") or json.loads(line)["prompt"] for line in path.open()]
    generated = [p.prompt for _, _, p in generate("mix", max(0, size - len(real)), seed)]
    return (real + generated)[:size]


def time_near_duplicates(texts: list[str], repeats: int) -> tuple[float, int, float]:
    """Best of `repeats` cold screens (the signature cache emptied first, as in a fresh process), the
    near-duplicates found, and one warm screen after them (every signature known: a bank screened again)."""
    best, found = float("inf"), 0
    for _ in range(repeats):
        forget_signatures()
        start = time.perf_counter()
        result = near_duplicates(texts, np.zeros(len(texts), dtype=np.int64), threshold=0.8)
        best = min(best, time.perf_counter() - start)
        found = int((result.duplicate_of >= 0).sum())
    start = time.perf_counter()
    near_duplicates(texts, np.zeros(len(texts), dtype=np.int64), threshold=0.8)
    warm = time.perf_counter() - start
    forget_signatures()
    return best, found, warm


def run_benchmark(sizes: list[int], repeats: int = 2) -> list[dict]:
    results = []
    for size in sizes:
        texts = bank_texts(size)
        seconds, found, warm = time_near_duplicates(texts, repeats)
        results.append({"size": size, "seconds": seconds, "near_duplicates": found, "warm_seconds": warm})
        console.print(
            f"{size:>9,} problems: {seconds:6.2f} s  ({found:,} near-duplicates; screened again with "
            f"every signature known {warm:.2f} s)"
        )
    for smaller, larger in zip(results, results[1:]):
        ratio = larger["seconds"] / smaller["seconds"]
        size_ratio = larger["size"] / smaller["size"]
        console.print(f"{smaller['size']:,} → {larger['size']:,} problems (×{size_ratio:g}): time ×{ratio:.2f}")
        larger["time_ratio_to_previous"] = ratio
    return results
