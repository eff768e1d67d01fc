"""reasoning-gym datasets as a problem source: each problem records dataset, parameters, seed and index."""

from __future__ import annotations

from typing import Any

# reasoning-gym groups its generators by package; these are the ones whose answers are numbers or
# expressions. All keep reasoning-gym's own scorer as their verifier.
MATH_CATEGORIES = {"arithmetic", "algebra", "geometry", "probability"}


def check_dataset(dataset: str) -> type:
    """The dataset's class; an unknown name is an error that lists the known ones."""
    from reasoning_gym.factory import DATASETS

    if dataset not in DATASETS:
        raise ValueError(f"unknown reasoning-gym dataset {dataset!r}; known: {', '.join(sorted(DATASETS))}")
    return DATASETS[dataset][0]


def gym_domain(dataset: str) -> str:
    category = check_dataset(dataset).__module__.split(".")[1]
    if category == "code":
        return "code"
    return "math" if category in MATH_CATEGORIES else "logic"


def gym_entries(dataset: str, params: dict[str, Any], count: int, seed: int) -> list[dict[str, Any]]:
    """`count` entries of a reasoning-gym dataset, with what it takes to rebuild each one."""
    import reasoning_gym

    check_dataset(dataset)
    try:
        generated = reasoning_gym.create_dataset(dataset, size=count, seed=seed, **params)
    except (TypeError, ValueError, AssertionError) as error:
        raise ValueError(f"reasoning-gym dataset {dataset!r} rejects parameters {params}: {error}") from None
    return [
        {
            "prompt": entry["question"],
            "answer": None if entry["answer"] is None else str(entry["answer"]),
            "metadata": entry["metadata"],
            "params": {"dataset": dataset, "config": params, "size": count, "index": index},
        }
        for index, entry in enumerate(generated)
    ]
