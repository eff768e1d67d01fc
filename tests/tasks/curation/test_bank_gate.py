"""The bank's gate (tasks/curation/gate.py) for problems an iteration makes: a self-play task that near-duplicates a
bank problem, or copies an evaluation problem, is refused and recorded as curation records what it leaves out; the
gate applies the settings the bank was curated with; the self-play stage asks the gate before solving, so a refused
task is an invalid proposal that is never solved; and a problem refused after it was sampled fails the iteration."""

import json

import polars as pl
import pytest
from helpers import Replay

from flows.iteration import bank_added
from storage.lake import Lake
from storage.lineage import problem_lineage
from tasks.curation.config import CurationConfig
from tasks.curation.gate import Admitted, GateSettings, admit, bank_run, refusals, refused_but_drawn
from tasks.curation.load import load_source
from tasks.proposals.documents import challenge_text
from tasks.selfplay.rows import problem_rows, selfplay_problem

STORY = (
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her "
    "friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. "
    "How much in dollars does she make every day at the farmers' market?"
)
SOLUTION = "Janet sells 16 - 3 - 4 = 9 duck eggs a day. She makes 9 * 2 = $18 every day at the farmers' market."
ROBE = (
    "A robe takes 2 bolts of blue fiber and half that much white fiber. The tailor makes seven robes for the "
    "winter fair and keeps one for himself. How many bolts in total does it take to make all of the robes?"
)


def curated(lake: Lake, config: dict) -> Admitted:
    """A curation through the gate, as `flows.curation.curate_bank` runs it (without Prefect)."""
    curation = CurationConfig.model_validate(config)
    with bank_run(lake, "curate-bank", curation.model_dump(mode="json")) as section:
        loaded = [load_source(source, curation.validation) for source in curation.sources]
        return admit(
            section,
            pl.concat([s.problems for s in loaded]),
            pl.concat([s.quarantined for s in loaded]),
            GateSettings.of(curation),
        )


@pytest.fixture
def bank(tmp_path):
    train, held_out = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text(json.dumps({"question": STORY, "answer": f"{SOLUTION}\n#### 18"}) + "\n")
    held_out.write_text(json.dumps({"question": ROBE, "answer": "7 * 3 = 21\n#### 21"}) + "\n")
    return {
        "sources": [
            {"kind": "gsm8k", "path": str(train), "name": "toy-train"},
            {"kind": "gsm8k", "path": str(held_out), "name": "toy-test", "split": "eval"},
        ]
    }


def question(text: str, proposal: str, answer: str = "18") -> dict:
    return selfplay_problem(
        text,
        answer,
        "qa",
        "self-play",
        f"proposal:{proposal}",
        2,
        {"task_type": "grounded"},
        {"proposal_id": proposal},
        domain="qa",
    )


def test_a_generated_near_duplicate_and_a_copy_of_an_eval_problem_are_refused_and_recorded(tmp_path, bank):
    lake = Lake.open(str(tmp_path / "lake"))
    curated(lake, bank)
    file_problem = lake.read("problems").filter(pl.col("split") == "train")["problem_id"][0]
    made = problem_rows(
        [
            question(STORY + " Give a number.", "p-near"),  # the bank's, reworded
            question(ROBE, "p-copied", "21"),  # the evaluation set's
            question("How much does Janet make a day at the market?", "p-new"),
        ]
    )
    ids = dict(zip(["near", "copied", "new"], made["problem_id"]))
    assert bank_added(lake, made, 1, "self-play problems") == 2
    assert set(lake.read("problems")["problem_id"]) >= {ids["new"]}
    assert not set(lake.read("problems")["problem_id"]) & {ids["near"], ids["copied"]}
    dropped = {row["problem_id"]: row for row in lake.read("dropped_problems").iter_rows(named=True)}
    assert (dropped[ids["near"]]["reason"], dropped[ids["near"]]["duplicate_of"]) == ("near_duplicate", file_problem)
    assert (dropped[ids["copied"]]["reason"], dropped[ids["copied"]]["duplicate_of"]) == ("contaminated", "toy-test")
    assert {row["bank_version"] for row in dropped.values()} == {2}
    runs = {row["bank_version"]: row for row in lake.read("runs").iter_rows(named=True)}
    assert json.loads(runs[2]["parameters"])["gate"]["from_run"] == runs[1]["run_id"]  # the bank's own settings
    lineage = problem_lineage(lake, ids["near"])  # `rlvr lineage problem` says why it is not in
    assert "problem" not in lineage and lineage["dropped"][0]["reason"] == "near_duplicate"
    before = lake.read("problems")["problem_id"].sort()
    bank_added(lake, made, 1, "self-play problems")  # a re-run: the admitted one is in, the others refused again
    assert lake.read("problems")["problem_id"].sort().equals(before)
    assert bank_added(lake, made.filter(pl.col("problem_id") == ids["new"]), 1, "self-play problems") is None


