"""More verifiable domains: CNF satisfiability with proofs, games against a solver, translation with chrF.
Each verifier against the generator's own answers, known wrong ones, and the hacks each domain invites
(a bare claim, an illegal move, a copied source, an empty or padded answer)."""

import json
import random

import pytest

from tasks.generators import generate
from tasks.generators.games import connect4, tictactoe
from tasks.generators.logic import sat
from tasks.generators.translation import translation
from tasks.verifiers.games import GameVerifier, ttt_move_values
from tasks.verifiers.sat import SatVerifier, check_refutation, parse_cnf, read_certificate, resolvent
from tasks.verifiers.translation import TranslationVerifier

SAT, GAME, TRANSLATION = SatVerifier(), GameVerifier(), TranslationVerifier()


# ---- satisfiability --------------------------------------------------------------------------------------------
def test_every_generated_certificate_checks_and_both_outcomes_occur():
    claims = set()
    for seed in range(60):
        made = sat(random.Random(seed), level=1 + seed % 4)
        verdict = SAT.verify({"prompt": made.prompt}, made.solution)
        assert verdict.reward == 1.0, (seed, verdict.details)
        claims.add(verdict.details["claim"])
    assert claims == {"SAT", "UNSAT"}


# (x1 ∨ x2) (¬x1 ∨ x2) (x1 ∨ ¬x2) (¬x1 ∨ ¬x2): unsatisfiable, refuted in three resolutions
UNSAT_PROMPT = "Clauses:\n1 2 0\n-1 2 0\n1 -2 0\n-1 -2 0\n\nAnswer..."
REFUTATION = "<answer>\nUNSAT\n5: 1 2 -> 2\n6: 3 4 -> -2\n7: 5 6 -> 0\n</answer>"


def test_a_hand_written_refutation_and_its_forgeries():
    assert SAT.verify({"prompt": UNSAT_PROMPT}, REFUTATION).reward == 1.0
    forged = {
        "a bare claim": "<answer>UNSAT</answer>",
        "a wrong resolvent": "<answer>\nUNSAT\n5: 1 2 -> 1\n6: 3 4 -> -2\n7: 5 6 -> 0\n</answer>",
        "a clause that does not exist yet": "<answer>\nUNSAT\n5: 1 9 -> 2\n6: 5 4 -> 0\n</answer>",
        "resolving on two variables at once": "<answer>\nUNSAT\n5: 1 4 -> 0\n</answer>",
        "not ending in the empty clause": "<answer>\nUNSAT\n5: 1 2 -> 2\n</answer>",
        "a satisfying assignment that is not one": "<answer>SAT 1 2</answer>",
        "an assignment giving a variable both values": "<answer>SAT 1 -1 2</answer>",
        "the clauses copied back": "<answer>1 2 0\n-1 2 0\n1 -2 0\n-1 -2 0</answer>",
        "nothing": "",
    }
    for name, response in forged.items():
        verdict = SAT.verify({"prompt": UNSAT_PROMPT}, response)
        assert verdict.reward == 0.0, (name, verdict.details)


def test_a_satisfiable_formula_needs_a_complete_satisfying_assignment():
    prompt = "Clauses:\n1 2 0\n-1 3 0\n\n"
    assert SAT.verify({"prompt": prompt}, "<answer>SAT 1 -2 3</answer>").reward == 1.0
    assert SAT.verify({"prompt": prompt}, "<answer>SAT 1 3</answer>").reward == 0.0  # x2 left out
    assert SAT.verify({"prompt": prompt}, "<answer>SAT -1 -2 3</answer>").reward == 0.0  # falsifies clause 1
    assert SAT.verify({"prompt": prompt}, "<answer>UNSAT\n3: 1 2 -> 2 3\n</answer>").reward == 0.0


def test_resolution_by_hand():
    assert resolvent(frozenset({1, 2}), frozenset({-1, 3})) == frozenset({2, 3})
    assert resolvent(frozenset({1, 2}), frozenset({-1, -2})) is None  # two clashes: a tautology
    assert resolvent(frozenset({1}), frozenset({2})) is None
    clauses = parse_cnf("1 2 0\n-1 2 0\n1 -2 0\n-1 -2 0")
    certificate = read_certificate(REFUTATION)
    assert check_refutation(clauses, certificate.steps) is None


