"""`rlvr export`: a bank draw or an iteration's kept batch, written as a trainer's dataset (formats.py).

A file or folder that exists is never overwritten; the export is written beside it and renamed into place
only when complete, so an interrupted export leaves nothing half-written under its name.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import polars as pl
import pyarrow.compute as pc

from storage.lake import Lake
from tasks.curation.config import MixConfig
from tasks.curation.stage import bank_problems, draw_training_mix
from tasks.interop.formats import TARGETS, openrlhf_rows, trl_rows, verl_rows


def bank_selection(lake: Lake, mix: MixConfig, n: int | None) -> pl.DataFrame:
    """The whole split of the bank (`n` None), or `n` problems drawn by the mix."""
    if n is not None:
        return draw_training_mix(lake, n, mix)
    problems = bank_problems(lake, mix.bank_version, mix.split)
    if problems.is_empty():
        raise ValueError(f"the bank at {lake.uri} holds no {mix.split} problems: run `rlvr curate` first")
    return problems.sort("problem_id")


def batch_problems(lake: Lake, iteration: int) -> pl.DataFrame:
    """The problems of iteration `iteration`'s kept groups, with that iteration, the sampling model version and
    the group's solve rate."""
    groups = lake.read(
        "groups",
        filter=(pc.field("iteration") == iteration) & pc.field("kept"),
        columns=["problem_id", "iteration", "model_version", "solve_rate"],
    )
    if groups.is_empty():
        raise ValueError(
            f'iteration {iteration} has no kept groups in {lake.uri} (see `rlvr sql "select * from filter_stats"`)'
        )
    problems = lake.read("problems", filter=pc.field("problem_id").isin(groups["problem_id"].unique().to_list()))
    return problems.unique("problem_id").join(groups.unique("problem_id"), on="problem_id").sort("problem_id")


def write_export(problems: pl.DataFrame, target: str, out: Path, chat: bool = True) -> Path:
    """Write `problems` as `target`'s dataset at `out` (verl: a .parquet file, trl: a folder, openrlhf: a .jsonl
    file); refuses an `out` that exists."""
    if target not in TARGETS:
        raise ValueError(f"--to {target}: one of {', '.join(TARGETS)}")
    suffix = {"verl": ".parquet", "openrlhf": ".jsonl", "trl": ""}[target]
    if suffix and out.suffix != suffix:
        raise ValueError(f"{out}: a {target} export is a {suffix} file")
    if out.exists():
        raise ValueError(f"{out} exists: nothing is overwritten, choose another path or remove it")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        if target == "verl":
            pl.DataFrame(verl_rows(problems)).write_parquet(partial)
        elif target == "openrlhf":
            partial.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in openrlhf_rows(problems)))
        else:
            try:
                from datasets import Dataset
            except ImportError:
                raise ValueError(
                    "a TRL export is a `datasets` folder: install the trl extra (pip install -e '.[trl]')"
                ) from None
            Dataset.from_list(trl_rows(problems, chat)).save_to_disk(str(partial))
        partial.rename(out)
    finally:
        if partial.is_dir():
            shutil.rmtree(partial, ignore_errors=True)
        elif partial.exists():
            partial.unlink()
    return out
