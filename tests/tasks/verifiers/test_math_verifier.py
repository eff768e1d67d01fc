"""Math verification: extraction, every equivalence the issue names, and the anti-hacking policy."""

import json

import pytest

from tasks.verifiers.extract import extract_answer, final_answers
from tasks.verifiers.math import MathVerifier, gsm8k_reward

verifier = MathVerifier()


def score(gold: str, response: str) -> float:
    return verifier.verify({"answer": gold}, response).reward


@pytest.mark.parametrize(
    "response, expected",
    [
        (r"so the result is \boxed{42}.", ("42", "boxed")),
        (r"first \boxed{1} then \boxed{\frac{1}{2}}", (r"\frac{1}{2}", "boxed")),
        ("She makes 9 * 2 = 18 dollars.\n#### 18", ("18", "hash")),
        ("2*9 = 18\n18+80 = 98\n##### 98", ("98", "hash")),  # five hashes (INTUITOR's drift): still the answer line
        ("Adding up, the answer is 7.", ("7", "answer_is")),
        ("Final answer: 12", ("12", "answer_is")),
        ("no conclusion here", (None, None)),
    ],
)
def test_extraction(response, expected):
    assert extract_answer(response) == expected


def test_extractors_are_configurable():
    response = "#### 5\nThe answer is 6."
    assert extract_answer(response, ("answer_is",)) == ("6", "answer_is")
    assert (
        MathVerifier(extractors=("hash",)).verify({"answer": "5"}, "the answer is 5").details["reason"]
        == "no final answer"
    )


@pytest.mark.parametrize(
    "gold, response",
    [
        ("0.5", r"\boxed{\frac{1}{2}}"),
        ("1/2", r"\boxed{0.5}"),
        ("0.5", r"\boxed{50\%}"),
        ("50", r"\boxed{50\%}"),
        (r"\frac{\sqrt{2}}{2}", r"\boxed{\frac{1}{\sqrt{2}}}"),
        (r"3\sqrt{13}", r"\boxed{\sqrt{117}}"),
        ("1234", r"\boxed{1,234}"),
        ("1000000", "#### 1,000,000"),
        ("5", r"\boxed{5\text{ cm}}"),
        ("18", r"\boxed{\$18}"),
        ("18", "The answer is 18 dollars."),
        ("30", r"\boxed{30^\circ}"),
        ("30^\\circ", r"\boxed{30}"),
        ("(1,2)", r"\boxed{(1, 2)}"),
        (r"\{1,2\}", r"\boxed{\{2,1\}}"),
        ("[0,1)", r"\boxed{[0, 1)}"),
        (r"\left( 3, \frac{\pi}{2} \right)", r"\boxed{(3, \pi/2)}"),
        ("x^2+2x+1", r"\boxed{(x+1)^2}"),
        ("-3/4", r"\boxed{-\frac{3}{4}}"),
        ("x = 5", r"\boxed{5}"),
        ("1000", r"\boxed{1{,}000}"),
        ("a^2+b^2+c^2+d^2+e^2", r"\boxed{a^{2}+b^{2}+c^{2}+d^{2}+e^{2}}"),
        (r"x \geq 2", r"\boxed{x \ge 2}"),
    ],
)
def test_equivalent_forms_score_one(gold, response):
    assert score(gold, response) == 1.0


@pytest.mark.parametrize(
    "gold, response",
    [
        ("(1,2)", r"\boxed{(2,1)}"),  # ordered tuples keep their order
        ("[0,1)", r"\boxed{[0,1]}"),  # interval ends matter
        ("(0,1]", r"\boxed{(0,1)}"),
        (r"\pi", r"\boxed{3.14}"),
        ("0.5", r"\boxed{5}"),
        ("2", r"\boxed{2x}"),
        ("2", r"\boxed{2 \pi}"),
    ],
)
def test_different_answers_score_zero(gold, response):
    assert score(gold, response) == 0.0


def test_hedging_with_several_final_answers_scores_zero():
    result = verifier.verify({"answer": "2"}, r"It is \boxed{1}. Or maybe \boxed{2}.")
    assert result.reward == 0.0 and result.details["reason"].startswith("hedged")
    mixed = verifier.verify({"answer": "2"}, "So \\boxed{2}.\n#### 3")
    assert mixed.reward == 0.0


def test_restating_the_same_answer_is_not_hedging():
    assert score("0.5", r"\boxed{\frac{1}{2}}, that is \boxed{0.5}") == 1.0
    assert score(r"\frac{\sqrt{2}}{2}", r"\boxed{\frac{1}{\sqrt{2}}} = \boxed{\frac{\sqrt2}{2}}") == 1.0


