"""Code answers: the program runs in the sandbox against the problem's tests.

Rewards by `partial_credit` (tasks/verifiers/credit.py): `fraction` (tests passed / tests), `half` (all
pass 1, some pass 0.5, none 0) or `all_pass` (1 or 0).
The response may be a bare function or a markdown code block; a completion that only holds the
function body is appended to the prompt, HumanEval style.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tasks.sandbox.client import Sandbox
from tasks.sandbox.limits import SandboxLimits
from tasks.verifiers.base import Verdict, failed, register
from tasks.verifiers.credit import credit, credit_rule

CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_program(response: str, prompt: str, entry_point: str) -> str:
    """The last fenced code block (or the whole response); prefixed by the prompt when it does not
    define the entry point itself."""
    blocks = CODE_BLOCK.findall(response)
    code = blocks[-1] if blocks else response
    if re.search(rf"^\s*(async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        return code
    return prompt + code


@dataclass
class SandboxedVerifier:
    """What the test-running verifiers share: a partial-credit rule, limits, and a sandbox started on first use."""

    partial_credit: str = "fraction"  # fraction | half | all_pass (credit.py)
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    _sandbox: Sandbox | None = field(default=None, repr=False)
    runs_code = True  # model-generated code: only in the sandbox (see engine._isolation_checked)

    def __post_init__(self) -> None:
        self.partial_credit = credit_rule(self.partial_credit)
        if isinstance(self.limits, dict):
            self.limits = SandboxLimits(**self.limits)

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = Sandbox(limits=self.limits)
        return self._sandbox

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()


@register("code")
@dataclass
class CodeVerifier(SandboxedVerifier):
    name: str = "code"
    version: str = "1.1"  # 1.1: per-test deadlines, whole-run budgets, the candidate's own namespaces

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:
        tests, entry_point = problem.get("tests"), problem.get("entry_point")
        if not tests or not entry_point:
            return Verdict(0.0, None, {"reason": "problem has no tests or entry point"})
        prompt = problem.get("prompt") or ""
        program = extract_program(response, prompt, entry_point)
        result = self.sandbox.run_tests(
            program, tests, entry_point, prompt, stop_after_failure=self.partial_credit == "all_pass"
        )
        details = {
            "tests_passed": result.passed,
            "tests_total": result.total,
            "status": result.status,
            "failures": result.failures,
            "seconds": result.seconds,
            "isolation": self.sandbox.description,
        }
        if result.status not in ("ok", "incomplete"):
            return failed(f"sandbox: {result.status}", **details)
        all_passed = result.all_passed
        return Verdict(
            self.reward(result.passed, result.total),
            all_passed,
            {**details, "reason": None if all_passed else "tests failed"},
        )

    def reward(self, passed: int, total: int) -> float:
        return credit(passed, total, self.partial_credit)
