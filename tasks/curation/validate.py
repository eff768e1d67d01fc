"""Validation rules: what makes a problem fit for the bank. Each rule returns (field, reason) or None."""

from __future__ import annotations

import ast
import logging
import re
from functools import lru_cache
from typing import Any

from tasks.proposals.code_tasks import TASK_TYPES, CodeTask
from tasks.workspaces.problem import parse_spec

# Answers most sources use: integers, decimals, simple fractions, with optional sign, $, % or commas.
SIMPLE_ANSWER = re.compile(r"^\$?-?\d[\d,]*(\.\d+)?%?$|^-?\d+/\d+$|^-?\.\d+$")
# Prose is not an answer: words outside LaTeX commands and \text{} blocks (which hold names and units).
_LATEX_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox|operatorname|begin|end)\s*\{[^{}]*\}")
_LATEX_COMMAND = re.compile(r"\\[a-zA-Z]+")
_WORD = re.compile(r"[a-zA-Z]{3,}")
MATH_WORDS = {
    "sin",
    "cos",
    "tan",
    "cot",
    "sec",
    "csc",
    "log",
    "ln",
    "exp",
    "mod",
    "pi",
    "inf",
    "max",
    "min",
    "gcd",
    "lcm",
    "arcsin",
    "arccos",
    "arctan",
    "sqrt",
    "det",
    "deg",
    "dx",
    "dy",
    "dt",
}
NON_ANSWERS = {"n/a", "na", "none", "null", "nan", "todo", "tbd", "unknown", "see above", "?"}


ANSWER_FREE_VERIFIERS = {"judge"}
EXECUTOR_VERIFIERS = {"selfplay", "proposal", "learnability"}  # code checked by running a task, not tests


def executor_task_issue(problem: dict[str, Any]) -> tuple[str, str] | None:
    """A self-play problem: a solver's task (its CodeTask JSON parses) or a proposer's prompt (a task type)."""

    answer = problem.get("answer") or ""
    if problem["verifier"] == "selfplay":
        try:
            CodeTask.from_json(answer)
        except (ValueError, KeyError, TypeError) as error:
            return "answer", f"not a self-play task: {error}"[:300]
    elif answer not in (*TASK_TYPES, "grounded"):
        return "answer", f"a proposer's answer names its task type ({', '.join(TASK_TYPES)}), not {answer[:40]!r}"
    return None


def problem_issue(
    problem: dict[str, Any], max_prompt_chars: int, check_math_answers: bool
) -> tuple[str | None, str] | None:
    """The first thing wrong with a problem, or None if it can enter the bank."""
    prompt = problem.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        return "prompt", "empty prompt"
    if len(prompt) > max_prompt_chars:
        return "prompt", f"prompt longer than {max_prompt_chars} characters"
    if not 1 <= problem["level"] <= 4:
        return "level", f"level {problem['level']} is not 1-4"
    domain = problem["domain"]
    if problem.get("verifier") in EXECUTOR_VERIFIERS:  # self-play: a task, not tests
        return executor_task_issue(problem)
    if problem.get("verifier") == "workspace":
        return workspace_issue(problem.get("tests"))
    if domain == "code":
        return code_issue(prompt, problem.get("solution"), problem.get("tests"), problem.get("entry_point"))
    answer = problem.get("answer")
    judged = problem.get("verifier") in ANSWER_FREE_VERIFIERS  # graded by a judge model, not against a gold
    if (
        domain in ("math", "qa", "logic")
        and problem["source_kind"] != "gym"
        and not judged
        and (answer is None or not str(answer).strip())
    ):
        return "answer", "missing answer"
    if domain == "math" and check_math_answers and not math_answer_parses(str(answer)):
        return "answer", "math answer cannot be parsed"
    return None


def workspace_issue(tests: str | None) -> tuple[str, str] | None:
    """A file- or project-level problem's spec: JSON naming the files to write and the test modules."""

    if parse_spec(tests) is None:
        return "tests", "not a workspace spec (JSON naming the files to write and the test modules)"
    return None


def code_issue(prompt: str, solution: str | None, tests: str | None, entry_point: str | None) -> tuple[str, str] | None:
    """Structural completeness, checked by parsing only: nothing here runs the code."""
    if not entry_point:
        return "entry_point", "missing entry_point"
    if not tests or not tests.strip():
        return "tests", "missing tests"
    try:
        ast.parse(tests)
    except SyntaxError as error:
        return "tests", f"tests do not parse: {error.msg} (line {error.lineno})"
    program = prompt + (solution or "")
    try:
        module = ast.parse(program)
    except SyntaxError as error:
        field = "canonical_solution" if solution else "prompt"
        return field, f"prompt + solution do not parse: {error.msg} (line {error.lineno})"
    defined = {node.name for node in module.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if entry_point not in defined:
        return "entry_point", f"entry point {entry_point!r} is not defined by the prompt and solution"
    return None


@lru_cache(maxsize=65536)
def math_answer_parses(answer: str) -> bool:
    """Fast path for plain numbers; otherwise math-verify must turn `$answer$` into a sympy value."""
    text = answer.strip()
    if not text or text.lower() in NON_ANSWERS or "####" in text:
        return False
    if SIMPLE_ANSWER.match(text.replace(" ", "")):
        return True
    bare = _LATEX_COMMAND.sub(" ", _LATEX_TEXT.sub(" ", text))
    if any(word.lower() not in MATH_WORDS and not word.isupper() for word in _WORD.findall(bare)):
        return False  # a lower-case word is prose; upper-case runs are products (2RC)
    from math_verify import parse  # imported lazily: it pulls in sympy

    logging.getLogger("math_verify.parser").setLevel(logging.ERROR)  # its "timeout disabled" warning is expected

    # Timeouts use signals, which only work in the main thread; dataset answers are short and
    # trusted, so parse without them here (responses from the policy are parsed in workers).
    parsed = parse(f"${text.strip('$')}$", parsing_timeout=None)
    return any(not isinstance(value, str) for value in parsed)  # strings are its "could not parse" fallback
