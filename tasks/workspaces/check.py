"""`python -m tasks.workspaces.check [PATH ...] [--local]`: each problem's reference passes every test and
each wrong solution fails one, run in the sandbox (default) or, with `--local`, by bare
`python -m unittest` in a temporary folder (for authoring only: it runs the files unjailed)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from tasks.workspaces.problem import WorkspaceProblem, load_problem, load_problems
from tasks.workspaces.verifier import WorkspaceVerifier


def run_local(problem: WorkspaceProblem, files: dict[str, str]) -> tuple[bool, str]:
    """(all tests passed, output) of bare `python -m unittest` over the laid-out workspace and tests."""
    with tempfile.TemporaryDirectory(prefix="rlvr-workspace-check-") as folder:
        for name, text in {**problem.given, **files, **problem.tests}.items():
            target = Path(folder) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        modules = [name[:-3].replace("/", ".") for name in problem.tests if name.endswith(".py")]
        done = subprocess.run(
            [sys.executable, "-m", "unittest", "-q", *modules], cwd=folder, capture_output=True, text=True, timeout=120
        )
        return done.returncode == 0, (done.stdout + done.stderr)[-2000:]


_verifier = None


def run_sandboxed(problem: WorkspaceProblem, files: dict[str, str]) -> tuple[bool, str]:
    """(every test and the performance budget passed, the failures) in the sandbox, on one shared server."""
    global _verifier

    if _verifier is None:
        _verifier = WorkspaceVerifier(partial_credit="fraction")
    verdict = _verifier.run(problem.spec(), files)
    failing = [t for t in verdict.details.get("tests", []) if not t["passed"]]
    return bool(verdict.correct), "\n".join(f"{t['name']}: {t['message']}" for t in failing[:5]) or str(verdict.details)


def check(problem: WorkspaceProblem, local: bool) -> list[str]:
    """What is wrong with the problem (empty when the reference passes and every wrong solution fails)."""
    run = run_local if local else run_sandboxed
    issues = []
    passed, output = run(problem, problem.reference)
    if not passed:
        issues.append(f"reference fails:\n{output}")
    for index, wrong in enumerate(problem.wrong):
        passed, _ = run(problem, {**problem.reference, **wrong.files})
        if passed and not (local and wrong.why.startswith("slow:")):  # slow ones fail only the timed budget
            issues.append(f"wrong[{index}] ({wrong.why}) passes every test")
    if not problem.wrong:
        issues.append("no wrong solution")
    return issues


def main(argv: list[str]) -> int:
    local = "--local" in argv
    paths = [a for a in argv if a != "--local"]
    problems = [load_problem(p) for p in paths] if paths else load_problems()
    bad = 0
    for problem in problems:
        issues = check(problem, local)
        bad += bool(issues)
        print(f"{'FAIL' if issues else 'ok  '} {problem.id} ({problem.level}, {len(problem.wrong)} wrong)")
        for issue in issues:
            print("   ", issue.replace("\n", "\n    "))
    print(f"{len(problems) - bad} of {len(problems)} problems check out")
    if _verifier is not None:
        _verifier.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
