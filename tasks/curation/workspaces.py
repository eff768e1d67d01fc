"""File- and project-level code problems (tasks/workspaces) as bank drafts: the prompt names the files to
write, `tests` holds the workspace spec (JSON), `solution` the reference files (JSON), and
`metadata.code_level` the granularity (file or project; HumanEval-style problems are `function`)."""

from __future__ import annotations

import json
from pathlib import Path

from tasks.curation.config import SourceConfig
from tasks.workspaces.generate import WORKSPACE_GENERATORS, generate_problems
from tasks.workspaces.problem import LEVELS, PROBLEMS_DIR, ProblemError, load_problem


def workspace_drafts(source: SourceConfig, base) -> tuple[list[dict], list[tuple]]:
    """One draft per problem file under the source's folder (or the shipped problems), sorted by path, or per
    generated problem (`generator: bounded_buffer`, `count`, `seed`); and
    (line, field, reason, raw) for each file that cannot be used (its line: its rank in that order)."""
    folder = Path(source.path) if source.path else PROBLEMS_DIR
    levels = [source.code_level] if source.code_level else list(LEVELS)
    paths = sorted(p for level in levels for p in (folder / level).glob("*.yaml"))
    if not paths and source.path:  # a flat folder of problems
        paths = sorted(folder.glob("*.yaml"))
    drafts, bad, problems = [], [], []
    if source.generator in WORKSPACE_GENERATORS:
        problems = [
            (seed, problem, None)
            for seed, problem in generate_problems(source.generator, source.procedural_count, source.seed)
        ]
    for line, path in enumerate([] if problems else paths[: source.count] if source.count else paths, start=1):
        try:
            problems.append((None, load_problem(path), line))
        except ProblemError as error:
            bad.append((line, error.field, f"{path.name}: {error.reason}", {"path": str(path)}))
    for seed, problem, line in problems:
        if source.code_level and problem.level != source.code_level:
            continue
        draft = base(
            source, "code", source.level if isinstance(source.level, int) else problem.difficulty, problem.path, line
        )
        draft["seed"] = seed
        draft.update(
            prompt=problem.prompt(),
            answer=None,
            solution=json.dumps(problem.reference, sort_keys=True),
            tests=json.dumps(problem.spec(), sort_keys=True),
            entry_point=None,
            verifier=source.verifier or "workspace",
            metadata={
                "code_level": problem.level,
                "topic": problem.topic,
                "workspace_problem": problem.id,
                "files": problem.files,
            },
        )
        drafts.append(draft)
    return drafts, bad
