"""SPICE-style document-grounded challenges: the corpus reader, every validity rule on a hand-written
challenge, SPICE's variance reward, corpora of real text (a folder, dataset rows, licences), and the self-play
stage with a corpus: proposals that keep their document, its file, licence and span, banked questions, and
lineage from a question back to its document."""

import json
import math
from pathlib import Path

import polars as pl
import pytest
from conftest import ROOT
from helpers import Replay

from tasks.proposals.documents import (
    Document,
    challenge_text,
    generate_documents,
    parse_challenge,
    read_documents,
    variance_reward,
)

DATASETS = ROOT.parent / "shared" / "datasets"

DOCUMENT = Document(
    "towns:1",
    "Arlen is a town of 4200 people. It has 12 bakeries and 3 schools.\nThe river through Arlen is 40 km long.",
)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("How many bakeries?", "unparseable"),
        (
            challenge_text("How many bakeries does Arlen have?", "12", "It has 12 bakeries and 3 cinemas."),
            "span_not_in_document",
        ),
        (
            challenge_text("How many bakeries does Arlen have?", "13", "It has 12 bakeries and 3 schools."),
            "answer_not_in_span",
        ),
        (
            challenge_text("Arlen has 12 bakeries: how many bakeries?", "12", "It has 12 bakeries and 3 schools."),
            "answer_in_question",
        ),
    ],
)
def test_each_rule_rejects_a_hand_written_challenge(text, reason):
    assert parse_challenge(text, DOCUMENT).reason == reason


@pytest.mark.parametrize(
    "question, answer, span, reason",
    [
        # a word of the copied sentence is not an answer (the old substring rule took each of these)
        ("How many bakeries does Arlen have?", "has", "It has 12 bakeries and 3 schools.", "trivial_answer"),
        ("How many bakeries does Arlen have?", "schools", "It has 12 bakeries and 3 schools.", "answer_not_a_number"),
        # a sub-word is not a span: "2" is in "12", "bake" in "bakeries"
        ("How many bakeries does Arlen have?", "2", "It has 12 bakeries and 3 schools.", "answer_not_in_span"),
        ("What does Arlen have 12 of?", "bake", "It has 12 bakeries and 3 schools.", "answer_not_in_span"),
        ("How many people live in Arlen?", "4200 people", "4200 people", "answer_is_span"),
        ("How long is the river?", "40", "The river through Arlen is 40 km long.", "valid"),
        ("What is the town?", "Arlen is a town of 4200 people", "Arlen is a town of 4200 people.", "answer_is_span"),
        ("What is it?", "12", "It has 12 bakeries and 3 schools.", "question_not_about_span"),
        ("What does Arlen have 12 of?", "bakeries", "It has 12 bakeries and 3 schools.", "valid"),
        ("How many schools are in Arlen?", "3", "It has 12 bakeries and 3 schools.", "valid"),  # a digit is a number
        ("How long is the river through Arlen?", "40 km", "The river through Arlen is 40 km long.", "valid"),
    ],
)
def test_the_answer_must_be_a_span_of_whole_words_the_question_asks_for(question, answer, span, reason):
    found = parse_challenge(challenge_text(question, answer, span), DOCUMENT)
    assert getattr(found, "reason", "valid") == reason


def test_a_span_cut_inside_a_word_is_not_a_passage():
    text = challenge_text("How many bakeries does Arlen have?", "12", "has 12 bakeri")  # a substring, cut mid-word
    assert parse_challenge(text, DOCUMENT).reason == "span_not_in_document"


def test_a_valid_challenge_keeps_its_span_and_a_repeat_shares_its_key():
    text = challenge_text("How many bakeries does Arlen have?", "12", "It has 12 bakeries\n  and 3 schools.")
    challenge = parse_challenge(text, DOCUMENT)
    assert (challenge.answer, challenge.span) == ("12", "It has 12 bakeries and 3 schools.")  # whitespace aside
    again = parse_challenge(challenge_text("how many BAKERIES does Arlen have", "12", "It has 12 bakeries"), DOCUMENT)
    assert again.key == challenge.key  # the same question, normalised


@pytest.mark.parametrize("rate, variance", [(0.0, 0.0), (0.25, 0.1875), (0.5, 0.25), (0.75, 0.1875), (1.0, 0.0)])
def test_the_challengers_reward_is_a_gaussian_of_the_reasoners_correctness_variance(rate, variance):
    # the variance of G binary outcomes with solve rate p is p(1 - p): ¼ at p = ½, the Gaussian's centre
    expected = math.exp(-((variance - 0.25) ** 2) / (2 * 0.01))
    assert variance_reward(rate) == pytest.approx(expected)
    assert variance_reward(rate, width=0.001) <= variance_reward(rate)  # a narrower Gaussian is sharper
    assert variance_reward(None) == 0.0  # never solved: nothing to reward
    assert variance_reward(0.5) == 1.0 and variance_reward(0.5) > variance_reward(0.25) > variance_reward(0.0)


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


