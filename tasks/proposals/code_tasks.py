"""Absolute Zero-style code tasks: what a proposer writes, the rules a proposal must pass, the solver's
prompts and how a solver's answer is judged. Pure: no sandbox, no lake (`tasks/proposals/executor.py`
runs the programs; `tasks/proposals/verifiers.py` scores the solver).

A proposal is a program defining `f` and one or more inputs, each in its own fenced block:

    ```python
    def f(xs, k):
        return sorted(xs)[-k:]
    ```
    ```input
    [3, 1, 2], 2
    ```

An input is the argument list of one call, `f(<input>)`, made of Python literals only. The program
runs in the sandbox, never here; inputs and outputs are parsed here with `ast.literal_eval` alone,
so nothing the model wrote is executed in this process. Three task types are made from a valid
proposal (AZR's modes of reasoning):

- deduction: the program and an input are shown; the solver predicts the output;
- abduction: the program and an output are shown; the solver finds an input that gives it (checked
  by running the program on that input);
- induction: some input/output pairs are shown; the solver writes `f` (checked on held-out pairs).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from dataclasses import dataclass, field

TASK_TYPES = ("deduction", "abduction", "induction")
ENTRY_POINT = "f"
# what a proposed program may import: pure computation only (no host, time, randomness, processes, reflection)
ALLOWED_MODULES = frozenset(
    {
        "math",
        "cmath",
        "itertools",
        "functools",
        "collections",
        "string",
        "re",
        "heapq",
        "bisect",
        "operator",
        "fractions",
        "decimal",
        "statistics",
        "copy",
        "typing",
        "dataclasses",
        "enum",
        "numbers",
        "array",
    }
)
FORBIDDEN_CALLS = frozenset(
    {
        "open",
        "exec",
        "eval",
        "compile",
        "input",
        "__import__",
        "globals",
        "locals",
        "vars",
        "breakpoint",
        "exit",
        "quit",
        "getattr",
        "setattr",
        "delattr",
        "print",
        "id",
        "hash",
    }
)
REASONS = (
    "unparseable",
    "does_not_run",
    "not_deterministic",
    "forbidden_import",
    "too_slow",
    "output_too_large",
    "not_a_literal",
    "duplicate",
)
BLOCK = re.compile(r"```[ \t]*(python|py|input|output)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class ProposalRules:
    """Limits of a proposal, before and after it runs."""

    max_program_chars: int = 2000  # a longer program is unparseable
    max_input_chars: int = 500  # one input's text
    max_output_chars: int = 500  # repr of one output: longer is output_too_large
    induction_pairs: int = 4  # inputs an induction proposal gives (half shown, half held out)


@dataclass(frozen=True)
class Proposal:
    """A parsed proposal: the program and the argument tuples of its calls (canonical literal text)."""

    task_type: str
    program: str
    inputs: tuple[str, ...]


@dataclass(frozen=True)
class Rejection:
    reason: str  # one of REASONS (a code task's), GROUNDED_REASONS (a grounded one's,
    detail: str = ""  # tasks/proposals/documents.py) or the bank gate's (tasks/curation/gate.py)


@dataclass(frozen=True)
class CodeTask:
    """A valid proposal with the outputs the sandbox computed: what the solver is asked and judged on."""

    task_type: str
    program: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    shown: int = field(default=1)  # induction: pairs shown; the rest are held out

    def to_json(self) -> str:
        return json.dumps(
            {
                "task_type": self.task_type,
                "program": self.program,
                "inputs": list(self.inputs),
                "outputs": list(self.outputs),
                "shown": self.shown,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> CodeTask:
        data = json.loads(text)
        return cls(data["task_type"], data["program"], tuple(data["inputs"]), tuple(data["outputs"]), data["shown"])


def literal_arguments(text: str, max_chars: int) -> tuple | None:
    """The argument tuple an input's text stands for, or None when it is not literals only."""
    if len(text) > max_chars:
        return None
    try:
        value = ast.literal_eval(f"({text.strip()},)")
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, tuple) else None


def canonical_literal(text: str, max_chars: int) -> str | None:
    """repr of the literal `text` stands for (so 1.0, 1. and 1e0 compare equal), or None."""
    if len(text) > max_chars:
        return None
    try:
        return repr(ast.literal_eval(text.strip()))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def parse_proposal(text: str, task_type: str, rules: ProposalRules = ProposalRules()) -> Proposal | Rejection:
    """The proposal in a proposer's response, or why it has none. Checks everything that needs no run:
    the blocks, the program's syntax and what it imports or calls, the inputs being literals."""
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown task type {task_type!r}: one of {', '.join(TASK_TYPES)}")
    blocks = BLOCK.findall(text)
    programs = [body for kind, body in blocks if kind in ("python", "py", "")]
    inputs = [body.strip() for kind, body in blocks if kind == "input"]
    wanted = rules.induction_pairs if task_type == "induction" else 1
    if not programs or len(inputs) < wanted:
        return Rejection("unparseable", f"needs a python block and {wanted} input block{'s' * (wanted > 1)}")
    program = programs[0].strip()
    if len(program) > rules.max_program_chars:
        return Rejection("unparseable", f"program longer than {rules.max_program_chars} characters")
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as error:
        return Rejection("does_not_run", f"syntax error: {error}"[:300])
    if not any(isinstance(node, ast.FunctionDef) and node.name == ENTRY_POINT for node in tree.body):
        return Rejection("unparseable", f"the program defines no top-level function {ENTRY_POINT}")
    forbidden = forbidden_use(tree)
    if forbidden:
        return Rejection("forbidden_import", forbidden)
    arguments = []
    for raw in inputs[:wanted]:
        parsed = literal_arguments(raw, rules.max_input_chars)
        if parsed is None:
            return Rejection("not_a_literal", f"input {raw[:80]!r} is not an argument list of literals")
        arguments.append(repr(parsed))
    return Proposal(task_type, program, tuple(arguments))


