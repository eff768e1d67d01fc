"""A seeded family of file-level problems: bounded buffers (`generator: bounded_buffer` on a workspaces
source). Each seed draws an order (stack or queue), a capacity, an overflow policy and a class name;
the tests are random operation sequences whose expected results come from `simulate` (the spec as
plain Python), the reference solution is the spec written as a class, and the wrong solutions are
the mistakes a model makes with it (capacity off by one, the other order, the policy ignored).
Pure: nothing here runs candidate code.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from storage.seeds import derive_seed
from tasks.workspaces.problem import WorkspaceProblem, Wrong

ORDERS = {"stack": "last in, first out", "queue": "first in, first out"}
POLICIES = {
    "raise": "`push` raises `OverflowError` and stores nothing",
    "reject": "`push` returns `False` and stores nothing",
    "drop_oldest": "the oldest stored item is discarded to make room, and `push` returns `True`",
}
NAMES = ("BoundedBuffer", "Tray", "Holder", "Spool", "Bin", "Rack")


def simulate(order: str, capacity: int, policy: str, operations: list[tuple]) -> list:
    """The result of each operation under the spec: a value, or the name of the exception it raises."""
    items: list = []  # oldest first
    results = []
    for name, *argument in operations:
        if name == "push":
            if len(items) < capacity:
                items.append(argument[0])
                results.append(True)
            elif policy == "raise":
                results.append("OverflowError")
            elif policy == "reject":
                results.append(False)
            else:
                items.pop(0)
                items.append(argument[0])
                results.append(True)
        elif name in ("pop", "peek"):
            if not items:
                results.append("IndexError")
            else:
                index = -1 if order == "stack" else 0
                results.append(items.pop(index) if name == "pop" else items[index])
        elif name == "len":
            results.append(len(items))
        else:  # items, in the order pop returns them
            results.append(list(reversed(items)) if order == "stack" else list(items))
    return results


def reference_code(
    name: str, order: str, capacity_check: str = ">=", policy: str = "raise", pop_index: int | None = None
) -> str:
    index = (-1 if order == "stack" else 0) if pop_index is None else pop_index
    full = {
        "raise": "            raise OverflowError('full')",
        "reject": "            return False",
        "drop_oldest": "            self._items.pop(0)",
    }[policy]
    listing = "list(reversed(self._items))" if index == -1 else "list(self._items)"
    return f"""class {name}:
    def __init__(self, capacity):
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError("capacity must be a positive int")
        self._capacity = capacity
        self._items = []

    def push(self, item):
        if len(self._items) {capacity_check} self._capacity:
{full}
        self._items.append(item)
        return True

    def pop(self):
        if not self._items:
            raise IndexError("empty")
        return self._items.pop({index})

    def peek(self):
        if not self._items:
            raise IndexError("empty")
        return self._items[{index}]

    def __len__(self):
        return len(self._items)

    def items(self):
        return {listing}
"""


def _operations(rng: random.Random, length: int) -> list[tuple]:
    operations = []
    for _ in range(length):
        pick = rng.random()
        if pick < 0.5:
            operations.append(("push", rng.randint(0, 99)))
        elif pick < 0.7:
            operations.append(("pop",))
        elif pick < 0.8:
            operations.append(("peek",))
        elif pick < 0.9:
            operations.append(("len",))
        else:
            operations.append(("items",))
    return operations


def _test_method(index: int, module: str, name: str, capacity: int, operations: list[tuple], results: list) -> str:
    lines = [f"    def test_sequence_{index}(self):", f"        buffer = {module}.{name}({capacity})"]
    for (operation, *argument), result in zip(operations, results):
        call = "len(buffer)" if operation == "len" else f"buffer.{operation}({', '.join(map(repr, argument))})"
        if result in ("OverflowError", "IndexError"):
            lines.append(f"        with self.assertRaises({result}):\n            {call}")
        else:
            lines.append(f"        self.assertEqual({call}, {result!r})")
    return "\n".join(lines)


def bounded_buffer(rng: random.Random) -> WorkspaceProblem:
    order, policy = rng.choice(sorted(ORDERS)), rng.choice(sorted(POLICIES))
    capacity, name = rng.randint(2, 5), rng.choice(NAMES)
    module = name.lower()
    sequences = [_operations(rng, rng.randint(8, 16)) for _ in range(8)]
    # the policy and the order must show: fill to the brim, then one more, then drain
    sequences.append([("push", v) for v in range(capacity + 1)] + [("items",)] + [("pop",)] * (capacity + 1))
    methods = [
        _test_method(i, module, name, capacity, ops, simulate(order, capacity, policy, ops))
        for i, ops in enumerate(sequences)
    ]
    tests = (
        f"import unittest\n\nimport {module}\n\n\nclass Test{name}(unittest.TestCase):\n"
        f"    def test_rejects_bad_capacity(self):\n        with self.assertRaises(ValueError):\n"
        f"            {module}.{name}(0)\n\n" + "\n\n".join(methods) + "\n"
    )
    statement = (
        f"Write `{module}.py` defining a class `{name}`: a buffer of at most `capacity` items, served "
        f"{ORDERS[order]} ({order} order).\n\n"
        f"- `{name}(capacity)`: `capacity` is an int >= 1, otherwise raise `ValueError`.\n"
        f"- `push(item)`: store `item` and return `True`. When the buffer is full, {POLICIES[policy]}.\n"
        f"- `pop()`: remove and return the next item in {order} order; raise `IndexError` when empty.\n"
        f"- `peek()`: return the next item without removing it; raise `IndexError` when empty.\n"
        f"- `len(buffer)`: the number of stored items.\n"
        f"- `items()`: a list of the stored items in the order `pop` would return them.\n"
    )
    other = "queue" if order == "stack" else "stack"
    wrong = [
        Wrong("capacity off by one", {f"{module}.py": reference_code(name, order, ">", policy)}),
        Wrong(f"{other} order instead of {order}", {f"{module}.py": reference_code(name, other, ">=", policy)}),
        Wrong(
            "the overflow policy ignored (grows past capacity)",
            {
                f"{module}.py": reference_code(name, order, ">=", policy).replace(
                    "if len(self._items) >= self._capacity:", "if False:"
                )
            },
        ),
    ]
    return WorkspaceProblem(
        id=f"gen-bounded-buffer-{order}-{policy.replace('_', '-')}-{capacity}-{module}",
        level="file",
        difficulty=1 if policy == "raise" else 2,
        topic="data-structures",
        statement=statement,
        files=[f"{module}.py"],
        reference={f"{module}.py": reference_code(name, order, ">=", policy)},
        tests={f"test_{module}.py": tests},
        wrong=wrong,
        path="generator:bounded_buffer",
    )


WORKSPACE_GENERATORS: dict[str, Callable[[random.Random], WorkspaceProblem]] = {"bounded_buffer": bounded_buffer}


def generate_problems(generator: str, count: int, seed: int) -> list[tuple[int, WorkspaceProblem]]:
    """(problem seed, problem) for `count` problems of a family; the same seed gives the same problems."""
    if generator not in WORKSPACE_GENERATORS:
        raise ValueError(f"unknown workspace generator {generator!r}; known: {', '.join(sorted(WORKSPACE_GENERATORS))}")
    made = []
    for index in range(count):
        problem_seed = derive_seed(seed, generator, index)
        made.append((problem_seed, WORKSPACE_GENERATORS[generator](random.Random(problem_seed))))
    return made
