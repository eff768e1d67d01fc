"""File- and project-level code problems: a workspace the candidate writes files into, and a unittest
suite run against it in the sandbox.

A problem is one YAML file (see `problems/file/*.yaml`, `problems/project/*.yaml`):

    id: lru-cache                  # unique, kebab-case
    level: file                    # file (one module) or project (several files, integration tests)
    difficulty: 2                  # 1-4, the bank's level
    topic: caches                  # data-structures, parsers, caches, iterators, state-machines, ...
    statement: |                   # what the policy sees: the task, the file(s) to write, the public API
    files: [lru.py]                # the files the candidate writes (paths relative to the workspace)
    given: {}                      # files already in the workspace (project level), path -> text
    reference: {lru.py: "..."}     # a solution that passes every test
    wrong:                         # plausible wrong solutions; each fails at least one test
      - {why: "...", files: {lru.py: "..."}}
    tests: {test_lru.py: "..."}    # unittest modules; the candidate never sees them
    perf:                          # optional (project level): tests timed against the reference's
      tests: [perf_lru.py]         #   test files (also under `tests`) whose time is budgeted
      budget: 3.0                  #   at most this many times the reference's time in the same run

Pure data and parsing: nothing here runs code.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

LEVELS = ("file", "project")
PROBLEMS_DIR = Path(__file__).parent / "problems"
_ID = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_PATH = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$")


class ProblemError(ValueError):
    """A problem file that cannot be used: names the file and the field."""

    def __init__(self, path: str | Path, field_: str, reason: str):
        super().__init__(f"{path}: {field_}: {reason}")
        self.path, self.field, self.reason = str(path), field_, reason


@dataclass(frozen=True)
class Wrong:
    why: str
    files: dict[str, str]


@dataclass(frozen=True)
class Perf:
    tests: list[str]
    budget: float


@dataclass(frozen=True)
class WorkspaceProblem:
    id: str
    level: str
    difficulty: int
    topic: str
    statement: str
    files: list[str]
    reference: dict[str, str]
    tests: dict[str, str]
    wrong: list[Wrong] = field(default_factory=list)
    given: dict[str, str] = field(default_factory=dict)
    perf: Perf | None = None
    path: str = ""

    def prompt(self) -> str:
        """The statement and the answer format (fenced blocks, each headed by its path)."""
        listing = "\n".join(f"```python {name}\n...\n```" for name in self.files)
        given = "".join(
            f"\n\nThe workspace already holds `{name}`:\n```python {name}\n{text.rstrip()}\n```"
            for name, text in self.given.items()
        )
        return (
            f"{self.statement.rstrip()}{given}\n\nAnswer with the complete file"
            f"{'s' if len(self.files) > 1 else ''}, each in a fenced block headed by its path:\n{listing}"
        )

    def spec(self) -> dict[str, Any]:
        """What the verifier needs, as stored in the bank's `tests` column (JSON)."""
        return {
            "level": self.level,
            "files": self.files,
            "given": self.given,
            "tests": self.tests,
            "perf": None if self.perf is None else {"tests": self.perf.tests, "budget": self.perf.budget},
            "reference": self.reference if self.perf else None,
        }


