"""Trainers' own logs into the lake, with lineage: verl's rollout dumps and TRL's logged completions.

- **verl** (`trainer.rollout_data_dir`, `ray_trainer.py::_dump_generations`): `<dir>/<step>.jsonl`, one object per
  response with `input` (the prompt, template text included), `output`, `gts` (the ground truth), `score`, `step`,
  and every key the reward function returned (the platform's `compute_score` adds `correct`, `verifier` and
  `problem_id`). Validation dumps (`trainer.validation_data_dir`) are the same files; import them as a run of
  their own (an iteration belongs to one run).
- **TRL** (`GRPOConfig(log_completions=True)`): `<output_dir>/completions/completions_<step>.parquet` with `step`,
  `prompt`, `completion` (decoded text, or chat messages), one column per reward function and `advantage`; each reward column
  becomes its own `rewards` rows (verifier = the column), the advantages an `advantages` row each (estimator
  `trl`). TRL logs the last generation batch at each logging step, under that step, so a batch may be in two files:
  rows the run already holds (the same prompt, completion and advantage) are skipped, as are rows every reward
  function skipped (all NaN: TRL's "unscorable").

Each file is one stage run whose parameters name it and its SHA-256: a file imported before is skipped, so an
import can be re-run after a failure or as new files appear. A file that cannot be read is refused before any
row is written, naming the file, line and field.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import polars as pl
import pyarrow.compute as pc

from storage.lake import Lake
from tasks.interop.bank_index import BankIndex
from tasks.interop.recording import Attempt, ExternalRun, external_problem_id
from tasks.interop.rewards import completion_text, prompt_text

VERL_KEYS = {"input": str, "output": str, "score": (int, float), "step": int}
TRL_COLUMNS = ("step", "prompt", "completion")
IMPORTED_VERSION = "trainer"  # a verdict as the trainer computed it, not re-scored here


def verl_files(folder: Path) -> list[Path]:
    files = sorted((p for p in folder.glob("*.jsonl") if p.stem.isdigit()), key=lambda p: int(p.stem))
    if not files:
        raise ValueError(f"{folder}: no verl dumps (<step>.jsonl) there")
    return files


def trl_files(output_dir: Path) -> list[Path]:
    files = sorted(
        (output_dir / "completions").glob("completions_*.parquet"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0)
    )
    if not files:
        raise ValueError(
            f"{output_dir}: no TRL completions (completions/completions_<step>.parquet; "
            "train with GRPOConfig(log_completions=True))"
        )
    return files


def read_verl(path: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error})") from None
        for key, kind in VERL_KEYS.items():
            if not isinstance(row.get(key), kind) or isinstance(row.get(key), bool):
                raise ValueError(
                    f"{path}:{number}: field `{key}` is missing or not a {getattr(kind, '__name__', 'number')}"
                )
        rows.append(row)
    return rows


def read_trl(path: Path) -> pl.DataFrame:
    frame = pl.read_parquet(path)
    missing = [column for column in TRL_COLUMNS if column not in frame.columns]
    if missing:
        raise ValueError(f"{path}: columns {missing} are missing (TRL's completions have {list(TRL_COLUMNS)})")
    return frame


def problem_id_of(bank: BankIndex, prompt: str, label: str | None, problem_id: str | None) -> str:
    if problem_id:
        return problem_id
    found = bank.match(prompt, label) if label is not None else bank.match_prompt(prompt)
    return found["problem_id"] if found else external_problem_id(prompt, label or "")


def verl_records(rows: list[dict], bank: BankIndex, model: str) -> tuple[list[Attempt], pl.DataFrame]:
    attempts = [
        Attempt(
            row["step"],
            model,
            row["input"],
            row["output"],
            problem_id_of(
                bank, row["input"], None if row.get("gts") is None else str(row["gts"]), row.get("problem_id") or None
            ),
        )
        for row in rows
    ]
    rewards = pl.DataFrame(
        [
            {
                "rollout_id": str(i),
                "verifier": str(row.get("verifier") or "verl"),
                "verifier_version": IMPORTED_VERSION,
                "reward": float(row["score"]),
                "correct": _verdict(row.get("correct", row.get("acc"))),
                "details": json.dumps({key: row[key] for key in row if key not in ("input", "output")}, default=str),
            }
            for i, row in enumerate(rows)
        ],
        schema_overrides={"correct": pl.Boolean},
    )
    return attempts, rewards


def trl_records(frame: pl.DataFrame, bank: BankIndex, model: str) -> tuple[list[Attempt], pl.DataFrame, list | None]:
    reward_columns = [
        c for c in frame.columns if c not in (*TRL_COLUMNS, "advantage", "image") and frame.schema[c].is_numeric()
    ]
    rows = frame.to_dicts()
    attempts = [
        Attempt(
            int(row["step"]),
            model,
            prompt_text(row["prompt"]),
            completion_text(row["completion"]),
            problem_id_of(bank, prompt_text(row["prompt"]), None, None),
        )
        for row in rows
    ]
    rewards = pl.DataFrame(
        [
            {
                "rollout_id": str(i),
                "verifier": column,
                "verifier_version": IMPORTED_VERSION,
                "reward": float(row[column]),
                "correct": None,
                "details": json.dumps({"imported": "trl"}),
            }
            for i, row in enumerate(rows)
            for column in reward_columns
            if row[column] is not None and not math.isnan(row[column])
        ],  # NaN: the function did not apply
        schema_overrides={"correct": pl.Boolean},
    )
    advantages = [float(a) for a in frame["advantage"]] if "advantage" in frame.columns else None
    return attempts, rewards, advantages


def _verdict(value) -> bool | None:
    return bool(value) if isinstance(value, (bool, int, float)) and not isinstance(value, str) else None


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def imported_hashes(lake: Lake, flow: str) -> set[str]:
    if not lake.exists("runs"):
        return set()
    runs = lake.read(
        "runs", filter=(pc.field("flow") == flow) & (pc.field("status") == "completed"), columns=["parameters"]
    )
    return {json.loads(p).get("sha256") for p in runs["parameters"]} - {None}


def seen_responses(lake: Lake, run: ExternalRun) -> set[tuple]:
    """(prompt, response, advantage) already stored for the run. TRL logs the last generation batch at each
    logging step, under the step it logs at, so a batch logged twice comes back with a later step: it is known by
    its rows, not by its step."""
    if not lake.exists("rollouts") or not lake.exists("advantages"):
        return set()
    mine = run.run_ids()
    stored = lake.read("rollouts", filter=pc.field("run_id").isin(mine), columns=["rollout_id", "prompt", "response"])
    advantages = lake.read("advantages", filter=pc.field("run_id").isin(mine), columns=["rollout_id", "advantage"])
    joined = stored.join(advantages, on="rollout_id")
    return {
        (prompt, response, _rounded(advantage))
        for prompt, response, advantage in joined.select("prompt", "response", "advantage").iter_rows()
    }


def _rounded(advantage: float | None) -> float | None:
    return None if advantage is None else round(float(advantage), 6)


def import_logs(lake: Lake, run: ExternalRun, kind: str, source: Path, model: str) -> list[dict]:
    """Import every file of `source` not imported before; returns one summary per file."""
    files = verl_files(source) if kind == "verl" else trl_files(source)
    parsed = [(path, read_verl(path) if kind == "verl" else read_trl(path)) for path in files]  # all read first
    done = imported_hashes(lake, run.flow)
    bank = BankIndex.of(lake)
    summaries = []
    for path, rows in parsed:
        digest = sha256(path)
        if digest in done:
            summaries.append({"file": str(path), "rollouts": 0, "status": "imported before"})
            continue
        advantages, skipped = None, 0
        if kind == "verl":
            attempts, rewards = verl_records(rows, bank, model)
        else:
            attempts, rewards, advantages = trl_records(rows, bank, model)
            seen = seen_responses(lake, run)
            scored = (
                set(rewards["rollout_id"].cast(pl.Int64).to_list()) if rewards.height else set()
            )  # else: unscorable
            fresh = [
                i
                for i, a in enumerate(attempts)
                if i in scored
                and (a.prompt, a.response, _rounded(advantages[i] if advantages is not None else None)) not in seen
            ]
            skipped = len(attempts) - len(fresh)
            if skipped:
                attempts, rewards, advantages = _subset(fresh, attempts, rewards, advantages)
        run_id = (
            run.record(attempts, rewards, {"source": str(path), "sha256": digest}, advantages) if attempts else None
        )
        summaries.append(
            {
                "file": str(path),
                "rollouts": len(attempts),
                "run_id": run_id,
                "status": "imported" + (f" ({skipped} logged before or unscorable, skipped)" if skipped else ""),
            }
        )
    return summaries


def _subset(keep: list[int], attempts: list[Attempt], rewards: pl.DataFrame, advantages: list | None):
    position = {old: new for new, old in enumerate(keep)}
    kept = rewards.filter(pl.col("rollout_id").cast(pl.Int64).is_in(keep)).with_columns(
        rollout_id=pl.col("rollout_id").cast(pl.Int64).replace_strict(position).cast(pl.String)
    )
    return [attempts[i] for i in keep], kept, None if advantages is None else [advantages[i] for i in keep]
