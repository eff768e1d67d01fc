"""Validation rules for the bank: parseable math answers, structurally complete code problems."""

import pytest

from tasks.curation.validate import code_issue, math_answer_parses, problem_issue

HUMANEVAL_LIKE = dict(
    prompt='def add(a, b):\n    """Add."""\n',
    solution="    return a + b\n",
    tests="def check(candidate):\n    assert candidate(1, 2) == 3\n",
    entry_point="add",
)


@pytest.mark.parametrize(
    "answer",
    [
        "42",
        "-3",
        "1,234",
        "0.5",
        "3/4",
        "50%",
        "$18",
        r"\frac{\sqrt{2}}{2}",
        r"\left( 3, \frac{\pi}{2} \right)",
        r"x^2+1",
        r"[0, 1)",
        r"\text{Navin}",
        r"\sin x + \cos x",
        r"\text{(C)}",
    ],
)
def test_math_answers_that_parse(answer):
    assert math_answer_parses(answer)


@pytest.mark.parametrize(
    "answer",
    [
        "",
        "   ",
        r"\frac{",
        "$$",
        "hello world",
        "N/A",
        "TODO",
        "None",
        "see above",
        "Janet sells 16 eggs #### 18",
        "the answer is five",
    ],
)
def test_math_answers_that_do_not(answer):
    assert not math_answer_parses(answer)


def test_complete_code_problem_passes():
    assert code_issue(**HUMANEVAL_LIKE) is None


@pytest.mark.parametrize(
    "change, field",
    [
        ({"entry_point": None}, "entry_point"),
        ({"entry_point": "subtract"}, "entry_point"),
        ({"tests": ""}, "tests"),
        ({"tests": "def check(:\n"}, "tests"),
        ({"solution": "    return a +\n"}, "canonical_solution"),
    ],
)
def test_incomplete_code_problems_name_the_field(change, field):
    issue = code_issue(**{**HUMANEVAL_LIKE, **change})
    assert issue is not None and issue[0] == field


def test_problem_rules():
    base = {"prompt": "What is 1+1?", "answer": "2", "domain": "math", "level": 1, "source_kind": "gsm8k"}
    assert problem_issue(base, 1000, True) is None
    assert problem_issue({**base, "prompt": "x" * 2000}, 1000, True)[0] == "prompt"
    assert problem_issue({**base, "answer": None}, 1000, True) == ("answer", "missing answer")
    assert problem_issue({**base, "answer": r"\frac{"}, 1000, True)[0] == "answer"
    assert problem_issue({**base, "answer": r"\frac{"}, 1000, False) is None
    assert problem_issue({**base, "level": 7}, 1000, True)[0] == "level"
