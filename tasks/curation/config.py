"""Typed configuration of the curation stage (loaded from `configs/bank.yaml` and friends)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from storage.config import Strict

FILE_KINDS = ("gsm8k", "math", "olympiad", "humaneval", "mapped")
# A self-play task's source_uri begins so (`proposal:<id>`): text a model wrote, checked for near-duplicates and
# contamination like a file's rows, in the bank as when it enters it.
PROPOSAL_URI = "proposal:"
MAPPABLE_FIELDS = {"prompt", "answer", "solution", "tests", "entry_point"}
PROCEDURAL_KINDS = ("generator", "gym")
SourceKind = Literal["gsm8k", "math", "olympiad", "humaneval", "mapped", "generator", "gym", "workspaces"]

# Default difficulty per layout when a source says nothing: GSM8K is grade school, MATH spans 2-3
# (split by prompt length within the source), olympiad problems are the hardest.
DEFAULT_LEVELS: dict[str, int | tuple[int, int]] = {
    "gsm8k": 1,
    "math": (2, 3),
    "olympiad": 4,
    "humaneval": 2,
    "mapped": 2,
    "gym": 2,
}
# Quick-use aliases for `--source KIND:PATH`: the layout plus the level the table gives them.
KIND_ALIASES: dict[str, tuple[str, int | None]] = {
    "aime": ("math", 3),
    "amc": ("math", 3),
    "hmmt": ("math", 4),
    "minerva": ("math", 3),
    "gen": ("generator", None),
}


class SourceConfig(Strict):
    """One problem source: a file in a known layout, a reasoning-gym dataset, or our generators."""

    kind: SourceKind = Field(
        description="layout of a file (gsm8k, math, olympiad, humaneval, mapped), generator / gym, "
        "or workspaces (file- and project-level code problems, YAML)"
    )
    path: str | None = Field(
        None,
        description="JSONL or Parquet file (local or s3://) for file kinds; workspaces: a "
        "folder of problem YAML files (default: the shipped ones)",
    )
    code_level: Literal["file", "project"] | None = Field(None, description="workspaces kind: only this level")
    name: str | None = Field(None, description="source name stored with each problem; derived from the path if unset")
    count: int | None = Field(
        None, ge=1, description="files: read at most this many rows; procedural: how many to make"
    )
    split: Literal["train", "eval"] = Field(
        "train", description="eval sets are kept out of training mixes and decontaminated against"
    )
    level: int | tuple[int, int] | None = Field(
        None, description="level 1-4, or [lo, hi] split by prompt length; default per kind"
    )
    level_field: str | None = Field(None, description="take the level from this field of each row (through level_map)")
    level_map: dict[str, int] = Field(default_factory=dict, description="values of level_field to levels 1-4")
    domain: Literal["math", "code", "logic", "qa"] | None = Field(
        None, description="override the domain the kind implies"
    )
    verifier: str | None = Field(None, description="override the verifier the domain implies")
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="mapped kind: problem field -> column (prompt, answer, solution, tests, entry_point)",
    )
    generator: str = Field(
        "mix",
        description="generator kind: mix, level1..level4 or one family name; workspaces "
        "kind: a workspace family (bounded_buffer) instead of the problem files",
    )
    dataset: str | None = Field(None, description="gym kind: the reasoning-gym dataset name")
    params: dict[str, Any] = Field(default_factory=dict, description="gym kind: the dataset's difficulty parameters")
    seed: int = Field(0, description="seed of a procedural source; each problem records its own derived seed")
    similarity_checks: bool | None = Field(
        None,
        description="near-duplicate and n-gram contamination checks; default yes "
        "for files and hand-written workspaces, no for procedural sources, whose "
        "templated problems differ "
        "only in their numbers (exact duplicates are dropped either way)",
    )

    @field_validator("level")
    @classmethod
    def _level_range(cls, level):
        """`level`: 1 to 4, or a range `[lo, hi]` within them."""
        values = level if isinstance(level, tuple) else (level,)
        if level is not None and not all(1 <= v <= 4 for v in values):
            raise ValueError("levels are 1 to 4")
        return level

    @field_validator("columns")
    @classmethod
    def _mappable(cls, columns):
        """`columns` maps only prompt, answer, solution, tests and entry_point (levels come from `level_field`,
        domains from `domain`)."""
        unknown = set(columns) - MAPPABLE_FIELDS
        if unknown:
            raise ValueError(
                f"columns can map only {sorted(MAPPABLE_FIELDS)}, not {sorted(unknown)} "
                "(levels come from level_field, domains from domain)"
            )
        return columns

    @model_validator(mode="after")
    def _kind_fields(self):
        """A file kind (gsm8k, math, olympiad, humaneval, mapped) needs `path`; `mapped` needs `columns.prompt`;
        `gym` needs `dataset`; a procedural source (generator, gym) takes one `level`, not a range."""
        if self.kind in FILE_KINDS and not self.path:
            raise ValueError(f"a {self.kind} source needs a path")
        if self.kind == "mapped" and "prompt" not in self.columns:
            raise ValueError("a mapped source needs columns.prompt")
        if self.kind == "gym" and not self.dataset:
            raise ValueError("a gym source needs dataset: <reasoning-gym name>")
        if self.kind in PROCEDURAL_KINDS and isinstance(self.level, tuple):
            raise ValueError("a level range [lo, hi] splits a file by prompt length; give procedural sources one level")
        return self

    @property
    def source_name(self) -> str:
        if self.name:
            return self.name
        if self.kind == "generator":
            return f"gen:{self.generator}"
        if self.kind == "gym":
            return f"gym:{self.dataset}"
        if self.kind == "workspaces" and not self.path:
            return f"workspaces:{self.code_level or 'all'}"
        path = Path(self.path)
        return f"{path.parent.name}-{path.stem}" if path.parent.name else path.stem

    @property
    def wants_similarity_checks(self) -> bool:
        if self.similarity_checks is not None:
            return self.similarity_checks
        return self.kind in FILE_KINDS or (self.kind == "workspaces" and self.generator == "mix")  # hand-written

    @property
    def procedural_count(self) -> int:
        return self.count or 1000


class DedupConfig(Strict):
    exact: bool = Field(True, description="drop problems whose normalised text equals an earlier one")
    near: bool = Field(True, description="drop near-duplicates found by MinHash LSH over word n-grams")
    threshold: float = Field(
        0.8, gt=0, le=1, description="estimated Jaccard similarity at which two problems are near-duplicates"
    )
    ngram: int = Field(5, ge=1, le=20, description="words per shingle; larger is stricter")
    num_perm: int = Field(128, ge=16, le=512, description="MinHash permutations; more is more precise and slower")


class DecontaminationConfig(Strict):
    enabled: bool = Field(True, description="drop training problems that overlap an evaluation set")
    against: list[str] | None = Field(
        None, description="eval source names to check against; default every eval source in the bank"
    )
    files: list[SourceConfig] = Field(default_factory=list, description="extra evaluation files, read but not stored")
    ngram: int = Field(10, ge=3, le=50, description="words per n-gram")
    min_overlap: float = Field(
        0.5, gt=0, le=1, description="share of a problem's n-grams found in an eval set that marks it contaminated"
    )


class ValidationConfig(Strict):
    max_prompt_chars: int = Field(20_000, ge=100, description="longer prompts are quarantined")
    check_math_answers: bool = Field(True, description="quarantine math answers that cannot be parsed")
    run_code_solutions: bool = Field(
        True,
        description="run each code problem's reference solution against its "
        "tests in the sandbox; quarantine the problem if it fails",
    )


class CurationConfig(Strict):
    """The whole curation stage: sources, validation, deduplication, decontamination."""

    bank_version: int | None = Field(
        None, ge=1, description="re-curate this version (replacing it); default: a new version"
    )
    sources: list[SourceConfig] = Field(min_length=1, description="where problems come from")
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    decontamination: DecontaminationConfig = Field(default_factory=DecontaminationConfig)


class MixConfig(Strict):
    """How later stages draw training prompts from the bank."""

    level_weights: dict[int, float] = Field(
        default_factory=lambda: {1: 0.20, 2: 0.45, 3: 0.30, 4: 0.05},
        description="share of each level 1-4 in a draw; renormalised",
    )
    domain_weights: dict[str, float] | None = Field(
        None, description="share of each domain within a level; default: the domain's share of the bank"
    )
    split: Literal["train", "eval"] = Field("train", description="which split to draw from")
    bank_version: int | None = Field(None, ge=1, description="draw from the bank as of this version; default latest")
    seed: int = Field(0, description="seed of the draw")
    bank_size: int | None = Field(
        None,
        ge=1,
        description="train on a fixed subset of this many training problems, drawn by the mix with `seed` and "
        "revisited epoch after epoch (the warm-up still learns from every worked solution); default: all",
    )

    @field_validator("level_weights")
    @classmethod
    def _levels(cls, weights):
        """`level_weights`: keys are levels 1-4, weights are ≥ 0 and sum to more than 0."""
        if (
            not weights
            or any(level not in (1, 2, 3, 4) or w < 0 for level, w in weights.items())
            or sum(weights.values()) <= 0
        ):
            raise ValueError("level_weights maps levels 1-4 to non-negative weights with a positive sum")
        return weights


def parse_source_spec(spec: str) -> SourceConfig:
    """`KIND:PATH_OR_NAME[:COUNT]`, e.g. `gsm8k:data/train.jsonl:500`, `gen:level2:1000`, `gym:chain_sum:200`."""
    match = re.fullmatch(r"([a-z0-9_]+):(.+?)(?::(\d+))?", spec)
    if not match:
        raise ValueError(f"--source {spec!r}: expected KIND:PATH_OR_NAME[:COUNT]")
    kind, target, count = match.group(1), match.group(2), match.group(3)
    kind, level = KIND_ALIASES.get(kind, (kind, None))
    fields: dict[str, Any] = {"kind": kind, "count": int(count) if count else None, "level": level}
    if kind == "generator":
        fields["generator"] = target
    elif kind == "gym":
        fields["dataset"] = target
    else:
        fields["path"] = target
    try:
        return SourceConfig.model_validate(fields)
    except ValidationError as error:
        raise ValueError(f"--source {spec!r}: " + "; ".join(e["msg"] for e in error.errors())) from None
