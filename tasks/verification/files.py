"""`rlvr verify-file`: scoring a JSONL file of responses without a lake.

Each input line: `id`, `domain` (math, code, logic, qa, or a verifier that serves one of them: translation,
sat, game, ...), `response`; `ground_truth` for math and qa
(and logic, where the dataset has a single answer); `tests` and `entry_point` for code (`verifier: workspace`: `tests` holds the workspace spec, no entry point); optional `prompt`, `metadata` (logic: the reasoning-gym
entry's metadata), `steps` (process rewards) and `verifier` (override the domain's default).

A line that cannot be used — not UTF-8, not JSON, nested too deeply, too long, a field of the wrong
type — is reported with its number and reason, and the other lines are scored.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tasks.verification.registry import known_verifiers

DOMAINS = ("math", "code", "logic", "qa")
# The verifiers that serve one domain, which a line may give as its `domain` for short (`"domain": "translation"`
# is `"domain": "qa", "verifier": "translation"`); the others (controls, format, process) score any domain.
SERVED_DOMAIN = {
    "translation": "qa",
    "judge": "qa",
    "self_verify": "qa",
    "sat": "logic",
    "game": "logic",
    "gym": "logic",
    "workspace": "code",
}
MAX_LINE_BYTES = 16 * 1024 * 1024
OPTIONAL_TYPES = {
    "prompt": (str,),
    "tests": (str,),
    "entry_point": (str,),
    "metadata": (dict,),
    "steps": (list,),
    "verifier": (str,),
    "ground_truth": (str, int, float, list, dict),
}


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
        return BadLine(number, None, f"invalid JSON: {error.msg} (column {error.colno})")
    except RecursionError:
        return BadLine(number, None, "invalid JSON: nested too deeply")
    if not isinstance(record, dict):
        return BadLine(number, None, "not a JSON object")
    for field, kind in (("id", (str, int)), ("domain", (str,)), ("response", (str,))):
        if not isinstance(record.get(field), kind) or isinstance(record.get(field), bool):
            return BadLine(number, field, "missing or not " + " or ".join(_type_name(k) for k in kind))
    for field, kinds in OPTIONAL_TYPES.items():
        value = record.get(field)
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
            return BadLine(
                number, field, f"must be {' or '.join(_type_name(k) for k in kinds)}, not {_type_name(type(value))}"
            )
    domain, verifier = record["domain"], record.get("verifier")
    if domain not in DOMAINS:
        if domain in SERVED_DOMAIN and verifier in (None, domain):  # `"domain": "translation"` for short
            domain, verifier = SERVED_DOMAIN[domain], domain
        elif domain in SERVED_DOMAIN:
            return BadLine(
                number,
                "domain",
                f"{domain!r} names a verifier, and the line's `verifier` names another "
                f"({verifier!r}): give the domain, {SERVED_DOMAIN[domain]!r}, with the verifier you want",
            )
        else:
            return BadLine(
                number,
                "domain",
                f"{domain!r} is not one of {', '.join(DOMAINS)}, nor a verifier of one "
                f"({', '.join(sorted(SERVED_DOMAIN))}); the `verifier` field selects any verifier, e.g. "
                '"domain": "qa", "verifier": "translation"',
            )
    if domain in ("math", "qa") and record.get("ground_truth") in (None, ""):
        return BadLine(number, "ground_truth", f"required for {domain}")
    if domain == "code":
        for field in ("tests",) if verifier == "workspace" else ("tests", "entry_point"):
            if not isinstance(record.get(field), str) or not record[field].strip():
                return BadLine(number, field, "required for code")
    if (
        domain == "logic"
        and verifier in (None, "gym")
        and not (isinstance(record.get("metadata"), dict) and record["metadata"].get("source_dataset"))
    ):
        return BadLine(number, "metadata", "logic lines need the reasoning-gym entry's metadata (with source_dataset)")
    if verifier is not None:
        if verifier not in known_verifiers():
            return BadLine(number, "verifier", f"unknown verifier {verifier!r}; known: {', '.join(known_verifiers())}")
    if "label" in record and not isinstance(record["label"], bool):
        return BadLine(number, "label", "must be true or false")
    problem = {
        "label": record.get("label"),
        "id": record["id"],
        "problem_id": str(record["id"]),
        "domain": domain,
        "answer": record.get("ground_truth"),
        "prompt": record.get("prompt") or "",
        "tests": record.get("tests"),
        "entry_point": record.get("entry_point"),
        "metadata": record.get("metadata"),
        "steps": record.get("steps"),
    }
    if isinstance(problem["answer"], (list, dict)) and domain != "qa":
        problem["answer"] = json.dumps(problem["answer"])
    elif problem["answer"] is not None and not isinstance(problem["answer"], list):
        problem["answer"] = str(problem["answer"])
    return problem, record["response"], verifier


def _type_name(kind: type) -> str:
    return {
        str: "a string",
        int: "an integer",
        float: "a number",
        list: "a list",
        dict: "an object",
        bool: "a boolean",
        type(None): "null",
    }.get(kind, kind.__name__)


def read_lines(
    path: str, max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[dict[str, Any], str, str | None] | BadLine]:
    """Each non-blank line parsed, or the reason it cannot be used. Read as bytes, so one bad byte spoils
    only its own line; a line over `max_line_bytes` is skipped without being held in memory."""
    with open(path, "rb") as handle:
        number = 0
        while True:
            raw = handle.readline(max_line_bytes + 1)
            if not raw:
                return
            number += 1
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):  # the rest of the line, in pieces
                    raw = handle.readline(max_line_bytes)
                yield BadLine(number, None, f"longer than {max_line_bytes:,} bytes")
                continue
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte-order mark
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                yield BadLine(number, None, f"not UTF-8 (byte 0x{raw[error.start]:02x} at column {error.start + 1})")
                continue
            if text.strip():
                yield parse_line(number, text)
