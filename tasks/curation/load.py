"""Loading one source into candidate problems and quarantined rows (no lake access here)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import polars as pl

from storage.progress import track
from tasks.curation import layouts
from tasks.curation.config import DEFAULT_LEVELS, FILE_KINDS, SourceConfig, ValidationConfig
from tasks.curation.gym import gym_domain, gym_entries
from tasks.curation.readers import read_rows
from tasks.curation.records import problem_id
from tasks.curation.validate import problem_issue
from tasks.curation.workspaces import workspace_drafts
from tasks.generators import generate
from tasks.verifiers.base import DEFAULT_VERIFIER

CANDIDATE_SCHEMA = {
    "problem_id": pl.String,
    "source": pl.String,
    "source_kind": pl.String,
    "source_uri": pl.String,
    "source_line": pl.Int64,
    "split": pl.String,
    "domain": pl.String,
    "level": pl.Int8,
    "prompt": pl.String,
    "answer": pl.String,
    "solution": pl.String,
    "steps": pl.List(pl.String),
    "tests": pl.String,
    "entry_point": pl.String,
    "verifier": pl.String,
    "seed": pl.Int64,
    "params": pl.String,
    "metadata": pl.String,
    "similarity_checks": pl.Boolean,
}
QUARANTINE_SCHEMA = {
    "source": pl.String,
    "source_uri": pl.String,
    "source_line": pl.Int64,
    "field": pl.String,
    "reason": pl.String,
    "raw": pl.String,
}


@dataclass
class LoadedSource:
    name: str
    problems: pl.DataFrame  # CANDIDATE_SCHEMA
    quarantined: pl.DataFrame  # QUARANTINE_SCHEMA


def load_source(source: SourceConfig, validation: ValidationConfig) -> LoadedSource:
    """Read or generate a source's problems, assign domain / level / verifier, validate each one."""
    if source.kind in FILE_KINDS:
        drafts, quarantined = _file_drafts(source)
    elif source.kind == "generator":
        drafts, quarantined = _generator_drafts(source), []
    elif source.kind == "workspaces":
        drafts, bad = workspace_drafts(source, _base)
        quarantined = [_quarantine_row(source, line, field, reason, raw) for line, field, reason, raw in bad]
    else:
        drafts, quarantined = _gym_drafts(source), []
    _assign_range_levels(drafts)
    problems = []
    for draft in drafts:
        issue = problem_issue(draft, validation.max_prompt_chars, validation.check_math_answers)
        if issue is not None:
            quarantined.append(
                _quarantine_row(source, draft["source_line"], issue[0], issue[1], draft.pop("_raw", None))
            )
            continue
        draft.pop("_raw", None)
        draft["problem_id"] = problem_id(
            draft["split"], draft["domain"], draft["prompt"], draft.get("answer"), draft.get("tests")
        )
        draft["metadata"] = json.dumps(draft.get("metadata") or {}, ensure_ascii=False, default=str)
        draft["params"] = json.dumps(draft.get("params") or {}, sort_keys=True, default=str)
        problems.append(draft)
    return LoadedSource(
        name=source.source_name,
        problems=pl.DataFrame(problems, schema=CANDIDATE_SCHEMA, strict=False),
        quarantined=pl.DataFrame(quarantined, schema=QUARANTINE_SCHEMA),
    )


def _base(source: SourceConfig, domain: str, level: int | None, uri: str, line: int | None) -> dict[str, Any]:
    domain = source.domain or domain
    return {
        "source": source.source_name,
        "source_kind": source.kind,
        "source_uri": uri,
        "source_line": line,
        "split": source.split,
        "domain": domain,
        "level": level,
        "verifier": source.verifier or DEFAULT_VERIFIER[domain],
        "similarity_checks": source.wants_similarity_checks,
    }


