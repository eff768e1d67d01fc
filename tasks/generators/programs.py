"""Small Python programs for self-play's warm-up (`tasks/selfplay`): worked proposer and solver examples,
so the tiny model's first proposals parse and its first answers have the right form.

Each template is a program's text and the same function in Python: outputs come from the latter, so
nothing is executed from text here (`tests/tasks/proposals/test_selfplay.py` checks that the sandbox, running the text,
agrees). Three families, one problem per (template, arguments, task type) draw:

- `selfplay_solver` / `selfplay_solver_eval`: a solver's task (verifier `selfplay`), the answer block as
  its worked solution; the eval family draws other arguments (one draw in four is held out);
- `selfplay_proposer` / `selfplay_proposer_eval`: a proposer's prompt (verifier `proposal`: valid or
  not), a proposal of that task type as its worked solution; `selfplay_proposer_bare` the same without
  references (the prompts of `selfplay.references: 0`, one per task type).
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass

from storage.seeds import derive_seed
from tasks.generators.base import Generated
from tasks.proposals.code_tasks import CodeTask, proposal_text, proposer_prompt, solver_prompt


@dataclass(frozen=True)
class Template:
    text: str  # the program, with {c} (a constant) where it has one
    function: Callable[..., Callable]  # c -> the same function
    arguments: Callable[[random.Random], tuple]  # one call's arguments


def _ints(low: int, high: int, count: int = 2) -> Callable[[random.Random], tuple]:
    return lambda rng: tuple(rng.randint(low, high) for _ in range(count))


def _int_list(rng: random.Random) -> tuple:
    return ([rng.randint(0, 9) for _ in range(rng.randint(2, 4))],)


def _word(rng: random.Random) -> tuple:
    return ("".join(rng.choice(string.ascii_lowercase[:8]) for _ in range(rng.randint(2, 4))),)


TEMPLATES = [
    Template("def f(a, b):\n    return a * b + {c}", lambda c: lambda a, b: a * b + c, _ints(1, 12)),
    Template("def f(a, b):\n    return (a + b) * {c}", lambda c: lambda a, b: (a + b) * c, _ints(1, 12)),
    Template("def f(a, b):\n    return a * {c} - b", lambda c: lambda a, b: a * c - b, _ints(1, 12)),
    Template("def f(x):\n    return x % {c} + x // {c}", lambda c: lambda x: x % c + x // c, _ints(1, 50, 1)),
    Template("def f(xs):\n    return sum(xs) + {c}", lambda c: lambda xs: sum(xs) + c, _int_list),
    Template("def f(xs):\n    return max(xs) * {c}", lambda c: lambda xs: max(xs) * c, _int_list),
    Template("def f(xs):\n    return [x + {c} for x in xs]", lambda c: lambda xs: [x + c for x in xs], _int_list),
    Template("def f(xs):\n    return sorted(xs)[::-1]", lambda c: lambda xs: sorted(xs)[::-1], _int_list),
    Template("def f(xs):\n    return len(xs) * {c}", lambda c: lambda xs: len(xs) * c, _int_list),
    Template("def f(s):\n    return s[::-1]", lambda c: lambda s: s[::-1], _word),
    Template("def f(s):\n    return s + 'z' * {c}", lambda c: lambda s: s + "z" * c, _word),
    Template("def f(s):\n    return s.upper()", lambda c: lambda s: s.upper(), _word),
]
TASK_TYPES = ("deduction", "abduction", "induction")
INDUCTION_PAIRS = 4


def arguments_text(arguments: tuple) -> str:
    """The input block's text of one call: `3, 4` for f(3, 4)."""
    return repr(arguments)[1:-1].rstrip(",")


def draw_task(rng: random.Random, heldout: bool, task_type: str | None = None):
    """(task_type, program text, inputs as argument tuples, outputs): a program from the templates."""

    task_type = task_type or rng.choice(TASK_TYPES)
    while True:
        template, c = rng.choice(TEMPLATES), rng.randint(2, 9)
        calls = [template.arguments(rng) for _ in range(INDUCTION_PAIRS if task_type == "induction" else 1)]
        if (derive_seed("programs", template.text, c, *map(repr, calls)) % 4 == 0) == heldout:
            break
    function = template.function(c)
    outputs = [repr(function(*call)) for call in calls]
    shown = INDUCTION_PAIRS // 2 if task_type == "induction" else 1
    return CodeTask(task_type, template.text.format(c=c), tuple(repr(call) for call in calls), tuple(outputs), shown)


def solver_example(rng: random.Random, heldout: bool = False) -> Generated:
    """A solver's task and its answer block."""

    task = draw_task(rng, heldout)
    if task.task_type == "deduction":
        answer = f"```output\n{task.outputs[0]}\n```"
    elif task.task_type == "abduction":
        answer = f"```input\n{task.inputs[0][1:-1].rstrip(',')}\n```"
    else:
        answer = f"```python\n{task.program}\n```"
    return Generated(solver_prompt(task), task.to_json(), answer, [], {"task_type": task.task_type})


def proposer_example(rng: random.Random, heldout: bool = False, references: int = 1) -> Generated:
    """A proposer's prompt (with `references` reference tasks) and a proposal of the same type."""

    task_type = rng.choice(TASK_TYPES)
    shown = [draw_task(rng, heldout, task_type) for _ in range(references)]
    proposal = draw_task(rng, heldout, task_type)
    return Generated(
        proposer_prompt(task_type, shown),
        task_type,
        proposal_text(proposal),
        [],
        {"task_type": task_type, "references": references},
    )


def proposer_example_bare(rng: random.Random) -> Generated:
    """A proposer's prompt without references (`selfplay.references: 0`): one prompt per task type."""
    return proposer_example(rng, references=0)


def solver_example_eval(rng: random.Random) -> Generated:
    return solver_example(rng, heldout=True)


def proposer_example_eval(rng: random.Random) -> Generated:
    return proposer_example(rng, heldout=True)
