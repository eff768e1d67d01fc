"""The house style as checks: `ruff check` (the rules in pyproject.toml) and `ruff format --check` pass on the
whole checkout, and commit subjects stay short enough to read in a one-line log."""

from __future__ import annotations

import subprocess

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
