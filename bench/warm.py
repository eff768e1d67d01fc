"""A warmed-up lake that benchmarks start from: the learning config's bank, its warm-up version and that version's
held-out evaluation, made once in a work folder and copied for each run (`rlvr bench peer`, `rlvr bench async`)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pyarrow.compute as pc

from storage.lake import Lake


def warmed_lake(config: str, folder: str) -> str:
    """A lake with the bank, the warm-up version and its held-out evaluation (iteration 0)."""
    from flows.curation import curate_bank
    from flows.loop import rl_loop
    from flows.run_config import load_run_config
    from storage.config import load_yaml_config
    from tasks.curation.config import CurationConfig

    curate_bank(load_yaml_config(config, CurationConfig, section="bank").model_dump(mode="json"), folder)
    rl_loop(load_run_config(config).model_dump(mode="json"), 0, folder)
    return folder


def warmed_once(config_path: str, folder: str, console) -> str:
    """`folder`/warmed: the warmed lake, made unless a finished one is there (an interrupted one is redone)."""
    base = str(Path(folder) / "warmed")
    warmed = (
        Lake.open(base).read("iteration_metrics", filter=pc.field("iteration") == 0)
        if (Path(base) / "iteration_metrics").exists()
        else None
    )
    if warmed is None or warmed.is_empty():
        shutil.rmtree(base, ignore_errors=True)
        console.print(f"warming up once in {base} …")
        warmed_lake(config_path, base)
    return base


def copy_of(base: str, prefix: str) -> str:
    """A fresh copy of the warmed lake (its checkpoints stay where they are: the copy's registry points at them)."""
    lake_uri = tempfile.mkdtemp(prefix=prefix)
    shutil.rmtree(lake_uri)
    shutil.copytree(base, lake_uri)
    return lake_uri


def started_once() -> None:
    """What a process pays once, before either side is timed: Prefect's temporary server (a deployment has one
    running; without `PREFECT_API_URL` the first flow of a process starts it, about 10 s) and the model stack's
    imports (TRL's side builds its trainer before its timed `train()`). Else the first seed's loop carries both."""
    from prefect import flow
    from transformers import AutoModelForCausalLM  # noqa: F401

    @flow(name="bench-peer-start")
    def start() -> None:
        pass

    start()
