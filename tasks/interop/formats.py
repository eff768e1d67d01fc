"""Problems as each trainer's dataset rows, field for field as the trainer reads them (pure).

- **verl** (`verl/utils/dataset/rl_dataset.py`, the layout of `examples/data_preprocess/gsm8k.py`): `data_source`,
  `prompt` as chat messages, `ability`, `reward_model` {`style`, `ground_truth`}, `extra_info`; a parquet file.
- **TRL** (`GRPOTrainer`'s `train_dataset`): `prompt` (chat messages, or the text with `chat: false`), and every
  other column handed to reward functions as a keyword; a `datasets` folder (`Dataset.save_to_disk`).
- **OpenRLHF** (`openrlhf/datasets/prompts_dataset.py`): the prompt under `input` (its default `--data.input_key`)
  and the answer under `label` (pass `--data.label_key label`); JSON lines.

Each row carries the platform's `problem_id` (verl: in `extra_info`), so whatever the trainer's reward function
or reward server receives can be traced back to the bank: the lake's lineage reaches past the export.
"""

from __future__ import annotations

import json

import polars as pl

TARGETS = ("verl", "trl", "openrlhf")
NEEDED = [
    "problem_id",
    "source",
    "split",
    "domain",
    "level",
    "prompt",
    "answer",
    "tests",
    "entry_point",
    "verifier",
    "bank_version",
]
CARRIED = ["iteration", "model_version", "solve_rate"]  # a batch's problems: where and how the policy met them


def ground_truth(problem: dict) -> str:
    """What a rule-based reward compares against: the answer, or for code the tests and the entry point."""
    if problem.get("tests"):
        return json.dumps({"tests": problem["tests"], "entry_point": problem.get("entry_point")})
    return problem.get("answer") or ""


def lineage(problem: dict, index: int) -> dict:
    """The platform's ids a row carries back: problem, bank version, level, verifier (and a batch's iteration,
    model version and solve rate)."""
    return {
        "split": problem["split"],
        "index": index,
        "problem_id": problem["problem_id"],
        "bank_version": problem["bank_version"],
        "level": problem["level"],
        "verifier": problem["verifier"] or "",
        **{key: problem[key] for key in CARRIED if key in problem},
    }


def _problems(problems: pl.DataFrame):
    return enumerate(problems.select(*NEEDED, *(c for c in CARRIED if c in problems.columns)).iter_rows(named=True))


def verl_rows(problems: pl.DataFrame) -> list[dict]:
    return [
        {
            "data_source": p["source"],
            "prompt": [{"role": "user", "content": p["prompt"]}],
            "ability": p["domain"],
            "reward_model": {"style": "rule", "ground_truth": ground_truth(p)},
            "extra_info": lineage(p, i),
        }
        for i, p in _problems(problems)
    ]


def trl_rows(problems: pl.DataFrame, chat: bool = True) -> list[dict]:
    return [
        {
            "prompt": [{"role": "user", "content": p["prompt"]}] if chat else p["prompt"],
            "answer": ground_truth(p),
            "domain": p["domain"],
            "source": p["source"],
            **lineage(p, i),
        }
        for i, p in _problems(problems)
    ]


def openrlhf_rows(problems: pl.DataFrame) -> list[dict]:
    return [
        {
            "input": p["prompt"],
            "label": ground_truth(p),
            "datasource": p["source"],
            "domain": p["domain"],
            **lineage(p, i),
        }
        for i, p in _problems(problems)
    ]
