"""QA, reasoning-gym, format, process rewards, reward controls, noise correction, code rewards."""

import json
import warnings

import numpy as np
import pytest
import reasoning_gym

from tasks.verification.registry import build_verifier
from tasks.verifiers.code import CodeVerifier, extract_program
from tasks.verifiers.formats import format_reward
from tasks.verifiers.noise import corrected_reward, estimate_noise
from tasks.verifiers.process import process_score, stated_equalities
from tasks.verifiers.qa import token_f1


def test_qa_exact_match_and_f1():
    qa = build_verifier("qa")
    assert qa.verify({"answer": "The Eiffel Tower"}, "The answer is the eiffel tower!").reward == 1.0
    assert qa.verify({"answer": '["NYC", "New York City"]'}, "the answer is New York City").correct
    partial = build_verifier("qa", reward_kind="f1").verify({"answer": "Barack Obama"}, "the answer is Obama")
    assert partial.reward == pytest.approx(2 / 3) and partial.correct is False
    assert token_f1("a b c", "a b c") == 1.0 and token_f1("x", "y") == 0.0


def test_gym_uses_the_datasets_own_scorer():
    entry = reasoning_gym.create_dataset("knights_knaves", size=1, seed=2)[0]
    problem = {"prompt": entry["question"], "answer": entry["answer"], "metadata": json.dumps(entry["metadata"])}
    gym = build_verifier("gym")
    assert gym.verify(problem, f"<answer>{entry['answer']}</answer>").reward == 1.0
    assert gym.verify(problem, "<answer>everyone lies</answer>").reward == 0.0
    assert gym.verify(problem, "no tag at all").details["reason"] == "no final answer"


def test_gym_arithmetic_answers_accept_boxed():
    entry = reasoning_gym.create_dataset("chain_sum", size=1, seed=4)[0]
    problem = {"answer": entry["answer"], "metadata": entry["metadata"]}
    assert build_verifier("gym").verify(problem, f"\\boxed{{{entry['answer']}}}").reward == 1.0


@pytest.mark.parametrize(
    "domain, response, expected",
    [
        ("math", r"so \boxed{3}", 1.0),
        ("math", "so 3", 0.0),
        ("code", "```python\ndef f(): pass\n```", 1.0),
        ("code", "def f(): pass", 0.0),
        ("logic", "<answer>A</answer>", 1.0),
        ("logic", "A", 0.0),
    ],
)
def test_format_reward(domain, response, expected):
    assert format_reward(domain, response) == expected


def test_stated_equalities_are_checked():
    found = stated_equalities("She has 3 * 4 = 12 apples, then <<12+5=18>> and 7 - 2 = 5.")
    assert [(e, s, t) for e, s, t in found] == [("3 * 4", 12.0, 12.0), ("12+5", 18.0, 17.0), ("7 - 2", 5.0, 5.0)]


def test_process_score_against_gold_steps():
    score, details = process_score("48/2 = 24 and 48+24 = 72", ["48/2=24", "48+24=72"])
    assert score == 1.0 and details["gold_steps_reached"] == "2/2"
    score, details = process_score("48/2 = 25 so 48+25 = 73", ["48/2=24", "48+24=72"])
    assert details["equalities_correct"] == 1 and details["gold_steps_reached"] == "0/2"
    assert score == pytest.approx((1 / 2 + 0 / 2) / 2)  # one false step, and off the gold path
    assert process_score("no numbers", None) == (None, {"equalities": 0})


def test_process_verifier_mixes_with_lambda():
    process = build_verifier("process", process_weight=0.5)
    right_answer_wrong_steps = process.verify(
        {"answer": "72", "steps": ["48/2=24", "48+24=72"]}, "48/2 = 25, 25 + 48 = 72\n#### 72"
    )
    # both stated steps are false and none produces a gold result: process 0, outcome 1
    assert right_answer_wrong_steps.reward == pytest.approx(0.5 * 1.0 + 0.5 * 0.0)
    assert right_answer_wrong_steps.correct is True


def test_padding_with_true_but_irrelevant_arithmetic_earns_nothing():
    process = build_verifier("process", process_weight=0.5)
    problem = {"answer": "18", "steps": ["16-3-4=9", "9*2=18"], "prompt": "16 eggs, eats 3, bakes with 4, sells at $2."}
    bare = process.verify(problem, r"\boxed{18}").reward
    assert process.verify(problem, r"1+1=2, 5*5=25 \boxed{18}").reward == bare
    assert process.verify(problem, r"1+1=2. 9 18 \boxed{17}").reward == 0.0
    assert process.verify(problem, r"16-3-4=9 and 9*2=18, so \boxed{18}").reward == 1.0