def test_correct_value_only_in_the_reasoning_scores_zero():
    assert score("18", "We get 18 eggs... wait, recount: \\boxed{16}") == 0.0


@pytest.mark.parametrize(
    "response",
    [
        r"\boxed{1, 2, 3, 4}",
        r"\boxed{2 \text{ or } 3}",
        r"\boxed{2 or 3}",
        r"\boxed{\{1,2,3\}}",
        r"\boxed{2; 3}",
        "The answer is 2 (or possibly 3).",
        "#### 3 (or 2)",
        r"\boxed{5 \\ 4 \\ 3 \\ 2}",
    ],
)
def test_listing_every_candidate_scores_zero(response):
    result = verifier.verify({"answer": "2"}, response)
    assert result.reward == 0.0 and result.details["reason"] == "lists several candidates for a single-valued answer"


def test_a_box_inside_a_box_scores_zero():
    result = verifier.verify({"answer": "2"}, r"\boxed{3 \text{ or } \boxed{2}}")
    assert result.reward == 0.0 and result.details["reason"] == "a box inside a box"


@pytest.mark.parametrize(
    "response",
    [
        r"\boxed{\text{not } 2}",
        r"\boxed{\text{at least } 2}",
        r"\boxed{2 \text{ million}}",
        "#### 2 dozen",
        r"\boxed{2 \text{ squared}}",
        r"\boxed{2 \text{ is wrong}}",
    ],
)
def test_words_that_change_the_value_score_zero(response):
    result = verifier.verify({"answer": "2"}, response)
    assert result.reward == 0.0 and result.details["reason"].startswith("words that change the value")


@pytest.mark.parametrize("response", [r"\boxed{\neq 2}", r"\boxed{> 2}", r"\boxed{\approx 2}", r"\boxed{3 = 2}"])
def test_relations_where_a_value_is_asked_score_zero(response):
    result = verifier.verify({"answer": "2"}, response)
    assert result.reward == 0.0 and result.details["reason"] == "a relation where a value is asked"


def test_a_percentage_reads_by_the_question():
    assert verifier.verify({"answer": "0.02", "prompt": "What fraction is left?"}, r"\boxed{2\%}").reward == 1.0
    assert verifier.verify({"answer": "2", "prompt": "What fraction is left?"}, r"\boxed{2\%}").reward == 0.0
    assert verifier.verify({"answer": "50", "prompt": "What percent is left?"}, r"\boxed{50\%}").reward == 1.0
    assert verifier.verify({"answer": "1/2"}, "The answer is 50 percent.").reward == 1.0


def test_pathological_inputs_are_refused_without_evaluating_them():
    # unclosed boxes (quadratic once), a billion-digit exponent, a number past int-to-str limits
    for response in ["\\boxed{" * 4000, r"\boxed{1e999999999}", r"\boxed{1e5000}"]:
        assert verifier.verify({"answer": "1"}, response).reward == 0.0


@pytest.mark.parametrize(
    "response",
    [
        r"\boxed{2^{2^{2^{2^{2^{2}}}}}}",
        r"\boxed{9^{9^{9^{9}}}}",
        r"\boxed{" + "9" * 5000 + "}",
        r"\boxed{" + "9" * 300 + "^{2}}",
        r"\boxed{100000!}",
        r"\boxed{" + "(" * 40 + "1" + ")" * 40 + "}",
    ],
)
def test_costly_expressions_are_bounded(response):
    result = verifier.verify({"answer": "3"}, response)
    assert result.reward == 0.0 and result.details["method"] == "text (costly expression)"


def test_costly_expression_equal_as_text_still_scores():
    assert score("10^{10^{10}}", r"\boxed{10^{10^{10}}}") == 1.0


def test_no_gold_is_undecidable():
    assert verifier.verify({"answer": None}, r"\boxed{1}").correct is None


def test_gsm8k_reward_on_constructed_answers():
    completions = ["#### 0.5", "#### 1/2", r"\boxed{50\%}", "The answer is 7.", "#### 8"]
    assert gsm8k_reward(completions, ["1/2", "0.5", "0.5", "7", "7"]) == [1.0, 1.0, 1.0, 1.0, 0.0]


