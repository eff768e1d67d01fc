"""Procedural logic problems whose answers carry their own proof: CNF satisfiability (verifier `sat`).

Random 3-CNF formulas near the satisfiability threshold (about 4.3 clauses per variable), so about
half are satisfiable. The worked solution is a certificate: a satisfying assignment, or a resolution
refutation read off a DPLL search tree (each leaf a falsified clause; each inner node the resolvent
of its children on the branching variable). Levels grow with the number of variables.
"""

from __future__ import annotations

import random

from tasks.generators.base import Generated
from tasks.verifiers.sat import Clause, resolvent

VARIABLES = {1: 4, 2: 6, 3: 8, 4: 10}


def _dpll(clauses: list[Clause], assignment: tuple[int, ...], variables: list[int]):
    """('sat', assignment) or ('unsat', proof tree), the tree a (clause index | (pivot, left, right))."""
    chosen = set(assignment)
    for index, clause in enumerate(clauses):
        if all(-lit in chosen for lit in clause):
            return "unsat", index
    free = [v for v in variables if v not in chosen and -v not in chosen]
    if not free:
        return "sat", assignment
    variable = free[0]
    trees = []
    for literal in (variable, -variable):
        status, found = _dpll(clauses, (*assignment, literal), variables)
        if status == "sat":
            return status, found
        trees.append(found)
    return "unsat", (variable, trees[0], trees[1])


def _refutation(clauses: list[Clause], tree) -> list[tuple[int, int, int, Clause]]:
    """The tree as numbered resolution steps `(n, i, j, resolvent)`, clauses numbered from 1. Each node's clause
    is falsified by the node's partial assignment: a leaf's own clause; an inner node's, its child's clause
    when that child's does not mention the branching variable, else the resolvent of both on it (they can
    clash on no other variable, since both are falsified by one assignment)."""
    steps: list[tuple[int, int, int, Clause]] = []
    clause_of = {index + 1: clause for index, clause in enumerate(clauses)}
    number_of = {clause: number for number, clause in reversed(list(clause_of.items()))}

    def derive(node) -> int:
        if isinstance(node, int):
            return node + 1
        variable, positive, negative = node
        left, right = derive(positive), derive(negative)
        if -variable not in clause_of[left]:
            return left
        if variable not in clause_of[right]:
            return right
        merged = resolvent(clause_of[left], clause_of[right])
        if merged not in number_of:
            number = len(clause_of) + 1
            clause_of[number], number_of[merged] = merged, number
            steps.append((number, left, right, merged))
        return number_of[merged]

    derive(tree)
    return steps


def sat_formula(rng: random.Random, variables: int) -> list[Clause]:
    count = round(variables * 4.3)
    clauses: list[Clause] = []
    while len(clauses) < count:
        chosen = rng.sample(range(1, variables + 1), 3)
        clause = frozenset(v if rng.random() < 0.5 else -v for v in chosen)
        if clause not in clauses:
            clauses.append(clause)
    return clauses


def sat(rng: random.Random, level: int = 1) -> Generated:
    variables = VARIABLES[level]
    clauses = sat_formula(rng, variables)
    status, found = _dpll(clauses, (), list(range(1, variables + 1)))
    lines = "\n".join(" ".join(str(lit) for lit in sorted(clause, key=abs)) + " 0" for clause in clauses)
    prompt = (
        f"Is this CNF formula over variables 1..{variables} satisfiable? Clauses (one per line, literals as "
        f"integers, -k for not k, each line ending in 0):\nClauses:\n{lines}\n\nAnswer inside <answer></answer> "
        "with a proof: `SAT` and a satisfying assignment as literals (e.g. SAT 1 -2 3 -4), or `UNSAT` and a "
        "resolution refutation, one line per derived clause `n: i j -> literals` (clause n is the resolvent "
        "of clauses i and j; clauses are numbered from 1 in the order given; end with the empty clause, "
        "`-> 0`)."
    )
    if status == "sat":
        assignment = sorted(found, key=abs)
        answer, certificate = "SAT", "SAT " + " ".join(map(str, assignment))
    else:
        steps = _refutation(clauses, found)
        answer = "UNSAT"
        certificate = "UNSAT\n" + "\n".join(
            f"{n}: {i} {j} -> {' '.join(map(str, sorted(c, key=abs))) or '0'}" for n, i, j, c in steps
        )
    return Generated(
        prompt=prompt,
        answer=answer,
        solution=f"<answer>\n{certificate}\n</answer>",
        steps=[],
        params={"variables": variables, "clauses": len(clauses), "cnf": lines},
    )
