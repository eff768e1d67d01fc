"""`rlvr verify-file`: scoring a JSONL file of responses without a lake.

Each input line: `id`, `domain` (math, code, logic, qa), `response`; `ground_truth` for math and qa
(and logic, where the dataset has a single answer); `tests` and `entry_point` for code; optional `prompt`, `metadata` (logic: the reasoning-gym
entry's metadata), `steps` (process rewards) and `verifier` (override the domain's default).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

DOMAINS = ("math", "code", "logic", "qa")


@dataclass(frozen=True)
class BadLine:
    line: int
    field: str | None
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.field + ': ' if self.field else ''}{self.reason}"


def parse_line(number: int, text: str) -> tuple[dict[str, Any], str, str | None] | BadLine:
    """(problem, response, verifier name or None) for one input line, or what is wrong with it."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        return BadLine(number, None, f"invalid JSON: {error.msg}")
    if not isinstance(record, dict):
        return BadLine(number, None, "not a JSON object")
    for field, kind in (("id", (str, int)), ("domain", str), ("response", str)):
        if not isinstance(record.get(field), kind):
            return BadLine(number, field, "missing or not a " + " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,))))
    domain = record["domain"]
    if domain not in DOMAINS:
        return BadLine(number, "domain", f"{domain!r} is not one of {', '.join(DOMAINS)}")
    if domain in ("math", "qa") and record.get("ground_truth") in (None, ""):
        return BadLine(number, "ground_truth", f"required for {domain}")
    if domain == "code":
        for field in ("tests", "entry_point"):
            if not isinstance(record.get(field), str) or not record[field].strip():
                return BadLine(number, field, "required for code")
    if domain == "logic" and not (isinstance(record.get("metadata"), dict) and record["metadata"].get("source_dataset")):
        return BadLine(number, "metadata", "logic lines need the reasoning-gym entry's metadata (with source_dataset)")
    verifier = record.get("verifier")
    if verifier is not None:
        from tasks.verifiers.base import VERIFIERS, build_verifier

        build_verifier("math")                      # loads the registry
        if verifier not in VERIFIERS:
            return BadLine(number, "verifier", f"unknown verifier {verifier!r}; known: {', '.join(sorted(VERIFIERS))}")
    if "label" in record and not isinstance(record["label"], bool):
        return BadLine(number, "label", "must be true or false")
    problem = {
        "label": record.get("label"),
        "id": record["id"], "problem_id": str(record["id"]), "domain": domain, "answer": record.get("ground_truth"),
        "prompt": record.get("prompt") or "", "tests": record.get("tests"), "entry_point": record.get("entry_point"),
        "metadata": record.get("metadata"), "steps": record.get("steps"),
    }
    if isinstance(problem["answer"], (list, dict)) and domain != "qa":
        problem["answer"] = json.dumps(problem["answer"])
    elif problem["answer"] is not None and not isinstance(problem["answer"], list):
        problem["answer"] = str(problem["answer"])
    return problem, record["response"], verifier


def read_lines(path: str) -> Iterator[tuple[dict[str, Any], str, str | None] | BadLine]:
    with open(path, encoding="utf-8-sig") as handle:
        for number, text in enumerate(handle, start=1):
            if text.strip():
                yield parse_line(number, text)
