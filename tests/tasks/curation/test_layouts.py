"""Source layouts: from a raw row to problem fields, or a rejection naming the field."""

import pytest

from tasks.curation import layouts
from tasks.curation.layouts import Rejected
from tasks.verifiers.extract import last_boxed


def test_gsm8k_keeps_calculator_steps_and_final_answer():
    row = {
        "question": "Natalia sold clips to 48 friends...",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether 48+24 = <<48+24=72>>72.\n#### 1,072",
    }
    fields = layouts.gsm8k(row)
    assert fields["answer"] == "1072"
    assert fields["steps"] == ["48/2=24", "48+24=72"]
    assert fields["solution"].endswith("<<48+24=72>>72.")


def test_gsm8k_without_final_line_is_rejected_on_answer():
    with pytest.raises(Rejected) as rejected:
        layouts.gsm8k({"question": "q", "answer": "no final line"})
    assert rejected.value.field == "answer"


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"\boxed{1} then \boxed{\left(3, \frac{\pi}{2}\right)}", r"\left(3, \frac{\pi}{2}\right)"),
        (r"\fbox{42}", "42"),
        ("no box", None),
        (r"\boxed{unbalanced", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_math_prompt_or_problem_answer_or_boxed_solution():
    harness = "Find x.\nPlease reason step by step, and put your final answer within \\boxed{}."
    assert layouts.math({"prompt": harness, "answer": 70})["prompt"] == "Find x."
    assert layouts.math({"prompt": "p", "answer": 70})["answer"] == "70"
    assert layouts.math({"problem": "p", "answer": 27.0})["answer"] == "27"
    minerva = layouts.math({"problem": "p", "solution": r"so s = \boxed{1.6} cm", "type": "astro"})
    assert minerva["answer"] == "1.6" and minerva["metadata"] == {"type": "astro"}
    with pytest.raises(Rejected, match="no answer"):
        layouts.math({"problem": "p", "solution": "nothing boxed"})
    with pytest.raises(Rejected) as rejected:
        layouts.math({"answer": "3"})
    assert rejected.value.field == "problem"


def test_olympiad_joins_answers_and_strips_dollars():
    fields = layouts.olympiad(
        {
            "question": "Q",
            "final_answer": ["$\\frac{1}{2}$", "$3$"],
            "solution": ["S1", "S2"],
            "context": None,
            "unit": None,
        }
    )
    assert fields["answer"] == "\\frac{1}{2}, 3"
    assert fields["solution"] == "S1"
    with pytest.raises(Rejected) as rejected:
        layouts.olympiad({"question": "Q", "final_answer": []})
    assert rejected.value.field == "final_answer"


def test_humaneval_fields():
    fields = layouts.humaneval(
        {
            "task_id": "HumanEval/0",
            "prompt": "def f():\n",
            "canonical_solution": "    return 1\n",
            "test": "def check(candidate):\n    assert candidate() == 1\n",
            "entry_point": "f",
        }
    )
    assert fields["entry_point"] == "f" and fields["solution"] == "    return 1\n"
    assert fields["metadata"] == {"task_id": "HumanEval/0"}
    with pytest.raises(Rejected) as rejected:
        layouts.humaneval({"prompt": "def f():\n", "entry_point": "f"})
    assert rejected.value.field == "test"


def test_mapped_layout_renames_columns():
    fields = layouts.mapped({"q": "What?", "gold": 5, "extra": 1}, {"prompt": "q", "answer": "gold"})
    assert fields["prompt"] == "What?" and fields["answer"] == "5" and fields["metadata"] == {"extra": 1}