def load_problem(path: str | Path) -> WorkspaceProblem:
    """One problem file, checked for shape (fields, paths, Python that parses); raises ProblemError."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        raise ProblemError(path, f"line {mark.line + 1}" if mark else "yaml", str(error).splitlines()[0]) from None
    if not isinstance(data, dict):
        raise ProblemError(path, "-", "not a mapping")
    known = {"id", "level", "difficulty", "topic", "statement", "files", "given", "reference", "wrong", "tests", "perf"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ProblemError(path, unknown[0], f"unknown field; known: {', '.join(sorted(known))}")
    for name in ("id", "level", "difficulty", "topic", "statement", "files", "reference", "tests"):
        if data.get(name) in (None, "", [], {}):
            raise ProblemError(path, name, "missing")
    if not _ID.match(str(data["id"])):
        raise ProblemError(path, "id", f"{data['id']!r} is not kebab-case")
    if data["level"] not in LEVELS:
        raise ProblemError(path, "level", f"{data['level']!r} is not one of {', '.join(LEVELS)}")
    if not isinstance(data["difficulty"], int) or not 1 <= data["difficulty"] <= 4:
        raise ProblemError(path, "difficulty", "must be an integer 1-4")
    files = data["files"]
    if not isinstance(files, list) or not all(isinstance(f, str) and _safe_path(f) for f in files):
        raise ProblemError(path, "files", "must be a list of relative paths")
    shadowed = sorted({name.split("/")[0].removesuffix(".py") for name in files} & sys.stdlib_module_names)
    if shadowed:
        raise ProblemError(path, "files", f"would shadow the standard library's {', '.join(shadowed)}")
    given = _file_map(path, "given", data.get("given") or {})
    reference = _file_map(path, "reference", data["reference"])
    if sorted(reference) != sorted(files):
        raise ProblemError(path, "reference", f"holds {sorted(reference)}, not the files {sorted(files)}")
    tests = _file_map(path, "tests", data["tests"])
    for name in tests:
        if name in files or name in given:
            raise ProblemError(path, f"tests.{name}", "a test file cannot also be a workspace file")
    wrong = []
    for index, entry in enumerate(data.get("wrong") or []):
        if not isinstance(entry, dict) or not entry.get("why") or not entry.get("files"):
            raise ProblemError(path, f"wrong[{index}]", "needs `why` and `files`")
        wrong_files = _file_map(path, f"wrong[{index}].files", entry["files"])
        if set(wrong_files) - set(files):
            raise ProblemError(
                path, f"wrong[{index}].files", f"writes files not in `files`: {sorted(set(wrong_files) - set(files))}"
            )
        wrong.append(Wrong(str(entry["why"]), wrong_files))
    perf = None
    if data.get("perf"):
        raw = data["perf"]
        if not isinstance(raw, dict) or not raw.get("tests") or not isinstance(raw.get("budget"), (int, float)):
            raise ProblemError(path, "perf", "needs `tests` (test file names) and a numeric `budget`")
        missing = [name for name in raw["tests"] if name not in tests]
        if missing:
            raise ProblemError(path, "perf.tests", f"not among the tests: {missing}")
        perf = Perf(list(raw["tests"]), float(raw["budget"]))
    return WorkspaceProblem(
        id=data["id"],
        level=data["level"],
        difficulty=data["difficulty"],
        topic=str(data["topic"]),
        statement=str(data["statement"]),
        files=list(files),
        reference=reference,
        tests=tests,
        wrong=wrong,
        given=given,
        perf=perf,
        path=str(path),
    )


def load_problems(level: str | None = None, folder: Path = PROBLEMS_DIR) -> list[WorkspaceProblem]:
    """Every shipped problem (of one level), sorted by id; ids must be unique."""
    levels = [level] if level else list(LEVELS)
    problems = [load_problem(p) for lvl in levels for p in sorted((folder / lvl).glob("*.yaml"))]
    seen: dict[str, str] = {}
    for problem in problems:
        if problem.id in seen:
            raise ProblemError(problem.path, "id", f"{problem.id!r} is also the id of {seen[problem.id]}")
        seen[problem.id] = problem.path
    return problems


def parse_spec(text: str | None) -> dict[str, Any] | None:
    """A workspace spec from the bank's `tests` column, or None unless it is JSON naming files and tests."""
    try:
        spec = json.loads(text or "")
    except (TypeError, ValueError):
        return None
    return spec if isinstance(spec, dict) and spec.get("files") and spec.get("tests") else None


def _safe_path(name: str) -> bool:
    return bool(_PATH.match(name)) and ".." not in name.split("/") and not name.startswith("/")


def _file_map(path: Path, field_: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ProblemError(path, field_, "must map file paths to their text")
    files = {}
    for name, text in value.items():
        if not isinstance(name, str) or not _safe_path(name):
            raise ProblemError(path, f"{field_}.{name}", "not a safe relative path")
        if not isinstance(text, str):
            raise ProblemError(path, f"{field_}.{name}", "file text must be a string")
        if name.endswith(".py"):
            try:
                ast.parse(text)
            except SyntaxError as error:
                raise ProblemError(
                    path, f"{field_}.{name}", f"does not parse: {error.msg} (line {error.lineno})"
                ) from None
        files[name] = text
    return files