def test_gsm8k_reward_on_ten_real_problems(shared_datasets):
    rows = [json.loads(line) for line in (shared_datasets / "gsm8k" / "test.jsonl").open()][:10]
    golds = [row["answer"].split("####")[1].strip() for row in rows]
    right = [row["answer"] for row in rows]  # the reference solution itself
    reformatted = [
        f"Putting it together, the answer is {int(g.replace(',', '')):,}.00"
        if g.replace(",", "").isdigit()
        else f"the answer is {g}"
        for g in golds
    ]
    wrong = [f"#### {int(g.replace(',', '')) + 1}" for g in golds]
    hedged = [f"\\boxed{{{int(g.replace(',', '')) + 1}}} or \\boxed{{{g}}}" for g in golds]  # the right one last
    assert gsm8k_reward(right, golds) == [1.0] * 10
    assert gsm8k_reward(reformatted, golds) == [1.0] * 10
    assert gsm8k_reward(wrong, golds) == [0.0] * 10
    assert gsm8k_reward(hedged, golds) == [0.0] * 10


def test_final_answers_lists_every_statement():
    assert final_answers("\\boxed{1}\n#### 2\nthe answer is 3") == [("boxed", "1"), ("hash", "2"), ("answer_is", "3")]


# ---- read as broadly as Math-Verify, judged stricter (issue 13) ------------------------------------------------
@pytest.mark.parametrize(
    "response, expected",
    [
        ("Final Answer: The final answer is 7.78. I hope it is correct.", ("7.78", "answer_is")),
        (
            "Final Answer: The final answer is $\\frac{10}{27}$. I hope it is correct. <|im_start|>user",
            (r"\frac{10}{27}", "answer_is"),
        ),
        ("Final Answer: The volume of $ABCDEFGH$ is 120. I hope it is correct.", ("120", "answer_is")),
        ("Final Answer: Jane started growing it 3 hours ago.", ("3", "answer_is")),
        ("**Answer:** 8", ("8", "answer_is")),
        ("Answer \\[ 9 \\]", ("9", "answer_is")),
        ("so the area is $\\frac{3}{4}$", (r"\frac{3}{4}", "math")),
        ("We conclude \\[ x = 12 \\]", ("x = 12", "math")),
        ("There are 12 distinct sequences. I hope it is correct. <|im_start|>user", ("12", "number")),
        (r"\frac{10}{9}", (r"\frac{10}{9}", "math")),
    ],
)
def test_extraction_reads_the_forms_math_verify_reads(response, expected):
    assert extract_answer(response, ("boxed", "hash", "answer_is", "math", "number")) == expected


def test_every_extractor_is_named_in_the_details():
    assert verifier.verify({"answer": "120"}, "Final Answer: The volume is 120.").details["extractor"] == "answer_is"
    assert verifier.verify({"answer": "3/4"}, "so it is $\\frac34$").details["extractor"] == "math"


@pytest.mark.parametrize(
    "gold, response",
    [
        ("(2,1),(1,2),(-1,-20),(-20,-1)", r"\boxed{(1, 2)}, \boxed{(2, 1)}, \boxed{(-1, -20)}, \boxed{(-20, -1)}"),
        (r"\{1,2,3\}", r"\boxed{1},\boxed{2},\boxed{3}"),
        (r"\{1,2,3\}", r"\boxed{1} and \boxed{2} and \boxed{3}"),
        ("k = 45, n = 2", r"\boxed{k = 45} \quad \text{and} \quad \boxed{n = 2}"),
        ("x=1 or x=2", r"\boxed{x = 2} and \boxed{x = 1}"),
    ],
)
def test_boxes_whose_union_is_a_multi_part_gold_are_one_answer(gold, response):
    assert score(gold, response) == 1.0


def test_a_multi_part_gold_still_needs_every_part():
    assert score(r"\{1,2,3\}", r"\boxed{1},\boxed{2}") == 0.0
    assert score(r"\{1,2,3\}", r"\boxed{1},\boxed{2},\boxed{3},\boxed{4}") == 0.0


def test_a_self_correction_counts_its_last_answer():
    assert score("6", "#### 8\nHmm, wait, I made an arithmetic slip: 3 * 2 = 6.\n#### 6") == 1.0
    assert score("6", "The answer is \\boxed{8}. Actually, recounting gives \\boxed{6}.") == 1.0
    assert score("8", "#### 8\nWait, recount: 3 * 2 = 6.\n#### 6") == 0.0  # the corrected answer is wrong
    assert score("6", r"\boxed{8} or \boxed{6}") == 0.0  # alternatives are hedging
    assert score("6", "It is \\boxed{8}, or wait, maybe \\boxed{6}.") == 0.0  # a correction offering an "or"
    assert score("6", r"So \boxed{8}. Then \boxed{6}.") == 0.0  # no correction: hedging


def test_a_closing_final_answer_supersedes_boxed_intermediate_results():
    response = (
        "First $0.04 \\cdot 10000 / 2 = \\boxed{200}$, then $0.05 \\cdot 10200 / 2 = \\boxed{255}$, so "
        "$10,200 + 255 = 10,455$. Final Answer: The final answer is $10,455$. I hope it is correct."
    )
    assert score("10455", response) == 1.0


