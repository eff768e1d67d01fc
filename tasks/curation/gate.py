"""The bank's gate: the one way into `problems`, for a curation's sources and for the problems an iteration makes
(self-play's tasks and proposer prompts, RISE's verification tasks) alike.

Rows are validated where they are made (`load.py` for a source's, `validated` here for made ones); then `admit`
runs the critical section under the lake's `bank` lease: allocate the bank version, drop exact and near-duplicates
of the bank as it stands, drop training problems that overlap an evaluation set, write the quarantined and dropped
rows and the problems; the run completes, and the lease is left, when the caller's `bank_run` ends, so the next
holder deduplicates against these problems. `refusals` is the same check without the lease or a write: the
self-play stage asks it before solving a task, so a task the bank refuses is never solved as if it had entered.

Made problems pass the gate the bank was curated with: the validation, dedup and decontamination settings of its
latest completed curation (the defaults when there is none), which each of their runs records in its parameters.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import polars as pl
import pyarrow.compute as pc
from pydantic import ValidationError

from storage.lake import Lake
from storage.leases import BANK
from storage.runs import Run
from tasks.curation.config import DecontaminationConfig, DedupConfig, ValidationConfig
from tasks.curation.filter import decontaminate, deduplicate
from tasks.curation.load import QUARANTINE_SCHEMA
from tasks.curation.stage import check_recuration, evaluation_sets, existing_bank, next_bank_version, write_bank
from tasks.curation.validate import problem_issue


@dataclass(frozen=True)
class GateSettings:
    """What the gate applies: a curation's validation, dedup and decontamination sections."""

    validation: ValidationConfig = field(default_factory=ValidationConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    decontamination: DecontaminationConfig = field(default_factory=DecontaminationConfig)
    from_run: str | None = None  # the curation run they were read from (None: the defaults)

    @classmethod
    def of(cls, config, from_run: str | None = None) -> GateSettings:
        """A `CurationConfig`'s (or any object with the three sections)."""
        return cls(config.validation, config.dedup, config.decontamination, from_run)

    def parameters(self) -> dict:
        return {
            "validation": self.validation.model_dump(mode="json"),
            "dedup": self.dedup.model_dump(mode="json"),
            "decontamination": self.decontamination.model_dump(mode="json"),
            "from_run": self.from_run,
        }


@dataclass
class Admitted:
    bank_version: int
    kept: pl.DataFrame  # the problems written
    dropped: pl.DataFrame  # left out as duplicates or contaminated (`dropped_problems`)
    quarantined: pl.DataFrame  # refused by validation (`quarantine`)
    refused: dict[str, str] = field(default_factory=dict)  # made problems: id → why it did not enter


@dataclass
class BankRun:
    """A curate run; the bank lease `admit` takes in it is left only after the run's row says how it ended."""

    lake: Lake
    run: Run
    critical: ExitStack


@contextmanager
def bank_run(lake: Lake, flow: str, parameters: dict, **fields) -> Iterator[BankRun]:
    with ExitStack() as critical:
        with lake.run(flow, "curate", parameters, **fields) as run:
            yield BankRun(lake, run, critical)


def admit(
    section: BankRun,
    candidates: pl.DataFrame,
    quarantined: pl.DataFrame,
    settings: GateSettings,
    bank_version: int | None = None,
    force: bool = False,
) -> Admitted:
    """The critical section: under the `bank` lease, the version (`bank_version` re-curated, else the next), the
    bank's duplicates and the evaluation sets' overlaps left out, and the version's slices written."""
    lake = section.lake
    section.critical.enter_context(lake.lease(BANK, wait=True))
    if bank_version is not None:
        check_recuration(lake, bank_version, force)
    section.run.bank_version = version = bank_version or next_bank_version(lake)
    kept, dropped = screen(lake, candidates, settings, version)
    write_bank(lake, section.run, version, kept, quarantined, dropped)
    return Admitted(version, kept, dropped, quarantined)


def screen(
    lake: Lake, candidates: pl.DataFrame, settings: GateSettings, bank_version: int | None = None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(kept, dropped): exact and near-duplicates of the bank's other versions (and of each other), then training
    problems that overlap an evaluation set."""
    existing = existing_bank(lake, bank_version)
    kept, duplicates = deduplicate(candidates, existing, settings.dedup)
    eval_sets = evaluation_sets(existing, kept, settings.decontamination, settings.validation)
    kept, contaminated = decontaminate(kept, eval_sets, settings.decontamination, existing)
    return kept, pl.concat([duplicates, contaminated])


def gate_settings(lake: Lake) -> GateSettings:
    """The settings of the bank's latest completed curation (a run of made problems records the ones it used)."""
    runs = lake.read(
        "runs",
        filter=(pc.field("stage") == "curate") & (pc.field("status") == "completed"),
        columns=["run_id", "parameters", "started_at"],
    )
    for run_id, text, _ in runs.sort("started_at", descending=True).iter_rows():
        parameters = json.loads(text)
        if "sources" not in parameters:
            continue
        try:
            return GateSettings(
                ValidationConfig.model_validate(parameters.get("validation", {})),
                DedupConfig.model_validate(parameters.get("dedup", {})),
                DecontaminationConfig.model_validate(parameters.get("decontamination", {})),
                run_id,
            )
        except ValidationError as error:
            raise ValueError(
                f"curate run {run_id}: its validation, dedup or decontamination settings no longer "
                f"load ({error.errors()[0]['loc']}: {error.errors()[0]['msg']})"
            ) from None
    return GateSettings()


def not_in_bank(lake: Lake, problems: pl.DataFrame) -> pl.DataFrame:
    """`problems` whose ids the bank does not hold yet (a re-run makes the same problems: they are in, not refused)."""
    ids = problems["problem_id"].unique().to_list()
    known = lake.read("problems", filter=pc.field("problem_id").isin(ids), columns=["problem_id"])["problem_id"]
    return problems.filter(~pl.col("problem_id").is_in(known.implode()))


def issues(problems: pl.DataFrame, validation: ValidationConfig) -> dict[str, tuple[str | None, str]]:
    """Problem id → (field, reason) for each made problem a source's rule (`validate.problem_issue`) refuses."""
    found = {}
    for row in problems.iter_rows(named=True):
        issue = problem_issue(row, validation.max_prompt_chars, validation.check_math_answers)
        if issue is not None:
            found[row["problem_id"]] = issue
    return found


def validated(problems: pl.DataFrame, validation: ValidationConfig) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(fit, quarantined) of made problems, the quarantined as curation's quarantine rows (the whole row as raw)."""
    found = issues(problems, validation)
    bad = problems.filter(pl.col("problem_id").is_in(list(found)))
    quarantined = [
        {
            "source": row["source"],
            "source_uri": row["source_uri"],
            "source_line": row["source_line"],
            "field": found[row["problem_id"]][0],
            "reason": found[row["problem_id"]][1],
            "raw": json.dumps(row, default=str)[:2000],
        }
        for row in bad.iter_rows(named=True)
    ]
    return (
        problems.filter(~pl.col("problem_id").is_in(list(found))),
        pl.DataFrame(quarantined, schema=QUARANTINE_SCHEMA),
    )


def refusals(lake: Lake, problems: pl.DataFrame) -> dict[str, tuple[str, str]]:
    """Problem id → (reason, detail) for each of `problems` the gate would refuse now: `quarantined` (a validation
    rule), `exact_duplicate`, `near_duplicate` or `contaminated`. No lease, no write."""
    fresh = not_in_bank(lake, problems)
    if fresh.is_empty():
        return {}
    settings = gate_settings(lake)
    found = issues(fresh, settings.validation)
    refused = {pid: ("quarantined", f"{name or 'problem'}: {reason}") for pid, (name, reason) in found.items()}
    _, dropped = screen(lake, fresh.filter(~pl.col("problem_id").is_in(list(found))), settings)
    for row in dropped.filter(pl.col("problem_id").is_in(fresh["problem_id"].implode())).iter_rows(named=True):
        refused[row["problem_id"]] = (row["reason"], drop_detail(row))
    return refused


def drop_detail(row: dict) -> str:
    if row["reason"].startswith("contaminated"):
        return f"overlaps evaluation set {row['duplicate_of']} ({row['similarity']:.0%} of its n-grams)"
    return f"{row['reason'].replace('_', ' ')} of problem {row['duplicate_of']} (similarity {row['similarity']:.2f})"


def admit_made(
    lake: Lake,
    problems: pl.DataFrame,
    flow: str,
    parameters: dict,
    *,
    iteration: int | None = None,
    prefect_flow_run_id: str | None = None,
) -> Admitted | None:
    """Problems an iteration made, through the gate as a bank version of their own: a curate run under the `bank`
    lease, as any curation, so bank versions stay one per completed curation. None when the bank holds them all."""
    fresh = not_in_bank(lake, problems.with_columns(pl.col("similarity_checks").fill_null(False)))
    if fresh.is_empty():
        return None
    settings = gate_settings(lake)
    fit, quarantined = validated(fresh, settings.validation)
    with bank_run(
        lake,
        flow,
        {**parameters, "gate": settings.parameters()},
        iteration=iteration,
        prefect_flow_run_id=prefect_flow_run_id,
    ) as section:
        admitted = admit(section, fit, quarantined, settings)
    made = set(fresh["problem_id"])  # (an old row flagged `contaminated_later` is not refused)
    admitted.refused = {pid: "quarantined" for pid in made - set(fit["problem_id"])} | {
        row["problem_id"]: drop_detail(row)
        for row in admitted.dropped.iter_rows(named=True)
        if row["problem_id"] in made
    }
    return admitted


def refused_but_drawn(admitted: Admitted | None, drawn: Iterable[str]) -> None:
    """A problem the iteration's rollouts drew must have entered the bank: the stage asks `refusals` before it
    samples, so only a curation committed in between can refuse one here; the iteration fails, and its re-run
    asks again."""
    refused = sorted(set(drawn) & set(admitted.refused)) if admitted is not None else []
    if refused:
        raise ValueError(
            f"{len(refused)} problem(s) this iteration sampled were refused by the bank as they were "
            f"committed (first: {refused[0]}, {admitted.refused[refused[0]]}), after the stage's check "
            "let them through: a curation committed in between; re-run the iteration"
        )