def test_small_process_weight_warns_once_where_the_config_is_read():
    from tasks.verification.stage import VerifyConfig

    with pytest.warns(UserWarning, match="worse than outcome-only"):
        VerifyConfig(options={"process": {"process_weight": 0.1}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        VerifyConfig(options={"process": {"process_weight": 0.5}})
        build_verifier("process", process_weight=0.1)  # workers build it: no warning from each of them


def test_reward_controls():
    random = build_verifier("random", p=0.3, seed=1)
    draws = [random.verify({"problem_id": str(i)}, "r").reward for i in range(2000)]
    assert 0.25 < np.mean(draws) < 0.35
    assert draws == [random.verify({"problem_id": str(i)}, "r").reward for i in range(2000)]
    flipped = build_verifier("flipped")
    assert flipped.verify({"answer": "2"}, r"\boxed{2}").reward == 0.0
    assert flipped.verify({"answer": "2"}, r"\boxed{3}").reward == 1.0
    assert flipped.verify({"answer": "2"}, r"\boxed{2}").correct is True
    assert build_verifier("constant", value=0.7).verify({}, "x").reward == 0.7


def test_noise_estimate_and_unbiased_correction():
    rng = np.random.default_rng(0)
    truth = rng.random(20000) < 0.7
    rho0, rho1 = 0.1, 0.2  # the simulated verifier's error rates
    flips = rng.random(truth.size)
    verdict = np.where(truth, flips >= rho1, flips < rho0)
    estimate = estimate_noise(verdict, truth)
    assert estimate.rho0 == pytest.approx(rho0, abs=0.01) and estimate.rho1 == pytest.approx(rho1, abs=0.01)
    corrected = corrected_reward(verdict.astype(float), estimate.rho0, estimate.rho1)
    assert corrected.mean() == pytest.approx(truth.mean(), abs=0.01)  # unbiased where the raw mean is not
    assert abs(verdict.mean() - truth.mean()) > 0.05
    with pytest.raises(ValueError, match="both correct and wrong"):
        estimate_noise(np.ones(5, bool), np.ones(5, bool))


def test_code_program_extraction():
    assert extract_program("```python\ndef f(x):\n    return x\n```", "PROMPT", "f") == "def f(x):\n    return x\n"
    assert extract_program("    return x\n", "def f(x):\n", "f") == "def f(x):\n    return x\n"


def test_code_partial_credit_conventions():
    tests = "assert f(1) == 1\nassert f(2) == 2\nassert f(3) == 4\nassert f(4) == 8\n"
    half_right = "def f(x):\n    return x\n"
    problem = {"prompt": "", "tests": tests, "entry_point": "f"}
    fraction = CodeVerifier(partial_credit="fraction")
    seed = CodeVerifier(partial_credit="seed")
    try:
        assert fraction.verify(problem, half_right).reward == 0.5
        assert fraction.verify(problem, half_right).details["tests_passed"] == 2
        assert seed.verify(problem, half_right).reward == 0.5
        assert seed.verify(problem, "def f(x):\n    return -1\n").reward == 0.0
        full = seed.verify(problem, "def f(x):\n    return x if x < 3 else 2 ** (x - 1)\n")
        assert full.reward == 1.0 and full.correct
    finally:
        fraction.close()
        seed.close()


def test_humaneval_canonical_solutions_all_pass(shared_datasets):
    rows = [json.loads(line) for line in (shared_datasets / "humaneval" / "test.jsonl").open()]
    verifier = CodeVerifier()
    try:
        failing = [
            row["task_id"]
            for row in rows
            if not verifier.verify(
                {"prompt": row["prompt"], "tests": row["test"], "entry_point": row["entry_point"]},
                row["canonical_solution"],
            ).correct
        ]
        assert failing == []
        wrong = verifier.verify(
            {"prompt": rows[0]["prompt"], "tests": rows[0]["test"], "entry_point": rows[0]["entry_point"]},
            "    return True\n",
        )
        assert 0 < wrong.reward < 1
    finally:
        verifier.close()
