"""The code executor of self-play: proposals validated and solver answers checked by running programs
in the sandbox (never in this process).

A proposal is valid when it parses (`code_tasks.parse_proposal`), runs to completion within the
sandbox's limits, gives the same outputs over two runs, its outputs are literals of bounded size, and
it is not a task proposed before. Each rejection carries one reason of `code_tasks.REASONS`.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from tasks.proposals.code_tasks import (
    CodeTask,
    Proposal,
    ProposalRules,
    Rejection,
    canonical_literal,
    execution_script,
    literal_arguments,
    outputs_of,
    task_key,
)
from tasks.sandbox.client import Sandbox, SandboxResult
from tasks.sandbox.limits import SandboxLimits

# a proposal's run: small, quick and quiet; a task that needs more is not one the solver should learn from
PROPOSAL_LIMITS = SandboxLimits(
    cpu_seconds=2, wall_seconds=4.0, memory_mb=256, scratch_mb=16, processes=1, output_bytes=20_000
)
SANDBOX_STATUS_REASONS = {
    "timeout": "too_slow",
    "cpu_limit": "too_slow",
    "output_limit": "output_too_large",
    "memory_limit": "too_slow",
    "crashed": "does_not_run",
    "incomplete": "does_not_run",
}


@dataclass(frozen=True)
class Validated:
    key: str  # task_key: what a later duplicate shares
    task: object | None  # a CodeTask (a documents.Challenge for SPICE); None when rejected
    rejection: Rejection | None


def run_calls(
    sandbox: Sandbox,
    program: str,
    inputs: tuple[str, ...],
    rules: ProposalRules,
    limits: SandboxLimits = PROPOSAL_LIMITS,
) -> tuple[str, ...] | Rejection:
    """The canonical outputs of `program`'s f on each input, from one sandboxed run, or why there are none."""
    marker = f"@@rlvr-outputs-{secrets.token_hex(8)}@@"
    result: SandboxResult = sandbox.run_script(execution_script(program, inputs, marker), limits)
    if result.status != "ok":
        return Rejection(SANDBOX_STATUS_REASONS.get(result.status, "does_not_run"), f"sandbox: {result.status}")
    if result.exit_code not in (0, None):  # the error's own line, not the harness's frames above it
        last = result.output.strip().splitlines()[-1:] or [f"exit code {result.exit_code}"]
        return Rejection("does_not_run", last[0][-300:])
    return outputs_of(result.output, marker, len(inputs), rules.max_output_chars)


def validate(
    sandboxes: tuple[Sandbox, Sandbox],
    proposal: Proposal | Rejection,
    seen: set[str],
    rules: ProposalRules = ProposalRules(),
) -> Validated:
    """Run a parsed proposal twice, once on each of two sandbox servers; valid tasks' keys join `seen` (a later
    copy is a duplicate). Two servers, because runs on one server fork from one process and share its hash
    seed: a program whose output hangs on set or dict order would look deterministic there, and give another
    output on the server that later checks a solver against it."""
    if isinstance(proposal, Rejection):
        return Validated("", None, proposal)
    key = task_key(proposal)
    if key in seen:
        return Validated(key, None, Rejection("duplicate", "the same program and inputs were proposed before"))
    first = run_calls(sandboxes[0], proposal.program, proposal.inputs, rules)
    if isinstance(first, Rejection):
        return Validated(key, None, first)
    second = run_calls(sandboxes[1], proposal.program, proposal.inputs, rules)
    if isinstance(second, Rejection) or second != first:
        return Validated(key, None, Rejection("not_deterministic", "two runs gave different outputs"))
    seen.add(key)
    shown = max(1, len(proposal.inputs) // 2) if proposal.task_type == "induction" else 1
    return Validated(key, CodeTask(proposal.task_type, proposal.program, proposal.inputs, first, shown), None)


def validate_all(
    proposals: Iterable[Proposal | Rejection],
    seen: set[str],
    rules: ProposalRules = ProposalRules(),
    sandboxes: tuple[Sandbox, Sandbox] | None = None,
) -> list[Validated]:
    """Each proposal validated in order (a repeat within the batch is a duplicate too)."""
    own = sandboxes is None
    sandboxes = sandboxes or (Sandbox(0, PROPOSAL_LIMITS), Sandbox(1, PROPOSAL_LIMITS))
    try:
        return [validate(sandboxes, proposal, seen, rules) for proposal in proposals]
    finally:
        if own:
            for sandbox in sandboxes:
                sandbox.close()


def judge_answer(
    sandbox: Sandbox, task: CodeTask, answer: str | None, rules: ProposalRules = ProposalRules()
) -> tuple[bool, str | None]:
    """Whether a solver's answer (the text of its last block) solves the task, and why not.

    deduction: the answer is a literal equal to the output (compared here, nothing run); abduction: the
    program, run in the sandbox on the answered arguments, gives the shown output; induction: the answered
    program, run in the sandbox on the held-out inputs, gives their outputs (which never enter the sandbox).
    """
    if answer is None:
        return False, "no answer block"
    if task.task_type == "deduction":
        value = canonical_literal(answer, rules.max_output_chars)
        if value is None:
            return False, "the answer is not a literal"
        return value == task.outputs[0], None if value == task.outputs[0] else "wrong output"
    if task.task_type == "abduction":
        arguments = literal_arguments(answer, rules.max_input_chars)
        if arguments is None:
            return False, "the answer is not an argument list of literals"
        outputs = run_calls(sandbox, task.program, (repr(arguments),), rules)
    else:
        held_out = task.inputs[task.shown :]
        outputs = run_calls(sandbox, answer, held_out, rules)
        if not isinstance(outputs, Rejection):
            return outputs == task.outputs[task.shown :], None if outputs == task.outputs[
                task.shown :
            ] else "wrong on held-out pairs"
    if isinstance(outputs, Rejection):
        return False, f"{outputs.reason}: {outputs.detail}"[:300]
    return outputs[0] == task.outputs[0], None if outputs[0] == task.outputs[0] else "wrong output"
