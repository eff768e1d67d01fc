"""SPICE-style document-grounded challenges: the corpus reader, every validity rule on a hand-written
challenge, the challenger's peaked reward, and the self-play stage with a corpus: proposals that keep their
document and span, banked questions, and lineage from a question back to its document."""

import json

import polars as pl
import pytest

from tasks.selfplay.documents import (Document, challenge_text, generate_documents, parse_challenge, peaked,
                                      read_documents)

DOCUMENT = Document("towns:1", "Arlen is a town of 4200 people. It has 12 bakeries and 3 schools.\n"
                               "The river through Arlen is 40 km long.")


@pytest.mark.parametrize("text, reason", [
    ("How many bakeries?", "unparseable"),
    (challenge_text("How many bakeries does Arlen have?", "12", "It has 12 bakeries and 3 cinemas."),
     "span_not_in_document"),
    (challenge_text("How many bakeries does Arlen have?", "13", "It has 12 bakeries and 3 schools."),
     "answer_not_in_span"),
    (challenge_text("Arlen has 12 bakeries: how many bakeries?", "12", "It has 12 bakeries and 3 schools."),
     "answer_in_question"),
])
def test_each_rule_rejects_a_hand_written_challenge(text, reason):
    assert parse_challenge(text, DOCUMENT).reason == reason


def test_a_valid_challenge_keeps_its_span_and_a_repeat_shares_its_key():
    text = challenge_text("How many bakeries does Arlen have?", "12", "It has 12 bakeries\n  and 3 schools.")
    challenge = parse_challenge(text, DOCUMENT)
    assert (challenge.answer, challenge.span) == ("12", "It has 12 bakeries and 3 schools.")   # whitespace aside
    again = parse_challenge(challenge_text("how many BAKERIES does Arlen have", "12", "It has 12 bakeries"),
                            DOCUMENT)
    assert again.key == challenge.key                                  # the same question, normalised


@pytest.mark.parametrize("rate, reward", [(None, 0.0), (0.0, 0.0), (0.25, 0.5), (0.5, 1.0), (0.75, 0.5), (1.0, 0.0)])
def test_the_challengers_reward_peaks_at_half(rate, reward):
    assert peaked(rate) == pytest.approx(reward)


def test_the_corpus_reader_takes_jsonl_and_text_and_names_bad_lines(tmp_path):
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text('{"id": "a", "text": "One."}\n\n{"id": "b", "text": "Two."}\n')
    assert [d.document_id for d in read_documents(jsonl)] == ["a", "b"]
    text = tmp_path / "corpus.txt"
    text.write_text("First paragraph.\n\nSecond\nparagraph.\n")
    assert [d.text for d in read_documents(text)] == ["First paragraph.", "Second\nparagraph."]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "One."}\n{"id": "b"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: field text"):
        read_documents(bad)
    assert len({d.text for d in generate_documents(20)}) == 20


class Replay:
    """A stand-in for the policy that answers each prompt with a fixed text (the stage's wiring is under test
    here; the loop on a real model is tests/test_selfplay_loop.py)."""

    def __init__(self, answer):
        self.answer = answer

    def generate(self, prompts, n, sampler, seed, model_version):
        from tasks.rollout.sampling import Sample

        return [[Sample(text=self.answer(prompt, index), token_ids=[1, 2], logprobs=[-0.1, -0.2],
                        finish_reason="stop", prompt_token_ids=[0]) for index in range(n)] for prompt in prompts]


def test_the_stage_grounds_questions_in_their_documents_and_lineage_finds_the_span(tmp_path):
    from flows.iteration import bank_added
    from storage.lake import Lake
    from storage.lineage import problem_lineage
    from tasks.rollout.stage import IterationConfig
    from tasks.selfplay.stage import sample_selfplay
    from tasks.verification import score_with_components, verifier_pool

    corpus = tmp_path / "towns.jsonl"
    corpus.write_text(json.dumps({"id": DOCUMENT.document_id, "text": DOCUMENT.text}) + "\n")
    config = IterationConfig.model_validate({
        "rollout": {"group_size": 4}, "verify": {"workers": 0},
        "selfplay": {"enabled": True, "task_types": ["deduction"], "proposer_groups": 1, "proposer_group_size": 4,
                     "documents": str(corpus), "challenger_groups": 1}})
    challenge = challenge_text("How many bakeries does Arlen have?", "12", "It has 12 bakeries and 3 schools.")

    def answer(prompt, index):
        if prompt.startswith("Document:"):                # the challenger: one valid, one repeat, one bad span
            return [challenge, challenge, challenge_text("How long?", "40", "The river is 40 km long."), "??"][index]
        if prompt.startswith("How many bakeries"):        # the reasoner, without the document: right 1 time in 4
            return "The answer is 12." if index == 0 else "The answer is 7."
        return "no proposal"                              # the code proposer

    lake = Lake.open(str(tmp_path / "lake"))
    with verifier_pool(config.verify) as pool:
        sampled = sample_selfplay(lake, config, 1, 0, Replay(answer), None,
                                  lambda frame: score_with_components(frame, config.verify, config.reward, pool))
    challenges = sampled.proposals.filter(pl.col("role") == "challenger").sort("proposal_id")
    assert challenges["reason"].to_list() == [None, "duplicate", "span_not_in_document", "unparseable"]
    assert (challenges["document_id"] == DOCUMENT.document_id).all()
    valid = challenges.row(0, named=True)
    assert valid["span"] == "It has 12 bakeries and 3 schools." and valid["solve_rate"] == 0.25
    assert valid["reward"] == pytest.approx(peaked(0.25))
    assert challenges["reward"].to_list()[1:] == [-0.5, -0.5, -1.0]
    question = sampled.new_problems.filter(pl.col("problem_id") == valid["problem_id"]).row(0, named=True)
    assert (question["prompt"], question["answer"], question["verifier"]) == (
        "How many bakeries does Arlen have?", "12", "qa")                  # asked without the document
    bank_added(lake, sampled.new_problems, 1, "self-play problems")
    with lake.run("test", "rollout", {}, iteration=1) as run:
        lake.replace("proposals", sampled.proposals, {"iteration": 1}, run)
        lake.replace("rollouts", sampled.rollouts, {"iteration": 1}, run)
    found = problem_lineage(lake, valid["problem_id"])["proposal"]["proposal"]
    assert (found["document_id"], found["span"], found["role"]) == (DOCUMENT.document_id, valid["span"],
                                                                     "challenger")
