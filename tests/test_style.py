"""The house style as checks: `ruff check` (the rules in pyproject.toml) and `ruff format --check` pass on the
whole checkout, and commit subjects stay short enough to read in a one-line log."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import BIN, ROOT

# The commit the rule starts after: subjects before it were written without it.
RULE_FROM = "9e977f9c"


def has_commit(commit: str) -> bool:
    return (
        subprocess.run(
            ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
        ).returncode
        == 0
    )


@pytest.mark.parametrize("command", [["check", "--no-cache"], ["format", "--check", "--no-cache"]])
def test_ruff_finds_nothing(command):
    result = subprocess.run([str(BIN / "ruff"), *command, "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_commit_subjects_are_short():
    """Every commit since the rule began has a subject under 72 characters (the detail goes in the body)."""
    if not has_commit(RULE_FROM):
        pytest.skip(f"no commit {RULE_FROM} here (a source archive or a shallow clone)")
    subjects = subprocess.run(
        ["git", "-C", str(ROOT), "log", f"{RULE_FROM}..HEAD", "--format=%s"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert [subject for subject in subjects if len(subject) >= 72] == []


def test_test_folders_mirror_the_packages():
    """A test module sits in the folder of the package it tests (tests/tasks/verifiers/ for tasks/verifiers/); the
    house's own checks (architecture, style, docs, configs, the GPU check) sit at the top."""
    folders = {path.parent.relative_to(ROOT / "tests") for path in (ROOT / "tests").rglob("test_*.py")}
    assert sorted(str(folder) for folder in folders if folder != Path(".") and not (ROOT / folder).is_dir()) == []


def test_tests_that_start_processes_or_use_prefect_are_marked(tmp_path):
    """`-m prefect` and `-m subprocess` select the tests that use the Prefect server or start processes, from
    what each asks for and calls (tests/conftest.py); a test that does neither is in neither group."""
    selected = {}
    for marker in ("prefect", "subprocess"):
        result = subprocess.run(
            [
                str(BIN / "python"),
                "-m",
                "pytest",
                "--collect-only",
                "-q",
                "-p",
                "no:cacheprovider",
                "-n",
                "0",
                "-m",
                marker,
                "tests/flows/test_stages.py",
                "tests/tasks/test_self_verify.py",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        selected[marker] = {line.split("::")[1].split("[")[0] for line in result.stdout.splitlines() if "::" in line}
    assert "test_rlvr_stage_prints_what_ran_and_what_was_skipped" in selected["prefect"] & selected["subprocess"]
    assert "test_lagged_the_loop_makes_tasks_of_its_rollouts_and_draws_them_at_the_ratio" in selected["prefect"]
    in_process = {"test_the_first_wrong_step_by_hand", "test_judgement_rewards_by_hand"}
    assert not in_process & (selected["prefect"] | selected["subprocess"])
