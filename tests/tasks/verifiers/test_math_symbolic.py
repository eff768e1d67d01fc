"""The symbolic fast path (tasks/verifiers/symbolic.py) decides as math-verify decides, wherever it decides.

Checked on built-in pairs always, and — when ../shared is present — on every (gold, extracted answer)
pair of Math-Verify's conformance suite and of the benchmark's symbolic mix (MATH-500's non-numeric
golds in equivalent and wrong forms). The only differences are documented ones where math-verify errs.
"""

import json
import re

import pytest
from conftest import ROOT

from tasks.verifiers import symbolic
from tasks.verifiers.extract import EXTRACTORS, extract_answer, gold_answer

CASES = ROOT.parent / "shared" / "conformance" / "math-verify" / "cases.jsonl"
BUILT_IN = [
    (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}"),
    (r"3\sqrt{13}", r"\sqrt{117}"),
    ("x^2+2x+1", "(x+1)^2"),
    (r"\frac{x+2}{7}", r"\frac{x}{7}+\frac{2}{7}"),
    (r"\tan^2(y)+1", r"\sec^2(y)"),
    (r"2\pi", r"\pi"),
    (r"\frac12", "0.5"),
    (r"\frac{1}{12}", "0.0833333333333333"),
    (r"\frac{1}{12}", "0.08"),
    (r"\sqrt[3]{8}", "2"),
    (r"\log_2 8", "3"),
    (r"10^{\frac{-5+\sqrt{13}}{6}}", r"10^{\frac{\sqrt{13} - 5}{6}}"),
    (r"2\cdot\frac{7}{2}", "7"),
    (r"\frac{\sqrt{\sqrt{11}+\sqrt{194}}}{15+2\sqrt{33}}", r"\frac{\sqrt{\sqrt{11}+\sqrt{194}}}{2\sqrt{33}+15}"),
    ("a^2+b^2", "b^2+a^2"),
    (r"\dfrac{\sqrt{3}}{4}", r"\frac{\sqrt3}{4}"),
    ("x_1+x_2", "x_2+x_1"),
    ("5!", "120"),
    (r"1\frac{4}{5}", r"\frac{9}{5}"),
    (r"1\frac{4}{5}", r"\frac{4}{5}"),
    ("i^2", "-1"),
    ("-2+7i", "7i-2"),
    (r"\frac{x^2-1}{x-1}", "x+1"),
    (r"\sin^2 x + \cos^2 x", "1"),
    (r"\pi r^2", r"r^2 \pi"),
    (r"e^{i\pi}", "-1"),
    (r"\sqrt{2}+\sqrt{3}", r"\sqrt{5}"),
    (r"\frac{3}{4}", r"\frac{4}{3}"),
    ("2x", "x+2"),
    (r"\ln(e^2)", "2"),
]
# Where math-verify is wrong, and the fast path is not (each checked by hand).
MATH_VERIFY_ERRS = [
    (
        re.compile(r"(?<![a-zA-Z\\])i(?![a-zA-Z])"),
        "math-verify reads i as the imaginary unit only in a complex literal "
        "written without spaces (7i, not 7 i, i^2 or e^{i\\pi}); a final answer's i is the imaginary unit",
    ),
    (re.compile(r"^\d{1,3}( \d{3})+$"), "math-verify's LaTeX reading of `1 000` is 1·000 = 0"),
    (
        re.compile(r"\\frac\{1\}\{\\mathrm\{e\}\}"),
        "math-verify parses \\frac{1}{\\mathrm{e}} as nothing (1 ± 1/e both read 1)",
    ),
]


def math_verify(gold: str, answer: str) -> bool:
    from math_verify import parse, verify

    return bool(verify(parse(f"${gold}$"), parse(f"${answer}$")))


def disagreements(pairs) -> list[tuple[str, str, bool]]:
    found = []
    for gold, answer in sorted(set(pairs)):
        ours = symbolic.compare(gold, answer)
        if ours is None or ours == math_verify(gold, answer):
            continue
        if not any(pattern.search(gold) or pattern.search(answer) for pattern, _ in MATH_VERIFY_ERRS):
            found.append((gold, answer, ours))
    return found


def test_the_fast_path_decides_the_built_in_pairs_as_math_verify():
    assert all(symbolic.compare(gold, answer) is not None for gold, answer in BUILT_IN)
    assert disagreements(BUILT_IN) == []


@pytest.mark.skipif(not CASES.exists(), reason="../shared is absent")
def test_the_fast_path_agrees_with_math_verify_on_the_conformance_suite_and_the_symbolic_mix():
    from bench.verify_throughput import symbolic_items

    pairs = []
    for line in CASES.read_text().splitlines():
        case = json.loads(line)
        answer, _ = extract_answer(case["prediction"], EXTRACTORS)
        if answer:
            pairs.append((gold_answer(case["gold"]), answer))
    for gold, response, _ in symbolic_items(200):
        pairs.append((gold, extract_answer(response, EXTRACTORS)[0]))
    decided = [pair for pair in set(pairs) if symbolic.compare(*pair) is not None]
    assert len(decided) >= 250  # the fast path carries most symbolic pairs
    assert disagreements(pairs) == []


def test_outside_the_subset_the_fast_path_abstains():
    for answer in [
        r"x \leq 2",
        r"\{1, 2\}",
        r"1 \pm \sqrt{2}",
        r"\text{east}",
        r"\begin{pmatrix}1\\2\end{pmatrix}",
        "f'(x)",
        r"\int_0^1 x\,dx",
    ]:
        assert symbolic.parse(answer) is None, answer
