"""Level 1: two to four arithmetic steps, as bare expressions and as short word problems."""

from __future__ import annotations

import random

from storage.seeds import derive_seed
from tasks.generators.base import Generated, step
from tasks.proposals.judgements import verification_answer, verification_prompt

NAMES = [
    "Ava",
    "Ben",
    "Chloe",
    "Dev",
    "Elif",
    "Farid",
    "Grace",
    "Hiro",
    "Ines",
    "Jonas",
    "Kemi",
    "Luca",
    "Maya",
    "Noor",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sami",
    "Tara",
    "Umar",
    "Vera",
    "Wen",
    "Yara",
    "Zane",
]
ITEMS = ["pencils", "stickers", "apples", "marbles", "cards", "stamps", "beads", "shells", "coins", "books"]


def _two_step_heldout(a: int, b: int, c: int) -> bool:
    """One (a, b, c) in four is reserved for evaluation, so that `two_step` and `two_step_eval` never overlap."""
    return derive_seed("two_step", a, b, c) % 4 == 0


def two_step(rng: random.Random, heldout: bool = False) -> Generated:
    """`a*b+c`: the drill the embedded tiny model learns in the demo (a multiplication fact, then an addition)."""
    while True:
        a, b, c = rng.randint(2, 12), rng.randint(2, 12), rng.randint(1, 99)
        if _two_step_heldout(a, b, c) == heldout:
            break
    product, total = a * b, a * b + c
    steps = [step(f"{a}*{b}", product), step(f"{product}+{c}", total)]
    solution = f"{a}*{b} = {product}\n{product}+{c} = {total}\n#### {total}"
    return Generated(f"What is {a}*{b}+{c}?", str(total), solution, steps, {"a": a, "b": b, "c": c})


# No tool-call syntax in the prompt: a small model would copy its placeholder into the call instead of the sum.
TOOL_HINT = "Python is available."


def two_step_tool(rng: random.Random, heldout: bool = False) -> Generated:
    """`a*b+c` with two-digit factors, beyond the tiny model's recall: the worked solution calls Python for the
    value and answers with its output (the tool-use drill, configs/tool-use.yaml). The output block in the
    solution is what the warm-up shows; at rollout the sandbox's real output takes its place."""
    while True:
        a, b, c = rng.randint(13, 99), rng.randint(13, 99), rng.randint(1, 99)
        if _two_step_heldout(a, b, c) == heldout:
            break
    product, total = a * b, a * b + c
    solution = f"<python>print({a}*{b}+{c})</python>\n<output>\n{total}\n</output>\n#### {total}"
    return Generated(
        f"What is {a}*{b}+{c}? {TOOL_HINT}",
        str(total),
        solution,
        [step(f"{a}*{b}", product), step(f"{product}+{c}", total)],
        {"a": a, "b": b, "c": c},
    )


def two_step_tool_eval(rng: random.Random) -> Generated:
    """The held-out quarter of `two_step_tool`'s problems."""
    return two_step_tool(rng, heldout=True)


def two_step_eval(rng: random.Random) -> Generated:
    """The held-out quarter of `two_step`'s problems."""
    return two_step(rng, heldout=True)


def arith_chain(rng: random.Random) -> Generated:
    """`a op b op c ...` with 2-4 operations; multiplication binds first, then left to right."""
    n_ops = rng.randint(2, 4)
    operators = [rng.choice("+-*") for _ in range(n_ops)]
    operands = [rng.randint(2, 99)]
    for operator in operators:
        operands.append(rng.randint(2, 12) if operator == "*" else rng.randint(2, 99))
    expression = str(operands[0]) + "".join(f" {op} {value}" for op, value in zip(operators, operands[1:]))

    steps: list[str] = []
    terms, signs = [operands[0]], []  # products first: fold each `*` into the running term
    for operator, value in zip(operators, operands[1:]):
        if operator == "*":
            product = terms[-1] * value
            steps.append(step(f"{terms[-1]}*{value}", product))
            terms[-1] = product
        else:
            terms.append(value)
            signs.append(operator)
    total = terms[0]
    for sign, term in zip(signs, terms[1:]):
        new_total = total + term if sign == "+" else total - term
        steps.append(step(f"{total}{sign}{term}", new_total))
        total = new_total
    prompt = rng.choice(["Compute {e}.", "What is {e}?", "Evaluate {e}.", "Calculate the value of {e}."]).format(
        e=expression
    )
    solution = "\n".join(f"{s.split('=')[0]} = {s.split('=')[1]}" for s in steps) + f"\n#### {total}"
    return Generated(prompt, str(total), solution, steps, {"n_ops": n_ops, "expression": expression})


def word_problem(rng: random.Random) -> Generated:
    """A shopping story of two to four steps (buy packs, share, give away)."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    start, packs, per_pack = rng.randint(3, 60), rng.randint(2, 9), rng.randint(3, 15)
    bought = packs * per_pack
    steps = [step(f"{packs}*{per_pack}", bought), step(f"{start}+{bought}", start + bought)]
    have = start + bought
    sentences = [
        f"{name} has {start} {item}.",
        f"{name} buys {packs} packs of {item} with {per_pack} {item} in each pack.",
    ]
    n_steps = rng.randint(2, 4)
    friends = rng.randint(2, 6) if n_steps == 4 else 1
    if n_steps >= 3:
        remaining = friends * rng.randint(1, (have - 1) // friends)  # divisible when shared at step 4
        given = have - remaining
        steps.append(step(f"{have}-{given}", remaining))
        have = remaining
        sentences.append(f"Then {name} gives {given} {item} to a friend.")
    if n_steps == 4:
        steps.append(step(f"{have}/{friends}", have // friends))
        have //= friends
        sentences.append(f"Finally {name} shares the {item} equally among {friends} boxes.")
        question = f"How many {item} are in each box?"
    else:
        question = f"How many {item} does {name} have now?"
    solution = "\n".join(f"<<{s}>>" for s in steps) + f"\n#### {have}"
    return Generated(
        " ".join(sentences + [question]),
        str(have),
        solution,
        steps,
        {"n_steps": len(steps), "name": name, "item": item},
    )


def two_step_verify(rng: random.Random) -> Generated:
    """A worked `a*b+c` solution to judge (RISE's warm-up): right, or wrong at its first or second step;
    the worked solution is the judgement, `correct` or `wrong at step N` (verifier `self_verify`)."""

    problem = two_step(rng)
    a, b, c = problem.params["a"], problem.params["b"], problem.params["c"]
    product, total = a * b, a * b + c
    wrong_step = rng.choice([None, None, 1, 2])
    if wrong_step == 1:
        product += rng.choice([-2, -1, 1, 2])
        total = product + c
    elif wrong_step == 2:
        total += rng.choice([-2, -1, 1, 2])
    solution = f"{a}*{b} = {product}\n{product}+{c} = {total}\n#### {total}"
    judgement = "correct" if wrong_step is None else f"wrong at step {wrong_step}"
    answer = verification_answer(wrong_step is None, solution, problem.steps)
    return Generated(verification_prompt(problem.prompt, solution), answer, judgement, [], problem.params)
