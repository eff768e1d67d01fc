"""File- and project-level code: the candidate's files laid out in a sandboxed workspace, the problem's
unittest modules run against it from another process (tasks/sandbox/remote.py, suite.py).

The problem's `tests` column holds the workspace spec (JSON, tasks/workspaces/problem.py `spec()`):
the files to write, the given files, the test modules and an optional performance budget. Reward by
`partial_credit` (credit.py) over the tests (the performance budget counts as one more test);
`details.tests` lists each test's name, result and message, so SQL can ask which tests fail most.
A candidate that leaves processes running after the tests scores 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tasks.sandbox.client import SandboxResult
from tasks.sandbox.limits import SandboxLimits
from tasks.verifiers.base import Verdict, failed, register
from tasks.verifiers.code import SandboxedVerifier
from tasks.verifiers.credit import credit
from tasks.workspaces.answer import extract_files
from tasks.workspaces.problem import parse_spec

PERF_TEST = "perf::budget"
# A suite constructs objects and runs thread tests through a process boundary: more time than a function's tests.
WORKSPACE_LIMITS = SandboxLimits(test_seconds=5.0, wall_seconds=30.0, cpu_seconds=20)


@register("workspace")
@dataclass
class WorkspaceVerifier(SandboxedVerifier):
    limits: SandboxLimits = WORKSPACE_LIMITS
    name: str = "workspace"
    version: str = "1.0"

    def verify(self, problem: Mapping[str, Any], response: str) -> Verdict:
        spec = parse_spec(problem.get("tests"))
        if spec is None:
            return Verdict(0.0, None, {"reason": "problem has no workspace spec"})
        files, missing = extract_files(response, spec["files"])
        if missing:
            return failed(f"missing file{'s' if len(missing) > 1 else ''}: {', '.join(missing)}", missing=missing)
        return self.run(spec, files)

    def run(self, spec: Mapping[str, Any], files: dict[str, str]) -> Verdict:
        """Score `files` (path -> text) against the spec's tests, and its performance budget if any."""
        workspace = {**spec.get("given", {}), **files}
        perf = spec.get("perf")
        functional = [name for name in spec["tests"] if not perf or name not in perf["tests"]]
        result = self.sandbox.run_suite(
            workspace, spec["tests"], only=functional, stop_after_failure=self.partial_credit == "all_pass"
        )
        tests = list(result.tests)
        details: dict[str, Any] = {
            "status": result.status,
            "isolation": self.sandbox.description,
            "seconds": result.seconds,
            "leftover_processes": result.leftover_processes,
        }
        if perf and result.status in ("ok", "incomplete"):
            tests.append(self._budget(spec, workspace, perf, details))
        passed = sum(1 for test in tests if test["passed"])
        total = max(len(tests), result.total + (1 if perf else 0))
        details.update(
            tests_passed=passed,
            tests_total=total,
            tests=tests,
            failures=[f"{t['name']}: {t['message']}" for t in tests if not t["passed"]][:3],
        )
        if result.status not in ("ok", "incomplete"):
            return failed(f"sandbox: {result.status}", **details)
        if result.leftover_processes:
            return failed(f"left {result.leftover_processes} process(es) running after the tests", **details)
        all_passed = passed == total
        return Verdict(
            credit(passed, total, self.partial_credit),
            all_passed,
            {**details, "reason": None if all_passed else "tests failed"},
        )

    def _budget(
        self, spec: Mapping[str, Any], workspace: dict[str, str], perf: Mapping[str, Any], details: dict[str, Any]
    ) -> dict:
        """The performance tests on the reference (the quicker of two runs), then on the candidate (again once if
        it is over budget, the quicker counting), on the same sandbox server: the candidate's time within
        `budget` times the reference's, and its performance tests passed."""
        reference = {**spec.get("given", {}), **(spec.get("reference") or {})}
        runs = [self.sandbox.run_suite(reference, spec["tests"], only=perf["tests"]) for _ in range(2)]
        baseline = min(runs, key=_seconds)  # the quicker of two: load on the host only slows
        timed = self.sandbox.run_suite(workspace, spec["tests"], only=perf["tests"])
        reference_seconds, seconds = _seconds(baseline), _seconds(timed)
        if timed.all_passed and seconds > perf["budget"] * max(reference_seconds, 0.005):
            again = self.sandbox.run_suite(workspace, spec["tests"], only=perf["tests"])  # the benefit of the doubt
            if again.all_passed and _seconds(again) < seconds:
                timed, seconds = again, _seconds(again)
        details["perf"] = {"reference_seconds": reference_seconds, "seconds": seconds, "budget": perf["budget"]}
        if not baseline.all_passed:
            return {"name": PERF_TEST, "passed": False, "message": "the reference failed its performance tests"}
        if not timed.all_passed:
            return {"name": PERF_TEST, "passed": False, "message": "performance tests failed"}
        within = seconds <= perf["budget"] * max(reference_seconds, 0.005)
        return {
            "name": PERF_TEST,
            "passed": within,
            "message": ""
            if within
            else f"{seconds:.3f} s, over {perf['budget']:g} x the reference's {reference_seconds:.3f} s",
        }


def _seconds(result: SandboxResult) -> float:
    return round(sum(test.get("seconds", 0.0) for test in result.tests), 4)
