"""From a source row to problem fields, one small function per file layout.

Each layout returns a dict with the fields it found (prompt, answer, solution, steps, tests,
entry_point, metadata) or raises `Rejected` naming the field at fault.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tasks.verifiers.extract import last_boxed

# MATH-500 / AIME 2025 / HMMT prompts end with the evaluation harness's own instruction; the
# rollout stage applies its own template, so the bank stores the bare problem.
HARNESS_SUFFIX = re.compile(r"\s*Please reason step by step,? and put your final answer within \\boxed\{\}\.?\s*$")
CALCULATOR_STEP = re.compile(r"<<([^<>]*)>>")


class Rejected(ValueError):
    def __init__(self, field: str | None, reason: str):
        super().__init__(reason)
        self.field = field
        self.reason = reason


def _text(record: dict[str, Any], *names: str, required: bool = True) -> tuple[str | None, str | None]:
    """The first present, non-empty field among `names`, as text, and which one it was."""
    for name in names:
        value = record.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _number_text(value), name
        if isinstance(value, str) and value.strip():
            return value.strip(), name
    if required:
        raise Rejected(names[0], f"missing or empty field {' / '.join(names)}")
    return None, None


def _number_text(value: int | float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _others(record: dict[str, Any], used: set[str]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key not in used}


def gsm8k(record: dict[str, Any]) -> dict[str, Any]:
    question, _ = _text(record, "question")
    worked, _ = _text(record, "answer")
    if "####" not in worked:
        raise Rejected("answer", "GSM8K answer has no '#### N' final line")
    reasoning, final = worked.rsplit("####", 1)
    final = final.strip().replace(",", "")
    if not final:
        raise Rejected("answer", "empty answer after '####'")
    return {
        "prompt": question,
        "answer": final,
        "solution": reasoning.strip(),
        "steps": CALCULATOR_STEP.findall(reasoning),
        "metadata": _others(record, {"question", "answer"}),
    }


def math(record: dict[str, Any]) -> dict[str, Any]:
    prompt, prompt_field = _text(record, "problem", "prompt", "question")
    answer, answer_field = _text(record, "answer", required=False)
    solution = record.get("solution") if isinstance(record.get("solution"), str) else None
    if answer is None and solution:
        answer, answer_field = last_boxed(solution), "solution"
    if not answer:
        raise Rejected("answer", "no answer field and no \\boxed{} answer in the solution")
    used = {prompt_field, answer_field, "solution", "problem", "prompt", "question"}
    return {
        "prompt": HARNESS_SUFFIX.sub("", prompt),
        "answer": answer,
        "solution": solution,
        "metadata": _others(record, used),
    }


def olympiad(record: dict[str, Any]) -> dict[str, Any]:
    question, _ = _text(record, "question")
    answers = record.get("final_answer")
    if isinstance(answers, str):
        answers = [answers]
    if not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        raise Rejected("final_answer", "missing or empty final_answer list")
    context = record.get("context")
    prompt = f"{context.strip()}\n\n{question}" if isinstance(context, str) and context.strip() else question
    solutions = record.get("solution")
    solution = solutions[0] if isinstance(solutions, list) and solutions else solutions
    answer = ", ".join(a.strip().strip("$").strip() for a in answers)
    return {
        "prompt": prompt,
        "answer": answer,
        "solution": solution if isinstance(solution, str) else None,
        "metadata": _others(record, {"question", "final_answer", "context", "solution"}),
    }


def humaneval(record: dict[str, Any]) -> dict[str, Any]:
    prompt = record.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise Rejected("prompt", "missing or empty field prompt")
    tests, _ = _text(record, "test", "tests")
    entry_point, _ = _text(record, "entry_point")
    solution = record.get("canonical_solution")
    return {
        "prompt": prompt,
        "tests": tests,
        "entry_point": entry_point,
        "solution": solution if isinstance(solution, str) else None,
        "metadata": _others(record, {"prompt", "test", "tests", "entry_point", "canonical_solution"}),
    }


def mapped(record: dict[str, Any], columns: dict[str, str]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for target, column in columns.items():
        value, _ = _text(record, column, required=target == "prompt")
        fields[target] = value
    if fields.get("answer") is None and fields.get("solution"):
        fields["answer"] = last_boxed(fields["solution"])
    fields["metadata"] = _others(record, set(columns.values()))
    return fields


LAYOUTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "gsm8k": gsm8k,
    "math": math,
    "olympiad": olympiad,
    "humaneval": humaneval,
}
DOMAIN_OF_LAYOUT = {"gsm8k": "math", "math": "math", "olympiad": "math", "humaneval": "code", "mapped": "math"}