def forbidden_use(tree: ast.AST) -> str | None:
    """What the program imports or calls that proposals may not (None when nothing)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                if name.split(".")[0] not in ALLOWED_MODULES or (isinstance(node, ast.ImportFrom) and node.level):
                    return f"imports {name or 'from a package'} (proposals may import only {', '.join(sorted(ALLOWED_MODULES))})"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            return f"calls {node.func.id}()"
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__") and node.attr.endswith("__"):
            return f"uses {node.attr}"
    return None


def task_key(proposal: Proposal) -> str:
    """What two proposals share when one duplicates the other: the program's syntax tree (its comments,
    blank lines and layout aside) and its inputs, per task type."""
    tree = ast.dump(ast.parse(proposal.program), annotate_fields=False)
    return hashlib.sha256(json.dumps([proposal.task_type, tree, list(proposal.inputs)]).encode()).hexdigest()[:24]


class _Abstracted(ast.NodeTransformer):
    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.Constant(type(node.value).__name__)


def shape_key(program: str) -> str:
    """What near-duplicates share: the program's syntax tree with every constant replaced by its type, so
    `return a * b + 3` and `return a * b + 7` are one shape (collapse monitoring, not a validity rule)."""
    tree = _Abstracted().visit(ast.parse(program))
    return hashlib.sha256(ast.dump(tree, annotate_fields=False).encode()).hexdigest()[:24]


def execution_script(program: str, inputs: tuple[str, ...], marker: str) -> str:
    """The script the sandbox runs: the program, then each call, its output's repr printed after `marker`
    (a line the program cannot know in advance), one JSON list for all calls."""
    calls = ", ".join(inputs)
    return (
        f"{program}\n\n"
        f"import json as _rlvr_json\n"
        f"_rlvr_outputs = [repr({ENTRY_POINT}(*_rlvr_args)) for _rlvr_args in [{calls}]]\n"
        f"__rlvr_marker = {marker!r}\n"
        f"_rlvr_print = __builtins__['print'] if isinstance(__builtins__, dict) else __builtins__.print\n"
        f"_rlvr_print(__rlvr_marker + _rlvr_json.dumps(_rlvr_outputs), flush=True)\n"
    )


def outputs_of(output: str, marker: str, expected: int, max_chars: int) -> tuple[str, ...] | Rejection:
    """The canonical outputs in a run's printed text, or why there are none."""
    lines = [line for line in output.splitlines() if line.startswith(marker)]
    if not lines:
        return Rejection("does_not_run", output.strip()[-300:] or "no output")
    try:  # the first: anything printed later (at exit, say) could be forged
        values = json.loads(lines[0][len(marker) :])
    except json.JSONDecodeError:
        return Rejection("does_not_run", "unreadable outputs")
    if not isinstance(values, list) or len(values) != expected or not all(isinstance(v, str) for v in values):
        return Rejection("does_not_run", "unreadable outputs")
    canonical = []
    for value in values:
        if len(value) > max_chars:
            return Rejection("output_too_large", f"an output's repr is {len(value)} characters (limit {max_chars})")
        literal = canonical_literal(value, max_chars)
        if literal is None:
            return Rejection("not_a_literal", f"output {value[:80]} is not a literal")
        canonical.append(literal)
    return tuple(canonical)


def proposal_text(task: CodeTask) -> str:
    """A task written as a proposer writes it: the program block, then one input block per call."""
    inputs = "".join(f"```input\n{arguments[1:-1].rstrip(',')}\n```\n" for arguments in task.inputs)
    return f"```python\n{task.program}\n```\n{inputs}"


def proposer_prompt(task_type: str, references: list[CodeTask]) -> str:
    """What the proposer sees: the task type it is to propose, and earlier valid tasks as examples (AZR's
    references, which it should not repeat)."""
    count = "one input" if task_type != "induction" else f"{ProposalRules().induction_pairs} inputs"
    examples = "".join(f"Example:\n{proposal_text(reference)}" for reference in references)
    return f"Propose a new {task_type} task: a Python function f and {count}.\n{examples}New task:\n"


def solver_prompt(task: CodeTask) -> str:
    """What the solver sees (never the held-out pairs of an induction task)."""
    if task.task_type == "deduction":
        return (
            f"```python\n{task.program}\n```\nWhat does f({task.inputs[0][1:-1].rstrip(',')}) return? "
            "Answer with the value in an ```output``` block.\n"
        )
    if task.task_type == "abduction":
        return (
            f"```python\n{task.program}\n```\nGive arguments for which f returns {task.outputs[0]}. "
            "Answer with them in an ```input``` block.\n"
        )
    pairs = "\n".join(
        f"f({arguments[1:-1].rstrip(',')}) == {output}"
        for arguments, output in zip(task.inputs[: task.shown], task.outputs[: task.shown])
    )
    return f"{pairs}\nWrite the function f in a ```python``` block.\n"


def last_block(response: str, kinds: tuple[str, ...]) -> str | None:
    found = [body for kind, body in BLOCK.findall(response) if kind in kinds]
    return found[-1].strip() if found else None


def learnability(solve_rate: float | None) -> float:
    """The proposer's reward for a valid task (Absolute Zero): 1 − the solver's solve rate when the solver
    sometimes but not always solves it, else 0 (too easy and too hard teach nothing)."""
    if solve_rate is None or not 0.0 < solve_rate < 1.0:
        return 0.0
    return 1.0 - solve_rate