def _file_drafts(source: SourceConfig) -> tuple[list[dict], list[dict]]:
    drafts, quarantined = [], []
    level = source.level if source.level is not None else DEFAULT_LEVELS[source.kind]
    for row in track(read_rows(source.path, source.count), f"reading {source.source_name}"):
        if row.record is None:
            quarantined.append(_quarantine_row(source, row.line, None, row.error, row.raw))
            continue
        try:
            fields = (
                layouts.mapped(row.record, source.columns)
                if source.kind == "mapped"
                else layouts.LAYOUTS[source.kind](row.record)
            )
            row_level = _level_from_field(source, row.record) if source.level_field else level
        except layouts.Rejected as rejected:
            quarantined.append(
                _quarantine_row(source, row.line, rejected.field, rejected.reason, row.raw or row.record)
            )
            continue
        draft = _base(
            source,
            layouts.DOMAIN_OF_LAYOUT[source.kind],
            row_level if isinstance(row_level, int) else None,
            source.path,
            row.line,
        )
        draft.update(fields)
        draft["_raw"] = row.raw or row.record
        draft["_level_range"] = row_level if isinstance(row_level, tuple) else None
        drafts.append(draft)
    return drafts, quarantined


def _level_from_field(source: SourceConfig, record: dict[str, Any]) -> int:
    value = record.get(source.level_field)
    if value is None:
        raise layouts.Rejected(source.level_field, f"missing level field {source.level_field}")
    key = str(value)
    if key in source.level_map:
        return source.level_map[key]
    if key.isdigit() and 1 <= int(key) <= 4 and not source.level_map:
        return int(key)
    raise layouts.Rejected(source.level_field, f"level value {key!r} is not in level_map")


def _assign_range_levels(drafts: list[dict]) -> None:
    """A level range [lo, hi] is split by prompt length within the source: longer problems rank harder."""
    ranged = [d for d in drafts if d.get("_level_range")]
    if ranged:
        low, high = ranged[0]["_level_range"]
        ranked = sorted(ranged, key=lambda d: (len(d["prompt"]), d["prompt"]))
        for rank, draft in enumerate(ranked):
            draft["level"] = low + rank * (high - low + 1) // len(ranked)
    for draft in drafts:
        draft.pop("_level_range", None)


def _generator_drafts(source: SourceConfig) -> list[dict]:
    drafts = []
    problems = generate(source.generator, source.procedural_count, source.seed)
    for generator, seed, made in track(problems, f"generating {source.source_name}", source.procedural_count):
        draft = _base(
            source,
            generator.domain,
            source.level if isinstance(source.level, int) else generator.level,
            generator.name,
            None,
        )
        draft.update(
            prompt=made.prompt,
            answer=made.answer,
            solution=made.solution,
            steps=made.steps,
            seed=seed,
            params={
                "generator": generator.name,
                "selector": source.generator,
                "source_seed": source.seed,
                **made.params,
            },
        )
        if generator.verifier is not None and source.verifier is None:
            draft["verifier"] = generator.verifier
        drafts.append(draft)
    return drafts


def _gym_drafts(source: SourceConfig) -> list[dict]:
    domain = gym_domain(source.dataset) if source.domain is None else source.domain
    level = source.level if isinstance(source.level, int) else DEFAULT_LEVELS["gym"]
    drafts = []
    for entry in gym_entries(source.dataset, source.params, source.procedural_count, source.seed):
        draft = _base(source, domain, level, f"reasoning_gym:{source.dataset}", None)
        draft.update(entry, seed=source.seed, verifier=source.verifier or "gym")
        drafts.append(draft)
    return drafts


def _quarantine_row(source: SourceConfig, line: int | None, field: str | None, reason: str, raw: Any) -> dict:
    text = raw if isinstance(raw, str) or raw is None else json.dumps(raw, ensure_ascii=False, default=str)
    return {
        "source": source.source_name,
        "source_uri": source.path or source.source_name,
        "source_line": line,
        "field": field,
        "reason": reason,
        "raw": None if text is None else text[:2000],
    }