def test_a_folder_corpus_reads_text_and_dataset_rows_with_their_licences(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("Para one.\n\nPara two.\n")
    (tmp_path / "notes" / "LICENSE").write_text("\nCC-BY-4.0\nfull text\n")
    (tmp_path / "rows.jsonl").write_text(
        json.dumps({"id": 7, "question": "How many?", "answer": "Three.\n#### 3"})
        + "\n"
        + json.dumps({"problem": "Sum?", "solution": ["1+1", "= 2"], "license": "MIT"})
        + "\n"
    )
    documents = read_documents(tmp_path)
    assert [(d.document_id, d.licence) for d in documents] == [
        ("notes/a.txt:1", "CC-BY-4.0"),
        ("notes/a.txt:2", "CC-BY-4.0"),
        ("rows.jsonl:7", None),
        ("rows.jsonl:2", "MIT"),
    ]
    assert documents[2].text == "How many?\nThree.\n#### 3" and documents[3].text == "Sum?\n1+1\n= 2"
    assert documents[0].source == str(tmp_path / "notes" / "a.txt")
    (tmp_path / "notes" / "a.md").write_text("Same stem, another file.\n")  # ids keep the suffix
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "notes.txt").write_text("not the user's text\n")  # hidden folders are skipped
    (tmp_path / "notes" / "copying.md").write_text("GPL-3.0\n")  # a licence, not a document
    assert [d.document_id for d in read_documents(tmp_path)][:3] == ["notes/a.md:1", "notes/a.txt:1", "notes/a.txt:2"]
    (tmp_path / "rows.jsonl").write_text('{"id": "x", "text": "One."}\n{"id": "x", "text": "Two."}\n')
    with pytest.raises(ValueError, match=r"rows.jsonl: document id 'rows.jsonl:x' is also a document of"):
        read_documents(tmp_path)
    (tmp_path / "rows.jsonl").write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(ValueError, match=r"rows.jsonl: not UTF-8"):
        read_documents(tmp_path)
    (tmp_path / "rows.jsonl").write_text('{"title": "no text"}\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:1: field text"):
        read_documents(tmp_path)


@pytest.mark.skipif(not DATASETS.is_dir(), reason="../shared/datasets is not here (a user's clone)")
def test_the_projects_datasets_are_a_corpus_with_every_licence_recorded():
    documents = read_documents(DATASETS)
    from_datasets = [d for d in documents if Path(d.source).parent != DATASETS]  # the folder's README aside
    assert len(from_datasets) > 10_000 and len({d.document_id for d in documents}) == len(documents)
    assert all(d.licence for d in from_datasets)
    gsm8k = next(d for d in from_datasets if d.document_id == "gsm8k/train.jsonl:1")
    assert gsm8k.licence == "MIT" and gsm8k.text.startswith("Natalia sold clips") and "#### 72" in gsm8k.text
    by_folder = {Path(d.source).parent.name: d.licence for d in from_datasets}  # read from each file's text
    assert (by_folder["humaneval"], by_folder["math500"]) == ("MIT", "Apache-2.0")  # "The MIT License", "Apache …"


def test_the_stage_grounds_questions_in_their_documents_and_lineage_finds_the_span(tmp_path):
    from flows.iteration import bank_added
    from storage.lake import Lake
    from storage.lineage import problem_lineage
    from tasks.iteration import IterationConfig
    from tasks.selfplay.stage import sample_selfplay
    from tasks.verification.stage import score_with_components, verifier_pool

    corpus = tmp_path / "towns.jsonl"
    corpus.write_text(json.dumps({"id": DOCUMENT.document_id, "text": DOCUMENT.text, "license": "CC0"}) + "\n")
    config = IterationConfig.model_validate(
        {
            "rollout": {"group_size": 4},
            "verify": {"workers": 0},
            "selfplay": {
                "enabled": True,
                "task_types": ["deduction"],
                "proposer_groups": 1,
                "proposer_group_size": 4,
                "documents": str(corpus),
                "challenger_groups": 1,
            },
        }
    )
    challenge = challenge_text("How many bakeries does Arlen have?", "12", "It has 12 bakeries and 3 schools.")

    def answer(prompt, index):
        if prompt.startswith("Document:"):  # the challenger: one valid, one repeat, one bad span
            return [challenge, challenge, challenge_text("How long?", "40", "The river is 40 km long."), "??"][index]
        if prompt.startswith("How many bakeries"):  # the reasoner, without the document: right 1 time in 4
            return "The answer is 12." if index == 0 else "The answer is 7."
        return "no proposal"  # the code proposer

    lake = Lake.open(str(tmp_path / "lake"))
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
    challenges = sampled.proposals.filter(pl.col("role") == "challenger").sort("proposal_id")
    assert challenges["reason"].to_list() == [None, "duplicate", "span_not_in_document", "unparseable"]
    assert (challenges["document_id"] == DOCUMENT.document_id).all()
    valid = challenges.row(0, named=True)
    assert valid["span"] == "It has 12 bakeries and 3 schools." and valid["solve_rate"] == 0.25
    assert valid["reward"] == pytest.approx(variance_reward(0.25))
    assert (valid["document_source"], valid["document_licence"]) == (str(corpus), "CC0")
    assert challenges["reward"].to_list()[1:] == [-0.5, -0.5, -1.0]
    question = sampled.new_problems.filter(pl.col("problem_id") == valid["problem_id"]).row(0, named=True)
    assert (question["prompt"], question["answer"], question["verifier"]) == (
        "How many bakeries does Arlen have?",
        "12",
        "qa",
    )  # asked without the document
    assert json.loads(question["metadata"])["document_licence"] == "CC0"
    bank_added(lake, sampled.new_problems, 1, "self-play problems")
    with lake.run("test", "rollout", {}, iteration=1) as run:
        lake.replace("proposals", sampled.proposals, {"iteration": 1}, run)
        lake.replace("rollouts", sampled.rollouts, {"iteration": 1}, run)
    found = problem_lineage(lake, valid["problem_id"])["proposal"]["proposal"]
    assert (found["document_id"], found["span"], found["role"]) == (DOCUMENT.document_id, valid["span"], "challenger")
    assert (found["document_source"], found["document_licence"]) == (str(corpus), "CC0")


def test_the_warm_up_challenges_are_valid_and_the_drill_corpus_is_reproducible():
    import random

    from tasks.generators.grounded import challenger_example, drill_documents
    from tasks.proposals.verifiers import ChallengeVerifier

    verifier, kinds = ChallengeVerifier(), set()
    for seed in range(40):
        example = challenger_example(random.Random(seed))
        problem = {"answer": example.answer}
        assert verifier.verify(problem, example.solution).reward == 1.0  # every worked challenge is valid
        kinds.add(example.params["kind"])
        wrong = example.solution.replace("```span\n", "```span\nNot in the document. ")
        assert verifier.verify(problem, wrong).details["reason"] == "span_not_in_document"
    assert kinds == {"whole", "step"}  # whole problems and (easier) single steps
    committed = ROOT / "configs" / "data" / "drill-documents.jsonl"
    assert [json.loads(line) for line in committed.read_text().splitlines()] == drill_documents(500)


def test_spice_on_the_tiny_model_records_each_challenge_with_its_document(prefect_api, tmp_path):
    """One SPICE iteration with a real (untrained) tiny policy: every challenger rollout is a proposal carrying its
    document's id, file and licence, rewarded by the validity rules, and the step trains on them."""
    from helpers import SMALL_POLICY

    from flows.curation import curate_bank
    from flows.loop import rl_loop
    from storage.lake import Lake

    corpus = ROOT / "configs" / "data" / "drill-documents.jsonl"
    lake_uri = str(tmp_path / "lake")
    curate_bank({"sources": [{"kind": "generator", "generator": "two_step", "count": 40, "seed": 0}]}, lake_uri)
    config = {
        "rollout": {"group_size": 4, "sampler": {"max_new_tokens": 16}, "base_policy": SMALL_POLICY},
        "selfplay": {
            "enabled": True,
            "task_types": [],
            "documents": str(corpus),
            "challenger_groups": 3,
            "proposer_group_size": 4,
            "proposal_tokens": 24,
        },
        "dynamic_sampling": {"band": [-0.1, 1.1], "groups_per_batch": 8, "max_rounds": 1, "oversample": 1.0},
        "verify": {"workers": 0},
        "train": {"micro_batch_size": 8},
        "loop": {"iterations": 1, "evaluate_every": 0},
    }
    rl_loop(config, lake_uri=lake_uri)
    lake = Lake.open(lake_uri)
    proposals = lake.read("proposals")
    assert proposals.height == 3 * 4 and set(proposals["role"]) == {"challenger"}
    assert proposals["document_id"].str.starts_with("drill:").all() and proposals["document_id"].n_unique() == 3
    assert set(proposals["document_source"]) == {str(corpus)}
    assert proposals["document_licence"].str.contains("tasks/generators/grounded.py").all()
    assert proposals.filter(pl.col("verdict") == "invalid")["reward"].is_in([-1.0, -0.5]).all()
    assert lake.read("model_versions")["model_version"].max() == 1  # the challenger's groups trained


MIT_TEXT = """Copyright (c) 2021 Some One

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.
"""
BSD_TEXT = """Copyright (c) 2019, Some One
All rights reserved.

Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions are met:

1. Redistributions of source code must retain the above copyright notice.
2. Redistributions in binary form must reproduce the above copyright notice.
"""
BSD3_CLAUSE = """3. Neither the name of the copyright holder nor the names of its
   contributors may be used to endorse or promote products derived from
   this software without specific prior written permission.
"""


@pytest.mark.parametrize(
    "text, spdx",
    [
        (MIT_TEXT, "MIT"),  # the first line is a copyright line
        ("The MIT License (MIT)\n\n" + MIT_TEXT, "MIT"),  # or a title
        (
            MIT_TEXT.replace("The above copyright notice and this permission notice shall be included", "Nothing"),
            "MIT-0",
        ),
        (BSD_TEXT, "BSD-2-Clause"),
        (BSD_TEXT + BSD3_CLAUSE, "BSD-3-Clause"),
        ("\n\n                    Apache License\n              Version 2.0, January 2004\n", "Apache-2.0"),
        (
            "GNU GENERAL PUBLIC LICENSE\n   Version 3, 29 June 2007\n\n Copyright (C) 2007 Free Software Foundation",
            "GPL-3.0-only",
        ),
        ("GNU GENERAL PUBLIC LICENSE\n   Version 2, June 1991\n", "GPL-2.0-only"),
        (
            "GNU LESSER GENERAL PUBLIC LICENSE\n Version 2.1, February 1999\n ... the GNU General Public License version 3",
            "LGPL-2.1-only",
        ),  # names the GPL: the LGPL still wins
        (
            "Creative Commons\n\nAttribution-ShareAlike 4.0 International\n\nCreative Commons Corporation",
            "CC-BY-SA-4.0",
        ),
        (
            "Attribution 4.0 International\n\n=======\n\nCreative Commons Attribution 4.0 International Public License",
            "CC-BY-4.0",
        ),
        ("Creative Commons Legal Code\n\nCC0 1.0 Universal\n", "CC0-1.0"),
        (
            "Copyright 2020 X\n\nPermission to use, copy, modify, and/or distribute this software for any purpose with or "
            "without fee is hereby granted, provided that the above copyright notice and this permission notice appear in "
            "all copies.",
            "ISC",
        ),
        ("Copyright 2020 X\nSPDX-License-Identifier: MPL-2.0\n", "MPL-2.0"),  # a tag says it outright
        ("\nCC-BY-4.0\nfull text\n", "CC-BY-4.0"),  # a file holding only the id
        ("Copyright (c) 2020 Some One. All rights reserved.\n", None),  # not a licence we know
    ],
)
def test_a_licence_is_read_from_its_files_text_not_its_first_line(text, spdx):
    from tasks.proposals.licences import spdx_of

    assert spdx_of(text) == spdx


def test_a_corpus_licence_file_with_a_copyright_first_line_is_named_by_its_text(tmp_path):
    (tmp_path / "mit").mkdir()
    (tmp_path / "mit" / "a.txt").write_text("One.\n")
    (tmp_path / "mit" / "LICENSE").write_text(MIT_TEXT)
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "b.txt").write_text("Two.\n")
    (tmp_path / "own" / "LICENCE.md").write_text("Copyright (c) 2020 Some One\n\nYou may read this, nothing more.\n")
    assert [(d.document_id, d.licence) for d in read_documents(tmp_path)] == [
        ("mit/a.txt:1", "MIT"),
        ("own/b.txt:1", f"LicenseRef-unknown ({tmp_path / 'own' / 'LICENCE.md'})"),
    ]


def test_every_reason_a_grounded_challenge_is_refused_for_is_listed():
    """`GROUNDED_REASONS` names every reason `documents.py` gives (what the `proposals` rows' reasons can be)."""
    import re
    from pathlib import Path

    from tasks.proposals import documents

    given = set(re.findall(r'Rejection\("(\w+)"', Path(documents.__file__).read_text()))
    assert given and given <= set(documents.GROUNDED_REASONS)
