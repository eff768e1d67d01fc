"""Propositional logic with certificates: a CNF formula is satisfiable or not, and the answer proves it.

The answer (inside `<answer>…</answer>`, else the response's last `SAT` / `UNSAT` block) is
- `SAT` followed by an assignment as literals (`SAT 1 -2 3`): it must satisfy every clause, and give
  every variable of the formula one value;
- `UNSAT` followed by a resolution refutation, one derived clause per line: `n: i j -> lits` says clause
  n is the resolvent of clauses i and j (given or derived earlier), `lits` its literals, `0` or nothing
  for the empty clause, which must be derived last.
The checker recomputes every resolvent (on exactly one clashing variable: resolving on two gives a
tautology, not a proof), so a claim without a valid certificate scores 0 whatever it claims — the
certificate, not the claim, is checked. Reward 1 for a valid proof, 0 otherwise. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tasks.verifiers.base import Verdict, failed, register

Clause = frozenset[int]
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
STEP = re.compile(r"^\s*(\d+)\s*[:.]\s*(\d+)\s*[, ]\s*(\d+)\s*(?:->|→|=>)\s*(.*?)\s*$")
MAX_STEPS = 5000


def parse_cnf(text: str) -> list[Clause]:
    """Clauses as lines of non-zero integers (DIMACS-like, an optional trailing 0; `p cnf` and `c` lines skipped)."""
    clauses = []
    for line in text.strip().splitlines():
        line = line.strip()
        if not line or line[0] in "cp%":
            continue
        literals = [int(token) for token in line.split()]
        clauses.append(frozenset(lit for lit in literals if lit != 0))
    return clauses


def resolvent(left: Clause, right: Clause) -> Clause | None:
    """The resolvent of two clauses on their single clashing variable; None when they clash on none or more."""
    clashing = [lit for lit in left if -lit in right]
    if len(clashing) != 1:
        return None
    pivot = clashing[0]
    return frozenset((left - {pivot}) | (right - {-pivot}))


def satisfies(assignment: set[int], clauses: list[Clause]) -> bool:
    return all(clause & assignment for clause in clauses)


def check_refutation(clauses: list[Clause], steps: list[tuple[int, int, int, Clause]]) -> str | None:
    """Why a refutation is invalid, or None when it derives the empty clause validly."""
    known: dict[int, Clause] = {index + 1: clause for index, clause in enumerate(clauses)}
    if not steps:
        return "no resolution steps"
    for number, left, right, stated in steps:
        if number in known:
            return f"step {number}: clause {number} already exists"
        if left not in known or right not in known:
            return f"step {number}: resolves clause {left if left not in known else right}, which does not exist yet"
        derived = resolvent(known[left], known[right])
        if derived is None:
            return f"step {number}: clauses {left} and {right} do not clash on exactly one variable"
        if derived != stated:
            return f"step {number}: the resolvent of {left} and {right} is {sorted(derived, key=abs) or 'empty'}, not {sorted(stated, key=abs) or 'empty'}"
        known[number] = derived
    if steps[-1][3]:
        return "the last step does not derive the empty clause"
    return None


@dataclass(frozen=True)
class Certificate:
    claim: str  # SAT or UNSAT
    assignment: set[int] | None = None
    steps: list[tuple[int, int, int, Clause]] | None = None


def read_certificate(response: str) -> Certificate | str:
    """The response's certificate, or why none can be read."""
    tagged = ANSWER.findall(response)
    text = tagged[-1] if tagged else response
    found = list(re.finditer(r"\b(UNSAT|SAT)\b", text))
    if not found:
        return "no SAT or UNSAT claim"
    claim = found[-1].group(1)
    body = text[found[-1].end() :].strip()
    if claim == "SAT":
        first_line = body.splitlines()[0] if body else ""
        try:
            literals = [int(token) for token in re.findall(r"-?\d+", first_line)]
        except ValueError:
            return "the assignment is not a list of literals"
        return Certificate("SAT", assignment={lit for lit in literals if lit != 0})
    steps = []
    for line in body.splitlines()[: MAX_STEPS + 1]:
        if not line.strip():
            continue
        match = STEP.match(line)
        if not match:
            return f"cannot read the step {line.strip()[:60]!r} (expected `n: i j -> literals`)"
        literals = frozenset(int(token) for token in re.findall(r"-?\d+", match.group(4)) if int(token) != 0)
        steps.append((int(match.group(1)), int(match.group(2)), int(match.group(3)), literals))
    if len(steps) > MAX_STEPS:
        return f"more than {MAX_STEPS} steps"
    return Certificate("UNSAT", steps=steps)


@register("sat")
@dataclass
class SatVerifier:
    """Reward 1 for a valid certificate: a satisfying assignment, or a resolution refutation."""

    name: str = "sat"
    version: str = "1.0"

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:
        clauses = parse_cnf(str((problem.get("metadata") or {}).get("cnf") or _cnf_of(problem.get("prompt") or "")))
        if not clauses:
            return Verdict(0.0, None, {"reason": "the problem carries no formula"})
        certificate = read_certificate(response)
        if isinstance(certificate, str):
            return failed(certificate)
        variables = {abs(lit) for clause in clauses for lit in clause}
        if certificate.claim == "SAT":
            assignment = certificate.assignment or set()
            if any(-lit in assignment for lit in assignment):
                return failed("the assignment gives a variable both values", claim="SAT")
            if {abs(lit) for lit in assignment} != variables:
                return failed("the assignment does not give every variable exactly one value", claim="SAT")
            if not satisfies(assignment, clauses):
                return failed("the assignment falsifies a clause", claim="SAT")
            return Verdict(1.0, True, {"claim": "SAT", "reason": None})
        problem_with = check_refutation(clauses, certificate.steps or [])
        if problem_with is not None:
            return failed(f"invalid refutation: {problem_with}", claim="UNSAT")
        return Verdict(1.0, True, {"claim": "UNSAT", "steps": len(certificate.steps or []), "reason": None})


def _cnf_of(prompt: str) -> str:
    """The clause lines of a prompt written by the sat generator (between `Clauses:` and the blank line)."""
    match = re.search(r"Clauses:\n(.*?)(?:\n\n|$)", prompt, re.DOTALL)
    return match.group(1) if match else ""