@pytest.mark.parametrize("gold", [r"\text{(B)}", r"\text{odd}", r"\mathrm{(E)}", "Evelyn", r"\text{east}"])
def test_a_word_never_matches_another_word(gold):
    assert score(gold, r"\boxed{\text{x}}") == 0.0
    assert score(gold, r"\boxed{\text{}}") == 0.0


@pytest.mark.parametrize(
    "gold, response",
    [
        (r"\text{(B)}", r"\boxed{B}"),
        (r"\text{(B)}", r"\boxed{\textbf{B}}"),
        ("(B)", r"\boxed{B)}"),
        (r"\mathrm{(E)}", r"\boxed{(E)}"),
        (r"\text{odd}", r"$odd$"),
        (r"\text{Even}", r"\boxed{even}"),
        (r"\text{The midpoints form a regular hexagon}", r"\boxed{\text{The midpoints form a regular hexagon}}"),
    ],
)
def test_text_answers_compare_as_text(gold, response):
    assert score(gold, response) == 1.0


def test_a_gold_is_never_read_differently_than_written():
    assert score(r"\boxed{1} no no no \boxed{2}", r"\boxed{1,2}") == 0.0  # the gold is its last box
    assert score(r"\boxed{1} and \boxed{2}", r"\boxed{1,2}") == 1.0  # joined boxes are both parts


@pytest.mark.parametrize(
    "gold, response",
    [
        (r"\frac{1}{3}", r"\boxed{0.\overline{3}}"),
        (r"\frac{1}{6}", r"\boxed{0.1\overline{6}}"),
        (r"\frac{1}{2}", r"\boxed{\left.\frac12\right.}"),
        ("(1, 2)", r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}"),
        (r"\frac{1}{12}", r"\boxed{0.0833333333333333}"),
        ("1.22", r"\boxed{1,22}"),
        ("1000", r"\boxed{1 000}"),
        ("12000023", r"\boxed{12,\!000,\!023}"),
        (r"1\frac{4}{5}", r"\boxed{\frac{9}{5}}"),
        ("x = 11", r"\boxed{x = 5 + 5 + 1 = 11}"),
    ],
)
def test_forms_math_verify_recognises(gold, response):
    assert score(gold, response) == 1.0


@pytest.mark.parametrize(
    "gold, response",
    [
        (r"\frac{1}{12}", r"\boxed{0.08}"),  # a decimal must agree to `precision` places (6)
        ("1,234", r"\boxed{1.234}"),  # a thousands grouping is not a decimal comma
        ("x = 11", r"\boxed{x = 5 + 5 + 1 = 7 = 11}"),  # an equality chain whose sides differ
        (r"1 - \frac{1}{\mathrm{e}}", r"\boxed{1 + \frac{1}{\mathrm{e}}}"),
    ],
)
def test_near_misses_score_zero(gold, response):
    assert score(gold, response) == 0.0


def test_precision_and_decimal_commas_are_configurable():
    assert MathVerifier(precision=4).verify({"answer": r"\frac{1}{3}"}, r"\boxed{0.3333}").reward == 1.0
    assert MathVerifier().verify({"answer": r"\frac{1}{3}"}, r"\boxed{0.3333}").reward == 0.0
    assert MathVerifier(decimal_comma=False).verify({"answer": "1.22"}, r"\boxed{1,22}").reward == 0.0


def test_symbolic_answers_take_the_fast_path():
    for gold, response in [
        (r"3\sqrt{13}", r"\boxed{\sqrt{117}}"),
        ("x^2+2x+1", r"\boxed{(x+1)^2}"),
        (r"\frac{\sqrt{2}}{2}", r"\boxed{\frac{1}{\sqrt{2}}}"),
    ]:
        verdict = verifier.verify({"answer": gold}, response)
        assert verdict.reward == 1.0 and verdict.details["method"] == "symbolic"


@pytest.mark.parametrize(
    "gold, answer", [("181", "11#### 181"), ("992", "2*9 @u#### 992"), ("58", "58\ufffd"), ("61", "6\ufffd1")]
)
def test_a_junk_answer_holding_the_gold_among_other_numbers_scores_nothing(gold, answer):
    """Found in a drill's rollouts: math-verify reads a number out of text with stray marks (`11#### 181` →
    181, a hedge between 11 and 181). Such an answer never reaches it."""
    equal, how = MathVerifier().equivalent(gold, answer)
    assert not equal and how == "text (stray characters)"
    assert score(gold, f"#### {answer}") == 0.0