# ---- games ------------------------------------------------------------------------------------------------------
def test_tictactoe_by_hand():
    board = "XX.OO...."  # X to move wins at row 1 col 3
    problem = {"answer": f"tictactoe|{board}"}
    assert ttt_move_values(board)[2] == 1
    assert GAME.verify(problem, "<answer>1 3</answer>").reward == 1.0
    assert GAME.verify(problem, "<answer>3 3</answer>").reward == 0.0  # lets O win
    assert GAME.verify(problem, "<answer>1 1</answer>").details["reason"].startswith("an illegal move")
    assert GAME.verify(problem, "<answer>4 1</answer>").details["reason"] == "the move is off the board"
    assert GAME.verify(problem, "I would play the best move").reward == 0.0


def test_connect_four_take_the_win_and_block_the_threat():
    empty = "." * 42
    win = empty[:35] + "XXX.OOO"  # X to move: column 4 wins
    assert GAME.verify({"answer": f"connect4|{win}"}, "<answer>4</answer>").reward == 1.0
    assert GAME.verify({"answer": f"connect4|{win}"}, "<answer>1</answer>").reward == 0.0
    block = empty[:28] + "X......" + "XOOO..X"  # X to move; O threatens column 5
    assert GAME.verify({"answer": f"connect4|{block}"}, "<answer>5</answer>").reward == 1.0
    missed = GAME.verify({"answer": f"connect4|{block}"}, "<answer>2</answer>")
    assert missed.reward == 0.0 and missed.details["value"] == "loss"
    full_column = (
        "X" + "." * 6 + ("O" + "." * 6) + ("X" + "." * 6) + ("O" + "." * 6) + ("X" + "." * 6) + ("O" + "." * 6)
    )
    assert "illegal" in GAME.verify({"answer": f"connect4|{full_column}"}, "<answer>1</answer>").details["reason"]


def test_generated_positions_are_solved_by_their_own_solutions():
    for seed in range(20):
        for make in (tictactoe, connect4):
            made = make(random.Random(seed), level=1 + seed % 4)
            assert GAME.verify({"answer": made.answer}, made.solution).reward == 1.0


# ---- translation ------------------------------------------------------------------------------------------------
def test_translation_scores_are_continuous_and_guarded():
    made = translation(random.Random(3), level=3)
    problem = {"answer": made.answer, "prompt": made.prompt, "params": json.dumps(made.params)}
    exact = TRANSLATION.verify(problem, made.solution)
    assert exact.reward == pytest.approx(1.0) and exact.correct
    words = made.answer.rstrip(".").split()
    close = TRANSLATION.verify(problem, f"<answer>{' '.join(words[:-1])}.</answer>")  # a word missing
    assert 0.5 < close.reward < 1.0
    assert TRANSLATION.verify(problem, "<answer>Le chien.</answer>").reward < close.reward
    assert (
        TRANSLATION.verify(problem, f"<answer>{made.params['source_text']}</answer>").details["reason"]
        == "copies the source instead of translating it"
    )
    assert TRANSLATION.verify(problem, "<answer></answer>").reward == 0.0
    assert (
        TRANSLATION.verify(problem, f"<answer>{made.answer * 4}</answer>").details["reason"]
        == "far longer than the reference"
    )
    bleu = TranslationVerifier(metric="bleu").verify(problem, made.solution)
    assert bleu.reward == pytest.approx(1.0) and bleu.details["metric"] == "bleu"
    several = TRANSLATION.verify(
        {"answer": json.dumps(["Le chat dort.", "Le chat sommeille."])}, "<answer>Le chat sommeille.</answer>"
    )
    assert several.reward == pytest.approx(1.0)


def test_every_domain_is_curated_and_scored_through_the_pool():
    from tasks.verification.engine import VerifierPool

    items = []
    for name in ("sat", "tictactoe", "connect4", "translation"):
        for generator, _, made in generate(name, 4, seed=1):
            problem = {
                "domain": generator.domain,
                "verifier": generator.verifier,
                "answer": made.answer,
                "prompt": made.prompt,
                "params": json.dumps(made.params),
            }
            items.append((problem, made.solution, None))
    scored = list(VerifierPool(workers=0).score(items))
    assert {s.verifier for s in scored} == {"sat", "game", "translation"}
    assert all(s.reward == pytest.approx(1.0) for s in scored)