def test_the_gate_applies_the_settings_the_bank_was_curated_with(tmp_path, bank):
    lake = Lake.open(str(tmp_path / "lake"))
    curated(lake, {**bank, "dedup": {"near": False}, "decontamination": {"enabled": False}})
    made = problem_rows([question(STORY + " Give a number.", "p-near"), question(ROBE, "p-copied", "21")])
    assert refusals(lake, made) == {}
    bank_added(lake, made, 1, "self-play problems")
    assert set(made["problem_id"]) <= set(lake.read("problems")["problem_id"])
    gate = json.loads(lake.read("runs").filter(pl.col("bank_version") == 2)["parameters"][0])["gate"]
    assert gate["dedup"]["near"] is False and gate["from_run"] is not None


def test_the_stage_never_solves_a_task_the_gate_refuses(tmp_path, bank):
    from tasks.iteration import IterationConfig
    from tasks.selfplay.stage import sample_selfplay
    from tasks.verification.stage import score_with_components, verifier_pool

    lake = Lake.open(str(tmp_path / "lake"))
    curated(lake, bank)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "janet", "text": f"{STORY}\n{SOLUTION}", "license": "MIT"}) + "\n")
    config = IterationConfig.model_validate(
        {
            "rollout": {"group_size": 2},
            "verify": {"workers": 0},
            "selfplay": {
                "enabled": True,
                "task_types": [],
                "proposer_group_size": 2,
                "documents": str(corpus),
                "challenger_groups": 1,
            },
        }
    )
    span = "She makes 9 * 2 = $18 every day at the farmers' market."
    near = challenge_text(STORY + " Give a number.", "18", span)  # the bank's training problem, reworded
    fresh = challenge_text("How much does Janet make every day at the market?", "18", span)

    def answer(prompt, index):
        return [near, fresh][index] if prompt.startswith("Document:") else "The answer is 18."

    with verifier_pool(config.verify) as pool:
        sampled = sample_selfplay(
            lake,
            config,
            1,
            0,
            Replay(answer),
            None,
            lambda frame: score_with_components(frame, config.verify, config.reward, pool),
        )
    refused, valid = sampled.proposals.sort("proposal_id").iter_rows(named=True)
    assert (refused["verdict"], refused["reason"], valid["verdict"]) == ("invalid", "near_duplicate", "valid")
    assert refused["reward"] == -0.5 and refused["solve_rate"] is None
    assert refused["detail"].startswith("near duplicate of problem ")
    solved = set(sampled.rollouts.filter(pl.col("round") == 2)["problem_id"])
    assert solved == {valid["problem_id"]}  # the refused task was never solved
    bank_added(lake, sampled.new_problems, 1, "self-play problems", drawn=sampled.rollouts["problem_id"].to_list())
    assert valid["problem_id"] in set(lake.read("problems")["problem_id"])
    drop = problem_lineage(lake, refused["problem_id"])["dropped"][0]  # recorded as curation records its drops
    assert (drop["reason"], drop["source_uri"]) == ("near_duplicate", f"proposal:{refused['proposal_id']}")


def test_a_problem_refused_after_it_was_sampled_fails_the_iteration():
    admitted = Admitted(
        3,
        pl.DataFrame(),
        pl.DataFrame(),
        pl.DataFrame(),
        refused={"abc": "near duplicate of problem def (similarity 0.91)"},
    )
    refused_but_drawn(admitted, ["xyz"])  # not drawn: the refusal is only recorded
    with pytest.raises(ValueError, match=r"1 problem\(s\) this iteration sampled were refused .* abc, near duplicate"):
        refused_but_drawn(admitted, ["abc", "xyz"])
